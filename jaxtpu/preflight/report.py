"""What preflight reports: one `Report` per configuration, the table and the log lines that
label estimates as estimates."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from jaxtpu.core.hardware import GiB


@dataclass
class Report:
    """One compiled configuration's per-device figures (bytes unless named otherwise)."""

    target: str
    sharding: str
    remat: str
    mesh: str
    batch_size: int
    max_len: int
    scan: bool = False
    device: str = ""  # the compiled-for device kind, e.g. "TPU v3"
    params: int = 0
    optimizer: int = 0
    batch: int = 0
    temporary: int = 0  # activations and other scratch of the train step
    total: int = 0  # the train step's peak: arguments + outputs - donated + temporary
    eval_total: int = 0
    capacity: int = 0  # the target's memory per device
    fits: bool = False
    flops_per_step: float = 0.0
    # The TPU compiler's cost model (an estimate, never a measurement): its step time and bytes
    # accessed per device, of the unrolled program (`estimate`); 0 where there is none.
    est_step_s: float = 0.0
    est_bytes_per_step: float = 0.0
    model_flops: float = 0.0  # per device per step: 6 x matmul params x tokens + attention
    remat_flops: float = 0.0  # what rematerialisation recomputes on top, apart
    peak_flops: float = 0.0  # the target's bf16 peak per device
    global_batch: int = 0
    compile_s: float = 0.0
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def gib(x: float) -> str:
    """Bytes in GiB, or MiB below 1 GiB (tiny models are all zeros in GiB)."""
    return f"{x / GiB:.2f} GiB" if x >= GiB else f"{x / 2**20:.1f} MiB"


COLUMNS = [
    ("sharding", lambda r: r.sharding),
    ("remat", lambda r: r.remat),
    ("scan", lambda r: "yes" if r.scan else "no"),
    ("mesh", lambda r: r.mesh),
    ("batch/dev", lambda r: str(r.batch_size)),
    # parameters and optimizer state do not depend on the batch: known when the compiler
    # refuses too (0 only where nothing was lowered)
    ("params", lambda r: gib(r.params) if r.params or not r.error else "-"),
    ("optimizer", lambda r: gib(r.optimizer) if r.optimizer or not r.error else "-"),
    ("temporary", lambda r: gib(r.temporary) if not r.error else "-"),
    ("train step", lambda r: gib(r.total) if not r.error else "refused"),
    ("eval step", lambda r: gib(r.eval_total) if not r.error else "-"),
    ("target", lambda r: gib(r.capacity)),
    ("fits", lambda r: "yes" if r.fits else "NO"),
    ("GFLOP/step/device", lambda r: f"{r.flops_per_step / 1e9:.1f}" if not r.error else "-"),
    ("est. step s*", lambda r: f"{r.est_step_s:.4f}" if r.est_step_s else "-"),
    (
        "est. examples/s*",
        lambda r: f"{r.global_batch / r.est_step_s:,.0f}" if r.est_step_s else "-",
    ),
    (
        "est. tokens/s*",
        lambda r: f"{r.global_batch * r.max_len / r.est_step_s:,.0f}" if r.est_step_s else "-",
    ),
    (
        "est. GB/step/device*",
        lambda r: f"{r.est_bytes_per_step / 1e9:.2f}" if r.est_step_s else "-",
    ),
    (
        "model GFLOP/step/device (+remat)",
        lambda r: (
            f"{r.model_flops / 1e9:.1f}"
            + (f" (+{r.remat_flops / 1e9:.1f})" if r.remat_flops else "")
            if r.model_flops
            else "-"
        ),
    ),
    (
        "MFU bound*",
        lambda r: (
            f"{r.model_flops / (r.est_step_s * r.peak_flops):.0%}"
            if r.est_step_s and r.peak_flops
            else "-"
        ),
    ),
    ("compile s", lambda r: f"{r.compile_s:.1f}"),
]


ESTIMATE_NOTE = (
    "* the TPU compiler's cost model (its `optimal_seconds` for the unrolled train step), an "
    "estimate, not a measurement; tokens at --max-len; MFU bound = model FLOPs (6 x matmul "
    "params x tokens + attention, remat's recomputation apart) / (estimated step x the "
    "target's bf16 peak)"
)


def _largest(r: Report) -> str:
    largest = r.extra.get("largest_batch", 0)
    return str(largest) if largest else f"none (batch {r.batch_size} refused)"


def table(reports: list[Report], find: bool) -> str:
    """A Markdown table: one row per configuration (its largest batch with --find-batch)."""
    cols = list(COLUMNS)
    if find:
        cols.insert(3, ("largest batch/dev", _largest))
    lines = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(f(r) for _, f in cols) + " |" for r in reports]
    if any(r.est_step_s for r in reports):
        lines += ["", ESTIMATE_NOTE]
    return "\n".join(lines)


def say(report: Report) -> None:
    what = (
        f"{report.target} {report.sharding} remat={report.remat}{' scan' if report.scan else ''} "
        f"{report.mesh} "
        f"batch/dev {report.batch_size}"
    )
    if report.error:
        print(f"  {what}: refused by the compiler ({report.error[:120]})", file=sys.stderr)
        return
    speed = ""
    if "no_estimate" in report.extra:
        speed = (
            "; the TPU compiler's cost model gave no usable step-time estimate "
            f"({report.extra['no_estimate']})"
        )
    if report.est_step_s:
        speed = (
            f"; estimated by the TPU compiler (not measured): {report.est_step_s:.4f} s/step, "
            f"{report.global_batch / report.est_step_s:,.0f} examples/s"
        )
    print(
        f"  {what}: train {gib(report.total)}, eval {gib(report.eval_total)} of "
        f"{gib(report.capacity)}: {'fits' if report.fits else 'does NOT fit'} "
        f"(compiled in {report.compile_s:.1f} s){speed}",
        file=sys.stderr,
        flush=True,
    )
