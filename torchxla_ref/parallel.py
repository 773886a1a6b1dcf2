"""The only device-aware module of the torch side: PJRT runtime set-up and the strategies
that put batches on the devices (the SPMD mesh, the per-replica view of `xmp.spawn`, the
host CPU).

- `spmd`: one process, `xr.use_spmd()`, a `('data', 'fsdp')` mesh over all devices, each input
  tensor sharded on `data` with `xs.mark_sharding`: torch_xla's counterpart of jit+NamedSharding.
- `spawn`: one replica per device (`xmp.spawn`), each taking its slice of every global batch
  from `jaxtpu.core.data.taskdata`, gradients all-reduced by `xm.reduce_gradients` (the first
  half of `xm.optimizer_step`).
- `eager`: plain PyTorch on one device (the first CUDA GPU, else the host CPU).
- `ddp`: plain PyTorch, one process per device (`torch.multiprocessing.spawn`), each taking its
  slice as `spawn` does, the model wrapped in `DistributedDataParallel` (gradients all-reduced
  during the backward pass): NCCL over CUDA GPUs, gloo over CPU processes.

Each strategy owns its collectives: `wrap` (the model the step runs), `reduce_gradients` (None
where the backward pass reduces them, or one replica) and `mean` (a replica's loss averaged).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from jaxtpu.core.errors import DeviceError
from jaxtpu.core.hardware import has_tpu

# On CPU, torch_xla 2.9 runs the spawn path as one *thread* per device in one process; its
# collectives then deadlock or mismatch (see torchxla_ref/SPAWN_ON_CPU.md). Refuse those counts.
MAX_SPAWN_DEVICES_ON_CPU = 1


def configure_runtime(num_devices: int, parallel: str) -> str:
    """Sets PJRT_DEVICE (and CPU_NUM_DEVICES on CPU) before torch_xla starts its runtime.

    Returns:
      The PJRT device type: 'TPU', 'CPU', ... (an explicit PJRT_DEVICE is respected).
    """
    device = os.environ.setdefault("PJRT_DEVICE", "TPU" if has_tpu() else "CPU")
    if device == "CPU":
        limit = int(os.environ.get("TORCHXLA_REF_MAX_CPU_SPAWN", MAX_SPAWN_DEVICES_ON_CPU))
        if parallel == "spawn" and num_devices > limit:
            raise DeviceError(
                f"--parallel spawn --num-devices {num_devices}: on CPU torch_xla 2.9 runs "
                "spawn replicas as threads whose collectives deadlock with more than "
                f"{MAX_SPAWN_DEVICES_ON_CPU} device (see torchxla_ref/SPAWN_ON_CPU.md); "
                "use --parallel spmd for 8 CPU devices, or spawn on a TPU"
            )
        os.environ["CPU_NUM_DEVICES"] = str(num_devices)
    return device


class _OneProcess:
    """The collectives of a strategy whose one process sees the whole batch (`spawn`
    overrides the two a replica needs)."""

    reduce_gradients = None

    def wrap(self, model: Any) -> Any:
        return model

    def mean(self, loss: Any) -> Any:
        return loss


class SpmdStrategy(_OneProcess):
    """Puts numpy batches on the SPMD device, sharded on the mesh's `data` axis."""

    def __init__(self, num_devices: int) -> None:
        import torch_xla
        import torch_xla.distributed.spmd as xs
        import torch_xla.runtime as xr

        xr.use_spmd()
        n = xr.global_runtime_device_count()
        if n != num_devices:
            raise DeviceError(
                f"--num-devices {num_devices}: SPMD runs on all {n} devices of this host; "
                f"use --num-devices {n}"
            )
        self.xs = xs
        self.num_devices = n
        self.replicas = 1
        self.ordinal = 0
        self.device = torch_xla.device()
        self.mesh = xs.Mesh(np.arange(n), (n, 1), ("data", "fsdp"))

    def put(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        import torch

        out = {}
        for k, v in batch.items():
            t = torch.from_numpy(np.ascontiguousarray(v)).to(self.device)
            self.xs.mark_sharding(t, self.mesh, ("data",) + (None,) * (v.ndim - 1))
            out[k] = t
        return out

    def gather(self, t: Any) -> np.ndarray:
        return t.cpu().numpy()


class SpawnStrategy(_OneProcess):
    """One replica of the spawn path: its own device and its slice of each global batch."""

    def __init__(self) -> None:
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr

        self.xm = xm
        self.device = torch_xla.device()
        self.replicas = xr.world_size()
        self.ordinal = xr.global_ordinal()
        self.num_devices = self.replicas

    def put(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        import torch

        out = {}
        for k, v in batch.items():
            b = v.shape[0] // self.replicas
            part = v[self.ordinal * b : (self.ordinal + 1) * b]
            out[k] = torch.from_numpy(np.ascontiguousarray(part)).to(self.device)
        return out

    def gather(self, t: Any) -> np.ndarray:
        """All replicas' slices of a per-example tensor, in global batch order."""
        if self.replicas > 1:
            t = self.xm.all_gather(t, dim=0)
        return t.cpu().numpy()

    @property
    def reduce_gradients(self) -> Any:  # type: ignore[override]
        return self.xm.reduce_gradients if self.replicas > 1 else None

    def mean(self, loss: Any) -> Any:
        """Each replica's loss is of its slice: their average."""
        if self.replicas == 1:
            return loss
        return self.xm.all_reduce(self.xm.REDUCE_SUM, loss, scale=1.0 / self.replicas)


class EagerStrategy(_OneProcess):
    """`--parallel eager`: plain PyTorch, no XLA (the reference baseline): on the first CUDA
    GPU when torch sees one (torch_xla's GPU path is gone), else on the host CPU."""

    def __init__(self) -> None:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
        self.device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        self.replicas, self.ordinal, self.num_devices = 1, 0, 1

    @property
    def compute_capability(self) -> str | None:
        """The GPU's compute capability ('7.5'), None on the CPU."""
        import torch

        if self.device.type != "cuda":
            return None
        return ".".join(map(str, torch.cuda.get_device_capability(self.device)))

    def put(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        import torch

        return {
            k: torch.from_numpy(np.ascontiguousarray(v)).to(self.device) for k, v in batch.items()
        }

    def gather(self, t: Any) -> np.ndarray:
        return t.detach().cpu().numpy()


class DdpStrategy:
    """One process of `--parallel ddp`: its device (`cuda:RANK`, or the host CPU), its slice of
    each global batch, and `DistributedDataParallel` around the model. The process group is
    started by `start_ddp` before this."""

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        self.dist = dist
        self.replicas, self.ordinal = dist.get_world_size(), dist.get_rank()
        self.num_devices = self.replicas
        if torch.cuda.is_available():
            self.device = torch.device(f"cuda:{self.ordinal}")
            torch.cuda.set_device(self.device)
        else:  # the host's cores shared by the processes
            self.device = torch.device("cpu")
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.replicas))

    compute_capability = EagerStrategy.compute_capability
    put = SpawnStrategy.put

    def gather(self, t: Any) -> np.ndarray:
        """All processes' slices of a per-example tensor, in global batch order."""
        import torch

        t = t.detach().contiguous()
        if self.replicas > 1:
            parts = [torch.empty_like(t) for _ in range(self.replicas)]
            self.dist.all_gather(parts, t)
            t = torch.cat(parts)
        return t.cpu().numpy()

    def wrap(self, model: Any) -> Any:
        """The model the train step runs: gradients all-reduced (averaged) in its backward."""
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        # static: the same parameters take part in every step, so a pooler the run's pooling
        # leaves unused is known after the first step, not searched for at every one
        return DistributedDataParallel(model, device_ids=ids, static_graph=True)

    reduce_gradients = None  # DistributedDataParallel reduces them in the backward pass

    def mean(self, loss: Any) -> Any:
        """Each process's loss is of its slice: their average."""
        if self.replicas == 1:
            return loss
        loss = loss.detach().clone()
        self.dist.all_reduce(loss)
        return loss / self.replicas


def ddp_devices(num_devices: int) -> str:
    """The devices `--parallel ddp --num-devices N` runs on ('cuda' or 'cpu'), checked before
    any process starts."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    found = torch.cuda.device_count()
    if num_devices > found:
        raise DeviceError(
            f"--parallel ddp --num-devices {num_devices}: this host has {found} CUDA GPU"
            f"{'s' if found != 1 else ''}; use --num-devices {found} or fewer"
        )
    return "cuda"


def start_ddp(rank: int, world: int, rendezvous: str) -> None:
    """Joins this process to the run's process group (NCCL on CUDA GPUs, gloo on CPUs), met
    through the file `rendezvous`."""
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "nccl" if torch.cuda.is_available() else "gloo",
        init_method=f"file://{rendezvous}",
        rank=rank,
        world_size=world,
    )


STRATEGIES = {
    "spmd": SpmdStrategy,
    "spawn": SpawnStrategy,
    "eager": EagerStrategy,
    "ddp": DdpStrategy,
}
# the strategies that run plain PyTorch (no torch_xla)
PLAIN_TORCH = ("eager", "ddp")


def make_strategy(name: str, num_devices: int) -> Any:
    """The strategy `--parallel name`, started on this process (or spawn or ddp replica)."""
    if name == "spmd":
        return SpmdStrategy(num_devices)
    return STRATEGIES[name]()
