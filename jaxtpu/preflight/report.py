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
    # The estimated step time and bytes per device of the unrolled train program (`estimate`;
    # never a measurement), by `est_method`; 0 where there is none (the CPU).
    est_step_s: float = 0.0
    est_bytes_per_step: float = 0.0
    est_method: str = ""  # COMPILER or ROOFLINE
    # ROOFLINE: the upper end of its bracket (on-chip arrays at the HBM rate); 0: no range
    est_step_high_s: float = 0.0
    compiler_step_s: float = 0.0  # both methods' step times, whichever is used (TPU targets)
    roofline_step_s: float = 0.0
    # from est_step_s and the training data: every step at max_len (an upper bound)
    steps_per_epoch: int = 0
    run_steps: int = 0
    est_epoch_s: float = 0.0
    est_run_s: float = 0.0
    est_epoch_high_s: float = 0.0
    est_run_high_s: float = 0.0
    model_flops: float = 0.0  # per device per step: 6 x matmul params x tokens + attention
    remat_flops: float = 0.0  # what rematerialisation recomputes on top, apart
    peak_flops: float = 0.0  # the target's bf16 peak per device
    global_batch: int = 0
    compile_s: float = 0.0
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


COMPILER = "compiler"  # the TPU compiler's cost model, `optimal_seconds`
ROOFLINE = "roofline"  # jaxtpu.preflight.roofline of the compiled program
FLOOR = "flop floor"  # XLA's FLOPs per device / the GPU's published peak (GPU targets)
METHODS = {
    COMPILER: "the TPU compiler's cost model (its `optimal_seconds`)",
    ROOFLINE: "jaxtpu's roofline of the program compiled for the target (each operation: "
    "max(matmul FLOPs / bf16 peak, HBM bytes / HBM bandwidth); a range where the program keeps "
    "arrays in on-chip memory: those bytes free, or counted at the HBM rate)",
    FLOOR: "the FLOP floor on a GPU target: XLA's FLOPs of the step per device / the GPU's "
    "published peak for the run's precision, a lower bound of the step (memory traffic, "
    "kernel launches and communication not counted; the GPU's compiler is not run), and the "
    "epoch from it a lower bound too",
}


def gib(x: float) -> str:
    """Bytes in GiB, or MiB below 1 GiB (tiny models are all zeros in GiB)."""
    return f"{x / GiB:.2f} GiB" if x >= GiB else f"{x / 2**20:.1f} MiB"


def _seconds(x: float) -> str:
    return f"{x:.4f}" if x >= 1e-3 else f"{x:.2g}"


def span(low: float, high: float, fmt: Any) -> str:
    """An estimate, or the range of a bracketed one ('-' where there is none)."""
    if not low:
        return "-"
    return f"{fmt(low)}-{fmt(high)}" if high > low * 1.005 else fmt(low)


def _per_second(r: Report, per_step: float) -> str:
    """`per_step` items at the estimated step time (its range: the slow end first)."""
    if not r.est_step_s:
        return "-"
    slow = per_step / r.est_step_high_s if r.est_step_high_s else 0.0
    return span(slow or per_step / r.est_step_s, per_step / r.est_step_s, lambda x: f"{x:,.0f}")


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
    ("est. step s*", lambda r: span(r.est_step_s, r.est_step_high_s, _seconds)),
    ("est. by", lambda r: r.est_method or "-"),
    ("est. examples/s*", lambda r: _per_second(r, r.global_batch)),
    ("est. tokens/s*", lambda r: _per_second(r, r.global_batch * r.max_len)),
    (
        "est. GB/step/device*",
        lambda r: f"{r.est_bytes_per_step / 1e9:.2f}" if r.est_bytes_per_step else "-",
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
    (
        "est. epoch h*",
        lambda r: span(r.est_epoch_s, r.est_epoch_high_s, lambda x: f"{x / 3600:.2f}"),
    ),
    ("compile s", lambda r: f"{r.compile_s:.1f}"),
]


ESTIMATE_NOTE = (
    "* estimates, not measurements, of the unrolled train step, by {methods}; tokens at "
    "--max-len; MFU bound = model FLOPs (6 x matmul params x tokens + attention, remat's "
    "recomputation apart) / (estimated step x the target's peak: bf16 on a TPU, the run's "
    "precision on a GPU); epoch = its steps x "
    "the estimated step, every step at --max-len (an upper bound when length buckets shorten "
    "batches; compilation and evaluation apart)"
)


def estimate_note(reports: list[Report]) -> str:
    """The table's footnote, naming the methods its rows used."""
    used = [
        f"{name}: {what}"
        for name, what in METHODS.items()
        if any(r.est_method == name for r in reports)
    ]
    return ESTIMATE_NOTE.format(methods="; ".join(used))


def _largest(r: Report) -> str:
    largest = r.extra.get("largest_batch", 0)
    if largest and "search_cap" in r.extra:
        return f"{largest} (the search's cap, {r.extra['search_cap']}: larger may fit)"
    return str(largest) if largest else f"none (batch {r.batch_size} refused)"


def table(reports: list[Report], find: bool) -> str:
    """A Markdown table: one row per configuration (its largest batch with --find-batch)."""
    cols = list(COLUMNS)
    if find:
        cols.insert(3, ("largest batch/dev", _largest))
    lines = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(f(r) for _, f in cols) + " |" for r in reports]
    if any(r.est_step_s for r in reports):
        lines += ["", estimate_note(reports)]
    lines += [f"{r.target}: {r.extra['kaggle']}" for r in reports if "kaggle" in r.extra]
    methods = {r.extra["memory_method"] for r in reports if "memory_method" in r.extra}
    lines += [f"memory per device {m}" for m in sorted(methods)]
    return "\n".join(lines)


def say(report: Report) -> None:
    what = (
        f"{report.target} {report.sharding} remat={report.remat}{' scan' if report.scan else ''} "
        f"{report.mesh} "
        f"batch/dev {report.batch_size}"
    )
    if report.error:
        again = " (remembered)" if report.extra.get("compile_remembered") else ""
        print(f"  {what}: refused by the compiler{again} ({report.error[:120]})", file=sys.stderr)
        return
    speed = ""
    if report.est_step_s:
        by = {
            COMPILER: "by the TPU compiler's cost model",
            ROOFLINE: "by jaxtpu's roofline of the compiled program",
            FLOOR: "as the FLOP floor at the GPU's peak (a lower bound)",
        }[report.est_method]
        if report.est_step_high_s > report.est_step_s:
            by += " (a range: on-chip memory free, or at the HBM rate)"
        speed = (
            f"; estimated {by} (not measured): "
            f"{span(report.est_step_s, report.est_step_high_s, _seconds)} s/step, "
            f"{_per_second(report, report.global_batch)} examples/s"
        )
        if report.est_epoch_s:
            bound = "at least" if report.est_method == FLOOR else "at most"
            speed += (
                f"; an epoch ({report.steps_per_epoch} steps at --max-len) {bound} "
                f"{span(report.est_epoch_s, report.est_epoch_high_s, _hours)}, the run's "
                f"{report.run_steps} step{'' if report.run_steps == 1 else 's'} "
                f"{span(report.est_run_s, report.est_run_high_s, _hours)}"
            )
        if "kaggle" in report.extra:
            speed += f"; {report.extra['kaggle']}"
    print(
        f"  {what}: train {gib(report.total)}, eval {gib(report.eval_total)} of "
        f"{gib(report.capacity)}: {'fits' if report.fits else 'does NOT fit'} "
        f"({_compiled(report)}){speed}",
        file=sys.stderr,
        flush=True,
    )


def _compiled(report: Report) -> str:
    if report.extra.get("compile_remembered"):
        return f"compiled in {report.compile_s:.1f} s by an earlier preflight: remembered"
    return f"compiled in {report.compile_s:.1f} s"


def _hours(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"
