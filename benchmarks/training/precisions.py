"""The Lightning Rate Severity notebook's run in each `--precision`, the table of docs/gpu.md.

`python -m benchmarks.training.precisions --out DIR [--precisions fp32,bf16,fp16] [--report FILE]`

runs, one precision after another, each in a process of its own:

    jaxtpu train --preset lightning-severity --model-dir minilm --train-csv CSV
        --max-rows 1200 --epochs 1 --max-len 64 --n-folds 5 --fold-column ""
        --precision P --workdir DIR/ls-P

(a short run on this machine's devices, not the notebook's three epochs on a GPU) and reports
each run's validation agreement and loss at its last evaluation, its wall time from outside
(process start to exit, on whatever else the machine is doing), and for fp16 the steps it
skipped and the loss scales it trained at. DIR/precisions.json holds the rows (written after
each run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.shared import trainruns
from benchmarks.shared.measured import keep as keep_report
from benchmarks.shared.measured import start as start_report
from parity_tests.competitions import REAL_CSV

PRECISIONS = ("fp32", "bf16", "fp16")
FLAGS = ["--preset", "lightning-severity", "--model-dir", "minilm", "--max-rows", "1200",
         "--epochs", "1", "--max-len", "64", "--n-folds", "5", "--fold-column", ""]  # fmt: skip


def run(precision: str, out: Path, csv_path: Path) -> dict[str, Any]:
    """One run; its last evaluation, wall time and (fp16) loss scales and skipped steps."""
    workdir = out / f"ls-{precision}"
    flags = [*FLAGS, "--train-csv", str(csv_path), "--precision", precision]
    summary, wall = trainruns.train(flags, workdir)
    with open(workdir / "metrics.jsonl", encoding="utf-8") as f:
        trained = [r for r in map(json.loads, f) if r.get("event") == "train"]
    scales = sorted({r["loss_scale"] for r in trained if precision == "fp16"})
    final = summary["final"]
    return {
        "precision": precision,
        "steps": summary["steps"],
        "val_agreement": final["val_agreement"],
        "val_loss": final["val_loss"],
        "wall_s": round(wall, 1),
        **({"skipped_steps": summary["skipped_steps"], "loss_scales": scales} if scales else {}),
    }


def table(rows: list[dict[str, Any]]) -> str:
    """A row per precision: validation agreement and loss, wall seconds, fp16's loss scale."""
    lines = [
        "| `--precision` | steps | val agreement | val loss | wall s | fp16: skipped, scales |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        scaled = "-"
        if "loss_scales" in r:
            low, high = r["loss_scales"][0], r["loss_scales"][-1]
            span = f"{low:,.0f} throughout" if low == high else f"{low:,.0f} to {high:,.0f}"
            scaled = f"{r['skipped_steps']} skipped; scale {span}"
        lines.append(
            f"| {r['precision']} | {r['steps']} | {r['val_agreement']:.4f} | "
            f"{r['val_loss']:.4f} | {r['wall_s']:.0f} | {scaled} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training.precisions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="a new directory for the runs")
    p.add_argument("--precisions", default=",".join(PRECISIONS), help="[%(default)s]")
    p.add_argument("--csv", default=str(REAL_CSV), help="the real comments [%(default)s]")
    p.add_argument(
        "--report",
        metavar="FILE",
        help="also keep the rows as a measured report (benchmarks.shared.measured), e.g. "
        "docs/measured/precisions.json, the table docs/gpu.md shows",
    )
    args = p.parse_args(argv)
    out, real = Path(args.out), Path(args.csv)
    precisions = [x for x in args.precisions.split(",") if x]
    unknown = sorted(set(precisions) - set(PRECISIONS))
    if unknown:
        p.error(f"--precisions: unknown {', '.join(unknown)}; choose from {', '.join(PRECISIONS)}")
    trainruns.check_paths(p, out, real)
    started = start_report(args.report, "benchmarks.training.precisions")  # the code and machine
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for precision in precisions:
        rows.append(run(precision, out, real))
        (out / "precisions.json").write_text(json.dumps(rows, indent=1) + "\n")  # after each
    print(table(rows))
    if args.report:
        kept = keep_report(
            args.report, "precisions", rows, "benchmarks.training.precisions", argv, started
        )
        print(f"kept {kept}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
