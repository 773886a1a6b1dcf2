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
    """The CPU: model name, its family and model numbers and clock (a virtual machine's model
    name can be just "AMD EPYC": two generations under one name ran this project's benchmarks
    2x apart), cores and which of `KERNEL_FLAGS` it has (`cpuinfo`: the text of /proc/cpuinfo,
    read when None)."""
    found: dict[str, str] = {}
    flags: set[str] = set()
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in ("model name", "cpu family", "model", "cpu MHz") and key not in found:
            found[key] = value
        if key == "flags":
            flags = set(value.split())
    record = {
        "model": found.get("model name", "unknown"),
        "cores": os.cpu_count(),
        "flags": [f for f in KERNEL_FLAGS if f in flags],
    }
    if "cpu family" in found and "model" in found:
        record["family"] = f"{found['cpu family']}/{found['model']}"
    if found.get("cpu MHz", "").replace(".", "", 1).isdigit():
        record["mhz"] = round(float(found["cpu MHz"]))
    return record


def cpu_line(cpu: dict[str, Any] | None) -> str:
    """The line under a table saying where it ran."""
    if not cpu:
        return "CPU: not recorded (a result written before tables recorded it)"
    flags = ", ".join(cpu["flags"]) or "none of " + ", ".join(KERNEL_FLAGS)
    details = [f"family/model {cpu['family']}"] if "family" in cpu else []
    details += [f"{cpu['mhz']:,} MHz"] if "mhz" in cpu else []
    which = f" ({', '.join(details)})" if details else ""
    return f"CPU: {cpu['model']}{which}, {cpu['cores']} cores, flags {flags}"
