"""Calibration on real comments the run never saw: each label's expected calibration error
and Brier score before and after the run's calibration, with its ROC AUC (the same either
way), on rows of the real Jigsaw file after the ones the run trained and validated on.

    jaxtpu train --task multilabel --train-csv ../shared/data/jigsaw_toxic_dev.csv \\
        --max-rows 8000 --valid-fraction 0.25 --workdir runs/cal
    python -m benchmarks.quality.calibration --workdir runs/cal --skip 8000 --rows 2000

or both at once, `--train` running that command into a new --workdir first (`--skip` is then
its --max-rows). Prints one table, writes it as JSON with `--out`, and keeps it as a measured
report with `--report FILE` (with `--train` only: the report is then this code's run).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.shared.measured import keep as keep_report
from benchmarks.shared.measured import start as start_report
from parity_tests.competitions import write_real_rows

REAL_CSV = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "jigsaw_toxic_dev.csv"
TRAIN = ["--task", "multilabel", "--valid-fraction", "0.25"]  # and --max-rows SKIP
# the documented run's --max-rows (its --skip here); benchmarks.serving.throughput's run
TRAIN_ROWS = 8000


def table(rows: list[dict[str, Any]]) -> str:
    """A row per label: its ROC AUC, and its ECE and Brier score before and after calibration."""
    lines = [
        "| label | ROC AUC | ECE before | ECE after | Brier before | Brier after |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['auc']:.4f} | {r['ece_before']:.4f} | {r['ece_after']:.4f} | "
            f"{r['brier_before']:.4f} | {r['brier_after']:.4f} |"
        )
    return "\n".join(lines)


def train(workdir: str, real_csv: str, rows: int) -> None:
    """The run the docs describe, trained into a new `workdir`."""
    cmd = [sys.executable, "-m", "jaxtpu.train", *TRAIN, "--max-rows", str(rows)]
    cmd += ["--train-csv", real_csv, "--workdir", workdir]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.quality.calibration", description=__doc__
    )
    p.add_argument("--workdir", required=True, help="A run trained with calibration.")
    p.add_argument("--real-csv", default=str(REAL_CSV), help="The real Jigsaw comments file.")
    p.add_argument("--skip", type=int, required=True, help="Rows the run read (--max-rows).")
    p.add_argument("--rows", type=int, default=2000, help="Held-out rows to score.")
    p.add_argument("--num-devices", type=int, default=0, help="Devices (0: every one).")
    p.add_argument("--out", help="Also write the table as JSON here.")
    p.add_argument("--train", action="store_true", help="Train the run into a new --workdir.")
    p.add_argument("--report", metavar="FILE", help="Keep it as a measured report (--train).")
    args = p.parse_args(argv)
    if not Path(args.real_csv).is_file():
        print(f"error: {args.real_csv}: no such file (see ../shared/data/SOURCES.md)")
        return 2
    if args.report and not args.train:
        p.error("--report: with --train only (a kept report is of a run this code trained)")
    if args.train and Path(args.workdir).exists():
        p.error(f"--train: --workdir {args.workdir} exists; give a new directory")
    started = start_report(args.report, "benchmarks.quality.calibration")  # the code and machine
    if args.train:
        train(args.workdir, args.real_csv, args.skip)
    if not (Path(args.workdir) / "calibration.json").is_file():
        print(f"error: --workdir {args.workdir}: no calibration.json (train it again)")
        return 2
    from jaxtpu.engine.evaluation import evaluate
    from jaxtpu.engine.hosts import scoring_devices

    devices = scoring_devices(args.num_devices)
    with tempfile.TemporaryDirectory() as tmp:
        held = write_real_rows(Path(args.real_csv), Path(tmp) / "held.csv", args.rows, args.skip)
        report = evaluate(args.workdir, str(held), devices)
    rows = [
        {"label": column, "auc": report.get(f"auc_{column}", report.get("auc")), **r}
        for column, r in report["calibration"].items()
    ]
    print(f"{report['examples']} held-out rows (after the first {args.skip} of {args.real_csv})")
    print(table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "report": report}, indent=2) + "\n")
    if args.report:
        module = "benchmarks.quality.calibration"
        kept = keep_report(args.report, "calibration", rows, module, argv, started)
        print(f"kept {kept}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
