"""The Agile Community Rules task on the demonstration files (`parity_tests.competitions`: the
real comments' six labels written as six rules, two of them in the training file, all six in
the test file): the pretrained MiniLM trained three ways, each scored on the labelled test file
by `jaxtpu evaluate`, the table of docs/competitions/rules.md.

`python -m benchmarks.quality.rules --out runs/rules [--epochs 2]`

  rows           rules_train.csv, validated on a held-out 10% of its rows
  rows+examples  the same, with `--rule-examples rules_test.csv`: every test row's four
                 examples as training rows (test-time training, as the medal solutions did)
  holdout        rules_train.csv validated on one whole rule it does not train on
                 (`--holdout-rules 1`): its validation score is one on an unseen rule

Each run's validation score and its test scores (the mean per-rule AUC over the six rules, over
the two training rules and over the four unseen ones, and each rule's) are printed as a table
and written to OUT/rules.json. A demonstration on rules built from Jigsaw labels, not a
leaderboard score: the rules here are the labels of one annotation, which the two training
rules share much of.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks.shared.measured import keep as keep_report
from benchmarks.shared.measured import start as start_report
from jaxtpu.core.breakdowns import rule_keys
from parity_tests.competitions import REAL_CSV, RULES, TRAIN_RULES, write_rules_files

WAYS = {
    "rows": [],
    "rows+examples": ["--rule-examples", "{test}"],
    "holdout": ["--holdout-rules", "1"],
}


def rundir(out: Path, way: str) -> Path:
    return out / way.replace("+", "_")


def run(way: str, flags: list[str], files: dict[str, Path], out: Path, epochs: int) -> dict:
    """Trains one way (skipped when its run finished before) and evaluates its best model on
    the labelled test file."""
    workdir = rundir(out, way)
    if not (workdir / "summary.json").exists():
        shutil.rmtree(workdir, ignore_errors=True)  # a run that did not finish: again
        cmd = [
            sys.executable,
            "-m",
            "jaxtpu.train",
            "--preset",
            "minilm",
            "--task",
            "rules",
            "--train-csv",
            str(files["train"]),
            "--epochs",
            str(epochs),
            "--workdir",
            str(workdir),
            *[f.format(test=files["test"]) for f in flags],
        ]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    summary = json.loads((workdir / "summary.json").read_text())
    cmd = [
        sys.executable,
        "-m",
        "jaxtpu.evaluate",
        "--workdir",
        str(workdir),
        "--input",
        str(files["labelled"]),
        "--out",
        str(workdir / "test.json"),
        "--overwrite",
    ]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    result = json.loads((workdir / "test.json").read_text())
    return {"valid": summary["best"]["value"], "test": result}


def table(results: dict[str, dict]) -> str:
    """The markdown table of the runs' scores."""
    keys = rule_keys(list(RULES.values()))
    seen = [keys[RULES[k]] for k in TRAIN_RULES]
    unseen = [keys[RULES[k]] for k in RULES if k not in TRAIN_RULES]
    lines = [
        "| | " + " | ".join(results) + " |",
        "|---|" + "---|" * len(results),
        "| validation (mean per-rule AUC) | "
        + " | ".join(f"{r['valid']:.4f}" for r in results.values())
        + " |",
        "| **test, mean per-rule AUC (6 rules)** | "
        + " | ".join(f"**{r['test']['value']:.4f}**" for r in results.values())
        + " |",
    ]
    for name, part in (("the 2 training rules", seen), ("the 4 unseen rules", unseen)):
        cells = [np.mean([r["test"][f"auc_rule_{k}"] for k in part]) for r in results.values()]
        lines.append(f"| test, mean of {name} | " + " | ".join(f"{c:.4f}" for c in cells) + " |")
    for label, rule in RULES.items():
        k = keys[rule]
        mark = " (trained)" if label in TRAIN_RULES else ""
        cells = [r["test"][f"auc_rule_{k}"] for r in results.values()]
        lines.append(
            f"| test, {label}{mark}: {rule} | " + " | ".join(f"{c:.4f}" for c in cells) + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="directory for the files, runs and rules.json")
    p.add_argument("--csv", default=str(REAL_CSV), help="the real comments (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=2, help="epochs of each run (default: 2)")
    p.add_argument("--ways", default=",".join(WAYS), help="which runs (default: %(default)s)")
    p.add_argument(
        "--report",
        metavar="FILE",
        help="also keep the results as a measured report (benchmarks.shared.measured), e.g. "
        "docs/measured/rules.json, the table docs/competitions/rules.md shows",
    )
    args = p.parse_args(argv)
    real, out = Path(args.csv), Path(args.out)
    if not real.exists():
        p.error(f"--csv {real}: not found (see ../shared/data/SOURCES.md)")
    ways = [w for w in args.ways.split(",") if w]
    unknown = [w for w in ways if w not in WAYS]
    if unknown:
        p.error(f"--ways: unknown {', '.join(unknown)}; the ways are {', '.join(WAYS)}")
    reused = [w for w in ways if (rundir(out, w) / "summary.json").exists()]
    if args.report and reused:  # a kept report is this code's runs, not earlier ones
        p.error(f"--report: {out} holds finished runs ({', '.join(reused)}); give a new --out")
    # the code and machine that measure
    started = start_report(args.report, "benchmarks.quality.rules")
    train, test, labelled = write_rules_files(real, out)
    files = {"train": train, "test": test, "labelled": labelled}
    results = {w: run(w, WAYS[w], files, out, args.epochs) for w in ways}
    (out / "rules.json").write_text(json.dumps(results, indent=1))
    print(table(results))
    if args.report:
        kept = keep_report(args.report, "rules", results, "benchmarks.quality.rules", argv, started)
        print(f"kept {kept}")


if __name__ == "__main__":
    main()
