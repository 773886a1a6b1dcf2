"""The targets preflight compiles for: this machine's devices, or a TPU slice it does not
have (`Target`: a topology of one generation's chips, `hardware.TPU_CHIPS`), and the devices
and memory per device each gives."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from jaxtpu.core.errors import ConfigError, DeviceError
from jaxtpu.core.hardware import TPU_CHIPS, GiB, TpuChip


@dataclass(frozen=True)
class Target:
    """A TPU slice JAX can compile for without having it: a topology of one generation's
    chips (`hardware.TPU_CHIPS`) and the devices its compiler sees."""

    topology: str  # jax.experimental.topologies name: "<version>:<chips grid>"
    chip: TpuChip
    devices: int  # what get_topology_desc gives (v4 here: one per TensorCore)
    note: str = ""

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


TPU_TARGETS: dict[str, Target] = {
    "v2-8": Target("v2:2x2", TPU_CHIPS["v2"], 8),
    "v3-8": Target("v3:2x2", TPU_CHIPS["v3"], 8),
    "v4-8": Target("v4:2x2x1", TPU_CHIPS["v4"], 8, "compiled per TensorCore"),
    "v5e-8": Target("v5e:2x4", TPU_CHIPS["v5e"], 8),
    "v6e-8": Target("v6e:2x4", TPU_CHIPS["v6e"], 8),
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


TARGETS = ("cpu", *TPU_TARGETS)


def target_devices(target: str, n: int) -> tuple[list[Any], int]:
    """(devices to compile for, memory per device in bytes)."""
    import jax

    if target == "cpu":
        from jaxtpu import hosts

        devices = hosts.init_devices(n)
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return devices, host // len(devices)  # the host's RAM, shared by its virtual devices
    if target not in TPU_TARGETS:
        raise ConfigError(f"--target {target}: unknown; choose one of {', '.join(TARGETS)}")
    tpu = TPU_TARGETS[target]
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(platform="tpu", topology_name=tpu.topology)
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


def platform_of(devices: list[Any]) -> str:
    """The platform the run's defaults are tuned for ('tpu' for a TPU target)."""
    return devices[0].platform if devices else ""
