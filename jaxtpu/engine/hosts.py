"""This host's part of a run: the devices JAX gives it, the processes of a multi-host run and
their host-level collectives, and the persistent compilation cache.

Must run before anything starts JAX's backend (`init_devices` asks for virtual CPU devices on
a machine without accelerators). The strategies (`jaxtpu.engine.parallel`) place and run on what
this module hands them.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import jax
import numpy as np

from jaxtpu.core.errors import DeviceError
from jaxtpu.core.files import cache_root
from jaxtpu.core.hardware import MATMUL_PRECISION_ENV, matmul_precision

log = logging.getLogger(__name__)


def init_distributed(coordinator: str, num_processes: int, process_id: int) -> None:
    """Joins a multi-process JAX run (`jax.distributed.initialize`, what TPU pods use).

    Must run before anything touches the devices. `coordinator` is process 0's HOST:PORT, or
    'auto' for JAX's cluster detection (TPU pod, SLURM); empty means one process, no set-up.
    On CPU the processes talk through gloo collectives.
    """
    if not coordinator:
        return
    if jax.distributed.is_initialized():
        return
    kwargs: dict[str, Any] = {}
    if coordinator != "auto":
        kwargs = dict(
            coordinator_address=coordinator, num_processes=num_processes, process_id=process_id
        )
    try:
        jax.distributed.initialize(**kwargs, initialization_timeout=120)
    except (RuntimeError, ValueError) as e:
        raise DeviceError(
            f"--coordinator-address {coordinator}: could not join the multi-process run as "
            f"process {process_id} of {num_processes} ({str(e).splitlines()[0]})"
        ) from None
    log.info(
        "multi-process: process %d of %d, %d local of %d devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )


def init_devices(num_devices: int) -> list[jax.Device]:
    """The first `num_devices` devices of the default backend on each process.

    On a machine without accelerators this asks JAX for `num_devices` virtual CPU devices,
    which must happen before the backend starts; on TPU/GPU the setting is ignored and the
    first `num_devices` real devices are used. With several processes the result is the
    global device list, each process's devices contiguous and in process order, so process
    p's rows of a global batch are one contiguous block.
    """
    set_cpu_device_count(num_devices)
    local = sorted(jax.local_devices(), key=lambda d: d.id)
    full_fp32_matmuls(local[0].platform)
    if num_devices > len(local):
        raise DeviceError(
            f"--num-devices {num_devices}: only {len(local)} {local[0].platform} device(s) "
            f"available{' per process' if jax.process_count() > 1 else ''}; use "
            f"--num-devices {len(local)} or fewer"
        )
    if jax.process_count() == 1:
        return local[:num_devices]
    by_process: dict[int, list[jax.Device]] = {}
    for d in sorted(jax.devices(), key=lambda d: (d.process_index, d.id)):
        by_process.setdefault(d.process_index, []).append(d)
    return [d for p in sorted(by_process) for d in by_process[p][:num_devices]]


def scoring_devices(num_devices: int) -> list[jax.Device]:
    """The devices a scoring command scores on: `init_devices(num_devices)`, or for 0 every
    local device JAX starts with (an accelerator's; on a CPU one device, unless the user or
    the process asked for virtual ones). Scoring copies the weights to every device, which
    on a CPU buys nothing: one XLA:CPU device already spreads each op over the cores
    (`benchmarks.serving.scoring`: faster on one device than on eight virtual ones, with half the
    memory)."""
    if num_devices:
        return init_devices(num_devices)
    local = sorted(jax.local_devices(), key=lambda d: d.id)
    full_fp32_matmuls(local[0].platform)
    return local


def full_fp32_matmuls(platform: str) -> None:
    """fp32 matmuls in fp32 on a GPU, not JAX's default TF32, as torch computes them
    (`jaxtpu.core.hardware.matmul_precision`, where the measurement is)."""
    precision = matmul_precision(platform, dict(os.environ))
    if precision and jax.config.jax_default_matmul_precision != precision:
        jax.config.update("jax_default_matmul_precision", precision)
        log.info(
            "fp32 matmuls on the %s in full fp32 (%s=tensorfloat32 for TF32)",
            platform,
            MATMUL_PRECISION_ENV,
        )


def set_cpu_device_count(num_devices: int) -> None:
    """Asks for `num_devices` virtual CPU devices, unless the user fixed a count already."""
    user_fixed = "JAX_NUM_CPU_DEVICES" in os.environ or (
        "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
    )
    if not user_fixed:  # a count the user set for this machine is respected
        try:
            jax.config.update("jax_num_cpu_devices", max(num_devices, 1))
        except RuntimeError:
            pass  # backend already started (e.g. a second run in one process): use what it has


def use_compilation_cache() -> str | None:
    """Turns on JAX's persistent compilation cache in <cache root>/xla, so that a run whose
    programs an earlier run compiled (same model, shapes, flags, devices and jax version: the
    cache key) loads them instead of compiling again. A directory the user chose
    (JAX_COMPILATION_CACHE_DIR) is kept; JAXTPU_COMPILE_CACHE=0 turns it off. Returns the
    directory in use, or None."""
    if not jax.config.jax_compilation_cache_dir and os.environ.get("JAXTPU_COMPILE_CACHE") != "0":
        jax.config.update("jax_compilation_cache_dir", str(cache_root() / "xla"))
    return jax.config.jax_compilation_cache_dir or None


def compilation_cache_empty() -> bool:
    """Whether JAX's persistent compilation cache (a local directory) has no entry yet: on a
    fresh machine every program is compiled (a resumed run says so)."""
    directory = jax.config.jax_compilation_cache_dir
    if not directory or "://" in directory:
        return False
    return not os.path.isdir(directory) or not any(os.scandir(directory))


class Processes:
    """This process's place in a (possibly multi-process) run, and the few host-level
    collectives the loop needs. With one process every method is the identity."""

    def __init__(self) -> None:
        self.count = jax.process_count()
        self.index = jax.process_index()
        self.primary = self.index == 0

    def rows(self, n: int) -> slice:
        """This process's contiguous block of a global batch of `n` rows."""
        if n % self.count:
            raise ValueError(f"global batch {n} does not split over {self.count} processes")
        per = n // self.count
        return slice(self.index * per, (self.index + 1) * per)

    def whole(self, x: jax.Array) -> np.ndarray:
        """The whole value of a (possibly sharded) global array, on the host of every
        process."""
        if self.count == 1 or x.is_fully_replicated:
            return np.asarray(jax.device_get(x))
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    def gather(self, local: np.ndarray) -> np.ndarray:
        """Concatenates every process's block along axis 0, in process order."""
        if self.count == 1:
            return local
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(local, tiled=True))

    @property
    def preemption_service(self) -> bool:
        """Whether JAX's preemption service runs (a multi-process run with the service on):
        its notifier catches SIGTERM and `preemption_point` agrees on a step."""
        return (
            self.count > 1
            and jax.distributed.is_initialized()
            and bool(jax.config.jax_enable_preemption_service)
        )

    def preemption_point(self, index: int) -> bool:
        """`multihost_utils.reached_preemption_sync_point(index)`: true on every process at
        the same index once any got SIGTERM; False without the service."""
        if not self.preemption_service:
            return False
        from jax.experimental import multihost_utils

        return bool(multihost_utils.reached_preemption_sync_point(index))

    def any(self, flag: bool) -> bool:
        """True on every process when `flag` is True on any (e.g. one got SIGTERM)."""
        if self.count == 1:
            return flag
        return bool(np.any(self.gather(np.array([flag]))))

    def broadcast(self, tree: Any) -> Any:
        """Process 0's value of a tree of arrays, on every process (same shapes everywhere)."""
        if self.count == 1:
            return tree
        from jax.experimental import multihost_utils

        out = multihost_utils.broadcast_one_to_all(tree, is_source=self.primary)
        return jax.tree_util.tree_map(np.asarray, out)

    def broadcast_json(self, value: Any) -> Any:
        """Process 0's JSON-serialisable value, on every process."""
        if self.count == 1:
            return value
        raw = np.frombuffer(json.dumps(value).encode(), np.uint8) if self.primary else None
        size = int(self.broadcast(np.array([0 if raw is None else raw.size], np.int64))[0])
        buf = raw if raw is not None else np.zeros(size, np.uint8)
        return json.loads(self.broadcast(buf).tobytes().decode())
