"""Length buckets against padded batches, on quality: one epoch of the `minilm` recipe on the
real comments, bucketed (`--buckets auto`) and padded (`--buckets none`), at each seed, and the
validation ROC AUC each run reached (docs/benchmarks.md's quality table).

`python -m benchmarks.quality.buckets --out DIR [--seeds 0,1] [--report FILE]`

runs, one after another, each in a process of its own:

    python -m jaxtpu.train --preset minilm --train-csv CSV --parallel jit --num-devices 2
        --steps-per-call 8 --log-every 8 --buckets B --seed S --workdir DIR/seed-S-B

(the seed picks the held-out split, the batch order and dropout) and reports each run's final
validation ROC AUC and loss, its steps and its wall time from outside, and per seed bucketed's
AUC less padded's. DIR/quality.json holds the rows. About half an hour on a 2-core machine for
two seeds.
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

BATCHINGS = {"bucketed": "auto", "padded": "none"}  # row name: --buckets
FLAGS = ["--preset", "minilm", "--parallel", "jit", "--num-devices", "2",
         "--steps-per-call", "8", "--log-every", "8"]  # fmt: skip


def run(seed: int, batching: str, out: Path, csv_path: Path) -> dict[str, Any]:
    """One run: its final validation ROC AUC and loss, steps and wall time."""
    flags = [*FLAGS, "--train-csv", str(csv_path), "--buckets", BATCHINGS[batching]]
    summary, wall = trainruns.train([*flags, "--seed", str(seed)], out / f"seed-{seed}-{batching}")
    final = summary["final"]
    return {
        "seed": seed,
        "batching": batching,
        "steps": summary["steps"],
        "val_auc": final["val_auc"],
        "val_loss": final["val_loss"],
        "wall_s": round(wall, 1),
    }


def table(rows: list[dict[str, Any]]) -> str:
    """A row per run; a bucketed row also gives its AUC less padded's at the same seed, and
    the line under the table their mean over the seeds that have both."""
    auc = {(r["seed"], r["batching"]): r["val_auc"] for r in rows}
    lines = [
        "| seed | batching | steps | val ROC AUC | val loss | wall s | bucketed - padded |",
        "|---|---|---|---|---|---|---|",
    ]
    gaps = []
    for r in rows:
        padded = auc.get((r["seed"], "padded"))
        gap = "-"
        if r["batching"] == "bucketed" and padded is not None:
            gaps.append(r["val_auc"] - padded)
            gap = f"{gaps[-1]:+.4f}"
        lines.append(
            f"| {r['seed']} | {r['batching']} | {r['steps']} | {r['val_auc']:.4f} | "
            f"{r['val_loss']:.4f} | {r['wall_s']:.0f} | {gap} |"
        )
    if gaps:
        lines += ["", f"Bucketed - padded, mean over {len(gaps)} seeds: "
                      f"{sum(gaps) / len(gaps):+.4f} validation ROC AUC."]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.quality.buckets",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="a new directory for the runs")
    p.add_argument("--seeds", default="0,1", help="comma-separated --seed values [%(default)s]")
    p.add_argument("--csv", default=str(REAL_CSV), help="the real comments [%(default)s]")
    p.add_argument(
        "--report",
        metavar="FILE",
        help="also keep the rows as a measured report (benchmarks.shared.measured), e.g. "
        "docs/measured/quality.json, the table docs/benchmarks.md shows",
    )
    args = p.parse_args(argv)
    out, real = Path(args.out), Path(args.csv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds {args.seeds!r}: comma-separated integers, e.g. 0,1")
    if not seeds or len(set(seeds)) != len(seeds):
        p.error(f"--seeds {args.seeds!r}: one or more different integers, e.g. 0,1")
    trainruns.check_paths(p, out, real)
    started = start_report(args.report, "benchmarks.quality.buckets")  # the code and machine
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in seeds:
        for batching in BATCHINGS:
            rows.append(run(seed, batching, out, real))
            (out / "quality.json").write_text(json.dumps(rows, indent=1) + "\n")  # after each
    print(table(rows))
    if args.report:
        kept = keep_report(
            args.report, "quality", rows, "benchmarks.quality.buckets", argv, started
        )
        print(f"kept {kept}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
