"""The machine a benchmark table ran on, recorded with it: speed figures of different CPUs
differ by more than the effects measured (issue 65: onnxruntime on a CPU with AVX-512 VNNI but
neither bf16 nor AMX ran at 1.0-1.1x PyTorch fp32, where this machine's table says 1.95x)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# the CPU flags that change which kernels XLA, onnxruntime and PyTorch run
KERNEL_FLAGS = ("avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile")


def cpu_record(cpuinfo: str | None = None) -> dict[str, Any]:
    """The CPU: model name, cores and which of `KERNEL_FLAGS` it has (`cpuinfo`: the text of
    /proc/cpuinfo, read when None)."""
    model, flags = "unknown", set()
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError:
        text = ""
    for line in text.splitlines():
        if line.startswith("model name") and model == "unknown":
            model = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
    return {
        "model": model,
        "cores": os.cpu_count(),
        "flags": [f for f in KERNEL_FLAGS if f in flags],
    }


def cpu_line(cpu: dict[str, Any] | None) -> str:
    """The line under a table saying where it ran."""
    if not cpu:
        return "CPU: not recorded (a result written before tables recorded it)"
    flags = ", ".join(cpu["flags"]) or "none of " + ", ".join(KERNEL_FLAGS)
    return f"CPU: {cpu['model']}, {cpu['cores']} cores, flags {flags}"
