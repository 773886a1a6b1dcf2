"""The Jigsaw competitions trained and evaluated on the demonstration files
(`parity_tests.competitions`: the real comments of ../shared/data in each competition's layout),
the tables of docs/competitions.md and docs/competitions/unintended-bias.md.

`python -m benchmarks.quality.competitions --out DIR [--set bias] [--report FILE]`

  competitions  Unintended Bias, Multilingual, Toxic Comment and Rate Severity, each with its
                page's commands (MiniLM, one epoch, bf16, the devices JAX finds), the table
                of docs/competitions.md
  bias          Unintended Bias plain and with --bias-weights and eight auxiliary targets,
                the table of docs/competitions/unintended-bias.md

Each run is `jaxtpu train`, then `jaxtpu evaluate` of its best model on the file its page
names (and, for Multilingual, `jaxtpu predict` of the test file). A row holds the commands, the
steps trained, the monitored metric's best, the run's validation loss at that step and what
`evaluate` reported. OUT/competitions.json holds the rows. Only the comments and their labels
are real (the fractions, identities and languages are drawn), so the numbers show the pipeline
at work, not a competition score.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.shared.measured import keep as keep_report
from benchmarks.shared.measured import start as start_report
from parity_tests.competitions import REAL_CSV, build

UB = ["--train-csv", "$D/ub_train.csv", "--valid-csv", "$D/ub_valid.csv"]
AUX = "severe_toxicity,obscene,identity_attack,insult,threat,male,female,muslim"
# name -> (set, train flags, the file `evaluate` scores, the file `predict` scores or None)
RUNS: dict[str, tuple[str, list[str], str, str | None]] = {
    "Unintended Bias": ("competitions", UB, "ub_valid.csv", None),
    "Multilingual": (
        "competitions",
        [
            "--train-csv",
            "$D/tc_train.csv",
            "--valid-csv",
            "$D/ml_validation.csv",
            "--monitor",
            "val_mean_language_auc",
        ],
        "ml_validation.csv",
        "ml_test.csv",
    ),  # fmt: skip
    "Toxic Comment": (
        "competitions",
        ["--task", "multilabel", "--train-csv", "$D/tc_train.csv"],
        "tc_test_labelled.csv",
        None,
    ),
    "Rate Severity": (
        "competitions",
        ["--task", "ranking", "--train-csv", "$D/tc_train.csv"],
        "rs_validation_data.csv",
        None,
    ),
    "plain": ("bias", UB, "ub_valid.csv", None),
    "`--bias-weights` + 8 auxiliary targets": (
        "bias",
        [*UB, "--bias-weights", "--aux-columns", AUX],
        "ub_valid.csv",
        None,
    ),
}
SETS = ("competitions", "bias")
PATHS = ("workdir", "input", "model_dir")  # evaluate's report's paths: this machine's, not kept


def rundir(out: Path, name: str) -> Path:
    return out / "runs" / "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def _run(cmd: list[str], data: Path) -> None:
    print("$", " ".join(cmd), flush=True)
    real = [sys.executable, "-m", f"jaxtpu.{cmd[1]}", *cmd[2:]]
    subprocess.run([a.replace("$D", str(data)) for a in real], check=True)


def run(name: str, out: Path, data: Path) -> dict[str, Any]:
    """Trains one run, evaluates its best model (and predicts, where its page does)."""
    _, flags, scored, predicted = RUNS[name]
    workdir = rundir(out, name)
    commands = [
        ["jaxtpu", "train", "--preset", "minilm", *flags, "--workdir", str(workdir)],
        ["jaxtpu", "evaluate", "--workdir", str(workdir), "--input", f"$D/{scored}",
         "--out", str(workdir / "evaluate.json")],
    ]  # fmt: skip
    if predicted:
        commands.append(
            ["jaxtpu", "predict", "--workdir", str(workdir), "--input", f"$D/{predicted}",
             "--output", str(workdir / "predictions.csv")]
        )  # fmt: skip
    for cmd in commands:
        _run(cmd, data)
    summary = json.loads((workdir / "summary.json").read_text())
    evaluated = json.loads((workdir / "evaluate.json").read_text())  # less this machine's paths
    row = {
        "run": name,
        "commands": [" ".join(c).replace(str(workdir), f"runs/{workdir.name}") for c in commands],
        "summary": {k: summary[k] for k in ("steps", "monitor", "best")},
        "best_eval": _eval_at(workdir, summary["best"]["step"]),
        "evaluate": {k: v for k, v in evaluated.items() if k not in PATHS},
    }
    if predicted:
        with open(workdir / "predictions.csv", newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        row["predicted"] = {"columns": rows[0], "rows": len(rows) - 1}
    return row


def _eval_at(workdir: Path, step: int | None) -> dict[str, Any]:
    """The run's validation metrics at `step` (metrics.jsonl's eval record)."""
    with open(workdir / "metrics.jsonl", encoding="utf-8") as f:
        evals = [r for r in map(json.loads, f) if r.get("event") == "eval"]
    evals = [r for r in evals if r.get("step") == step]
    return {k: v for k, v in (evals[-1] if evals else {}).items() if k.startswith("val_")}


def _evaluated(report: dict[str, Any]) -> str:
    """evaluate's metric, then its parts that are not per-identity (`bpsn_auc_muslim`)."""
    parts = [
        f"{k} {v:.4f}"
        for k, v in report.items()
        if isinstance(v, float) and k not in (report["metric"], "value") and "_auc_" not in k
    ]
    unit = "pairs" if "pairs" in report else "examples"
    head = f"`{report['metric']}` {report['value']:.4f} on {report.get(unit)} {unit}"
    return head + (f" ({', '.join(parts)})" if parts else "")


def _trained(summary: dict[str, Any]) -> str:
    return f"{summary['steps']} steps, best {summary['monitor']} {summary['best']['value']:.4f}"


def table(rows: list[dict[str, Any]]) -> str:
    """docs/competitions.md: a row per competition, its commands, its training and what
    `jaxtpu evaluate` reported (and what `predict` wrote)."""
    lines = [
        "| competition | commands | training | `jaxtpu evaluate` |",
        "|---|---|---|---|",
    ]
    for r in rows:
        commands = "; ".join(f"`{c}`" for c in r["commands"])
        scored = _evaluated(r["evaluate"])
        if "predicted" in r:
            p = r["predicted"]
            scored += f"; predict wrote {p['rows']} rows of `{','.join(p['columns'])}`"
        lines.append(f"| {r['run']} | {commands} | {_trained(r['summary'])} | {scored} |")
    return "\n".join(lines)


def bias_table(rows: list[dict[str, Any]]) -> str:
    """docs/competitions/unintended-bias.md: the competition's metric and its parts, as
    `jaxtpu evaluate` scored each run's best model on the validation file, and its val_loss."""
    parts = ("jigsaw_bias", "overall_auc", "subgroup_auc", "bpsn_auc", "bnsp_auc")
    lines = [
        "| run | steps | " + " | ".join(parts) + " | val_loss at the best step |",
        "|---|---|" + "---|" * (len(parts) + 1),
    ]
    for r in rows:
        e = r["evaluate"]
        cells = [f"{e[k]:.4f}" for k in parts]
        loss = r["best_eval"].get("val_loss")
        loss_cell = f"{loss:.4f}" if isinstance(loss, float) else "-"
        steps = r["summary"]["steps"]
        lines.append(f"| {r['run']} | {steps} | " + " | ".join(cells) + f" | {loss_cell} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.quality.competitions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="a new directory for the files and runs")
    p.add_argument("--set", choices=SETS, default="competitions", help="which runs [%(default)s]")
    p.add_argument("--csv", default=str(REAL_CSV), help="the real comments [%(default)s]")
    p.add_argument(
        "--report",
        metavar="FILE",
        help="also keep the rows as a measured report (benchmarks.shared.measured), e.g. "
        "docs/measured/competitions.json (--set competitions) or docs/measured/bias.json "
        "(--set bias)",
    )
    args = p.parse_args(argv)
    out, real = Path(args.out), Path(args.csv)
    if not real.is_file():
        p.error(f"--csv {real}: not found (see ../shared/data/SOURCES.md)")
    if (out / "runs").exists():
        p.error(f"--out {out}: holds runs already; give a new directory")
    started = start_report(args.report, "benchmarks.quality.competitions")  # the code and machine
    data = out / "data"
    build(real, data)
    rows = [run(name, out, data) for name, (s, *_) in RUNS.items() if s == args.set]
    (out / "competitions.json").write_text(json.dumps(rows, indent=1) + "\n")
    print((bias_table if args.set == "bias" else table)(rows))
    if args.report:
        kind = "bias" if args.set == "bias" else "competitions"
        kept = keep_report(
            args.report, kind, rows, "benchmarks.quality.competitions", argv, started
        )
        print(f"kept {kept}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
