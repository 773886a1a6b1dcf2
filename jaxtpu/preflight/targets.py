"""The targets preflight compiles for: this machine's devices, a TPU slice it does not have
(`Target`: a topology of one generation's chips, `hardware.TPU_CHIPS`), or GPUs it does not
have (`GpuTarget`: one or two of a Kaggle or Colab GPU, `hardware.GPU_CHIPS`), and the devices
and memory per device each gives.

A GPU target cannot be compiled for without its GPU (the CUDA compiler needs the device), so
its memory is an estimate: the same sharded program compiled by XLA:CPU for as many host
devices, its buffer assignment read as the GPU's (`GPU_MEMORY_METHOD`), against the share of
the GPU's memory JAX takes; the program is also lowered for CUDA (`lowering_platforms`), which
needs no GPU, to show it lowers there."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from jaxtpu.core.errors import ConfigError, DeviceError
from jaxtpu.core.flags.cli import implied
from jaxtpu.core.hardware import GPU_CHIPS, TPU_CHIPS, GiB, GpuChip, TpuChip, precision_problem
from jaxtpu.preflight.report import gib


@dataclass(frozen=True)
class Target:
    """A TPU slice JAX can compile for without having it: a topology of one generation's
    chips (`hardware.TPU_CHIPS`) and the devices its compiler sees."""

    topology: str  # jax.experimental.topologies name: "<version>:<chips grid>"
    chip: TpuChip
    devices: int  # what get_topology_desc gives (v4 here: one per TensorCore)
    note: str = ""
    # chips per host when the slice is one host (a v5e-8 VM, Kaggle's); None: libtpu's default
    # (4 chips per host: a larger slice is several hosts, one process each)
    host_chips: tuple[int, int, int] | None = None

    @property
    def chips(self) -> int:
        return math.prod(int(x) for x in self.topology.split(":")[1].split("x"))

    def memory_per_device(self) -> int:
        """HBM bytes of one of the topology's devices."""
        return int(self.chip.per_device(self.chips, self.devices)[0])

    def peak_flops_per_device(self) -> float:
        """The bf16 peak FLOP/s of one of the topology's devices."""
        return self.chip.per_device(self.chips, self.devices)[1]

    def bandwidth_per_device(self) -> float:
        """The HBM bytes/s of one of the topology's devices."""
        return self.chip.per_device(self.chips, self.devices)[2]


PER_CORE = "compiled per TensorCore"
TPU_TARGETS: dict[str, Target] = {
    "v2-8": Target("v2:2x2", TPU_CHIPS["v2"], 8),
    "v3-8": Target("v3:2x2", TPU_CHIPS["v3"], 8),
    "v4-8": Target("v4:2x2x1", TPU_CHIPS["v4"], 8, PER_CORE),
    "v4-32": Target("v4:2x2x4", TPU_CHIPS["v4"], 32, f"{PER_CORE}; 4 hosts"),
    # v5e and v6e: one device per chip. v5e-1 and v6e-1 are Colab's, v5e-8 is Kaggle's.
    "v5e-1": Target("v5e:1x1", TPU_CHIPS["v5e"], 1, host_chips=(1, 1, 1)),
    "v5e-4": Target("v5e:2x2", TPU_CHIPS["v5e"], 4, host_chips=(2, 2, 1)),
    "v5e-8": Target("v5e:2x4", TPU_CHIPS["v5e"], 8, host_chips=(2, 4, 1)),
    "v5e-16": Target("v5e:4x4", TPU_CHIPS["v5e"], 16, "4 hosts"),
    "v5e-32": Target("v5e:4x8", TPU_CHIPS["v5e"], 32, "8 hosts"),
    "v5p-8": Target("v5p:2x2x1", TPU_CHIPS["v5p"], 4, "one device per chip (megacore)"),
    "v6e-1": Target("v6e:1x1", TPU_CHIPS["v6e"], 1, host_chips=(1, 1, 1)),
    "v6e-8": Target("v6e:2x4", TPU_CHIPS["v6e"], 8, host_chips=(2, 4, 1)),
}


def targets_table() -> str:
    """The TPU targets as the docs' markdown table, from `TPU_TARGETS` and the chip table."""
    rows = [
        "| target | topology | HBM per chip | devices | per device | bf16 peak per chip | "
        "HBM bandwidth per chip | source |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, t in TPU_TARGETS.items():
        devices = f"{t.devices} ({t.note})" if t.note else str(t.devices)
        rows.append(
            f"| `{name}` | `{t.topology}` | {t.chip.hbm_gib:g} GiB | {devices} | "
            f"{t.memory_per_device() / GiB:g} GiB | {t.chip.bf16_tflops:g} TFLOP/s | "
            f"{t.chip.hbm_gbps:,g} GB/s | {t.chip.source} |"
        )
    return "\n".join(rows)


@dataclass(frozen=True)
class GpuTarget:
    """`count` GPUs of one kind on one host, as Kaggle and Colab lend them."""

    chip: GpuChip
    count: int = 1
    note: str = ""

    def memory_per_device(self) -> int:
        """The bytes of one GPU JAX's allocator takes (`memory_fraction`)."""
        return int(self.chip.memory_gib * GiB * memory_fraction())


GPU_TARGETS: dict[str, GpuTarget] = {
    "t4x2": GpuTarget(GPU_CHIPS["t4"], 2, "Kaggle's T4 x2"),
    "p100": GpuTarget(GPU_CHIPS["p100"], 1, "Kaggle's P100"),
    "t4": GpuTarget(GPU_CHIPS["t4"], 1, "Colab's free GPU"),
    "l4": GpuTarget(GPU_CHIPS["l4"], 1, "Colab"),
    "a100-40": GpuTarget(GPU_CHIPS["a100-40"], 1, "Colab"),
    "a100-80": GpuTarget(GPU_CHIPS["a100-80"], 1),
    "h100": GpuTarget(GPU_CHIPS["h100"], 1, "Colab"),
}

# JAX preallocates this share of a GPU's memory for its allocator unless told otherwise (JAX's
# "GPU memory allocation" page); newer versions may grow the pool past it, so a run that fits
# this share fits either way.
DEFAULT_MEMORY_FRACTION = 0.75
GPU_MEMORY_METHOD = (
    "estimated: XLA:CPU's buffer assignment of the same sharded program on as many host "
    "devices (the CUDA compiler needs a GPU), against {fraction:.0%} of the GPU's memory"
)


def memory_fraction() -> float:
    """The share of a GPU's memory JAX's allocator takes: XLA_CLIENT_MEM_FRACTION (or its old
    name XLA_PYTHON_CLIENT_MEM_FRACTION) when set, else JAX's default."""
    for name in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        value = os.environ.get(name, "").strip()
        if value:
            try:
                fraction = float(value)
            except ValueError:
                fraction = -1.0
            if not 0 < fraction <= 1:
                raise ConfigError(f"{name}={value}: not a fraction in (0, 1]")
            return fraction
    return DEFAULT_MEMORY_FRACTION


def gpu_targets_table() -> str:
    """The GPU targets as the docs' markdown table, from `GPU_TARGETS` and the chip table."""
    rows = [
        "| target | GPU | GPUs | memory per GPU | fp32 / fp16 / bf16 peak per GPU | memory "
        "bandwidth | compute capability | source |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, t in GPU_TARGETS.items():
        c = t.chip
        bf16 = f"{c.bf16_tflops:g}" if c.bf16_tflops else "none"
        rows.append(
            f"| `{name}` | {c.device_kind} | {t.count}{f' ({t.note})' if t.note else ''} | "
            f"{c.memory_gib:g} GiB | {c.fp32_tflops:g} / {c.fp16_tflops:g} / {bf16} TFLOP/s | "
            f"{c.memory_gbps:,g} GB/s | {c.compute_capability} | {c.source} |"
        )
    return "\n".join(rows)


TARGETS = ("cpu", *TPU_TARGETS, *GPU_TARGETS)


def target_devices(target: str, n: int) -> tuple[list[Any], int]:
    """(devices to compile for, memory per device in bytes)."""
    import jax

    if target == "cpu":
        from jaxtpu.engine import hosts

        devices = hosts.init_devices(n)
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return devices, host // len(devices)  # the host's RAM, shared by its virtual devices
    if target in GPU_TARGETS:
        return _gpu_devices(target, n)
    if target not in TPU_TARGETS:
        raise ConfigError(f"--target {target}: unknown; choose one of {', '.join(TARGETS)}")
    tpu = TPU_TARGETS[target]
    from jax.experimental import topologies

    host = {"chips_per_host_bounds": tpu.host_chips} if tpu.host_chips else {}
    try:
        topo = topologies.get_topology_desc(platform="tpu", topology_name=tpu.topology, **host)
    except Exception as e:  # libtpu missing, or a topology this libtpu does not know
        raise DeviceError(
            f"--target {target}: cannot compile for TPU topology {tpu.topology} here "
            f"({str(e).splitlines()[0][:160]}); is libtpu installed (pip install "
            f"'jax[tpu]=={jax.__version__}')?"
        ) from None
    devices = list(topo.devices)
    if len(devices) != tpu.devices:
        raise DeviceError(
            f"--target {target}: this libtpu compiles {tpu.topology} for {len(devices)} "
            f"devices, not the {tpu.devices} jaxtpu knows it by"
        )
    if len(devices) != n:
        raise ConfigError(
            f"--target {target} has {len(devices)} devices; use --num-devices {len(devices)}"
        )
    return devices, tpu.memory_per_device()


def device_count(target: str) -> int:
    """The devices a TPU or GPU target has (what its --num-devices must be)."""
    if target in GPU_TARGETS:
        return GPU_TARGETS[target].count
    return TPU_TARGETS[target].devices


def _gpu_devices(target: str, n: int) -> tuple[list[Any], int]:
    """Host CPU devices standing in for the target's GPUs (one each), and the GPU memory JAX
    would take per device."""
    from jaxtpu.engine import hosts

    gpu = GPU_TARGETS[target]
    if n != gpu.count:
        raise ConfigError(
            f"--target {target} has {gpu.count} GPU{'s' if gpu.count > 1 else ''}; use "
            f"--num-devices {gpu.count}"
        )
    return hosts.init_devices(n), gpu.memory_per_device()


def platform_of(devices: list[Any], target: str = "") -> str:
    """The platform the run's defaults are tuned for: the devices' ('tpu' for a TPU target),
    'gpu' for a GPU target (whose stand-ins are host CPU devices)."""
    if target in GPU_TARGETS:
        return "gpu"
    return devices[0].platform if devices else ""


def describe_target(target: str, devices: list[Any], capacity: int) -> str:
    """The target's devices and the memory each gives, for the first log line."""
    if target not in GPU_TARGETS:
        return f"{len(devices)} x {devices[0].device_kind}, {gib(capacity)} each"
    gpu = GPU_TARGETS[target]
    return (
        f"{gpu.count} x {gpu.chip.device_kind}, {gib(capacity)} each: {memory_fraction():.0%} "
        f"of {gpu.chip.memory_gib:g} GiB; estimated on {len(devices)} host CPU device(s)"
    )


def check_gpu_target(target: str, precision: str, save_programs: str | None) -> None:
    """A GPU target's precision (bf16 on a GPU without bfloat16 is refused, as training there
    refuses it), and no --save-programs: nothing is compiled for the GPU."""
    if save_programs:
        raise ConfigError(
            f"--save-programs {save_programs}: --target {target} is estimated, not compiled "
            "for (the CUDA compiler needs the GPU); there are no programs to save"
        )
    problem = precision_problem(precision, "gpu", GPU_TARGETS[target].chip.compute_capability)
    if problem and problem[0] == "error":
        raise ConfigError(f"--target {target}: {problem[1]}")


def implied_by_target(cfg: Any, args: Any) -> Any:
    """What the target implies where the user did not choose: its device count, and on a GPU
    without bfloat16 (a T4, a P100) fp16, the precision training there would use. A value the
    user gave that conflicts is still refused, by the target's own checks."""
    if args.target == "cpu":
        return cfg
    choices: dict[str, Any] = {"num_devices": device_count(args.target)}
    if args.target in GPU_TARGETS:
        chip = GPU_TARGETS[args.target].chip
        if precision_problem("bf16", "gpu", chip.compute_capability):
            choices["precision"] = "fp16"
    return implied(cfg, args.given, choices, f"--target {args.target}")
