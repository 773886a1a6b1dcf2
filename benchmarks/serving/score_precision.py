"""A bf16 run scored in fp32 (what a CPU without bf16 instructions gets, `jaxtpu.engine.scoring.
for_scoring`) against its own bf16 scoring, on real comments it never saw: each way's ROC AUC,
the difference, and the evaluation's own noise (the bootstrap standard error of the AUC over
the same rows), so the change can be read against it.

`python -m benchmarks.serving.score_precision --workdir RUN [--skip 8000] [--rows 2000] [--out DIR]`

Both ways score on one CPU device in this process (`JAXTPU_SCORE_PRECISION` set to `run`,
then to `fp32`), through `jaxtpu evaluate`'s own path (`jaxtpu.engine.evaluation.evaluate`).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.shared.machine import cpu_record
from benchmarks.shared.measured import show_and_keep
from benchmarks.shared.measured import start as start_report
from parity_tests.competitions import REAL_CSV as DATA

BOOTSTRAP = 200


def _rows(skip: int, rows: int, out: Path) -> Path:
    csv.field_size_limit(1 << 30)
    with open(DATA, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        kept = [r for i, r in enumerate(reader) if skip <= i < skip + rows]
        fields = reader.fieldnames or []
    path = out / "unseen.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(kept)
    return path


def _bootstrap_se(scores: np.ndarray, labels: np.ndarray, seed: int = 0) -> float:
    """The standard error of the mean column ROC AUC over `BOOTSTRAP` resamples of the rows
    (columns whose resample has one class left out)."""
    from jaxtpu.core.metrics import roc_auc

    rng = np.random.default_rng(seed)
    aucs = []
    for _ in range(BOOTSTRAP):
        idx = rng.integers(0, len(labels), len(labels))
        per = [
            roc_auc(scores[idx, j], labels[idx, j])
            for j in range(labels.shape[1])
            if 0 < labels[idx, j].sum() < len(idx)
        ]
        aucs.append(np.mean(per))
    return float(np.std(aucs))


def run(workdir: str, skip: int, rows: int, out: Path) -> dict[str, Any]:
    from jaxtpu.core.hardware import SCORE_PRECISION_ENV
    from jaxtpu.engine import hosts
    from jaxtpu.engine.evaluation import score_file
    from jaxtpu.engine.scoring import load_trained

    out.mkdir(parents=True, exist_ok=True)
    path = _rows(skip, rows, out)
    devices = hosts.scoring_devices(1)
    model = load_trained(workdir)
    result: dict[str, Any] = {"workdir": workdir, "rows": rows, "skip": skip, "ways": {}}
    outputs = {}
    for way in ("run", "fp32"):
        os.environ[SCORE_PRECISION_ENV] = way
        examples, metrics, logits = score_file(model, str(path), devices, 16)
        probs = 1 / (1 + np.exp(-np.asarray(logits, np.float64)))
        probs = probs.reshape(len(examples), -1)
        labels = np.asarray(examples.label).reshape(len(examples), -1)
        outputs[way] = probs
        aucs = {k: float(v) for k, v in metrics.items() if "auc" in k}
        result["ways"][way] = {"aucs": aucs, "bootstrap_se": _bootstrap_se(probs, labels)}
    os.environ.pop(SCORE_PRECISION_ENV, None)
    key = "val_mean_auc" if "val_mean_auc" in result["ways"]["run"]["aucs"] else "val_auc"
    result["metric"] = key
    result["difference"] = result["ways"]["fp32"]["aucs"][key] - result["ways"]["run"]["aucs"][key]
    result["max_abs_probability"] = float(np.max(np.abs(outputs["fp32"] - outputs["run"])))
    result["trained_in"] = model.cfg.train.precision
    result["cpu"] = cpu_record()
    (out / "score_precision.json").write_text(json.dumps(result, indent=1))
    return result


def table(r: dict[str, Any]) -> str:
    """Each way's AUC and its bootstrap standard error, and the difference under the table."""
    key, ways, trained = r["metric"], r["ways"], r["trained_in"]
    lines = [f"| scored in | {key} | bootstrap s.e. |", "|---|---|---|"]
    for way, name in (("run", trained), ("fp32", "fp32 (weights upcast)")):
        lines.append(f"| {name} | {ways[way]['aucs'][key]:.5f} | {ways[way]['bootstrap_se']:.5f} |")
    lines += [
        "",
        f"{r['rows']} real comments the run never saw (rows {r['skip']}-{r['skip'] + r['rows']}"
        f" of the file); fp32 - {trained}: {r['difference']:+.5f} {key}, the largest "
        f"probability difference {r['max_abs_probability']:.1e}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.serving.score_precision", description=__doc__
    )
    p.add_argument("--workdir", required=True, help="a finished bf16 toxicity or multilabel run")
    p.add_argument("--skip", type=int, default=8000, help="rows of the real comments skipped")
    p.add_argument("--rows", type=int, default=2000, help="rows scored after them")
    p.add_argument("--out", default="runs/score-precision", help="where its files go")
    p.add_argument(
        "--report",
        help="also keep the result as a measured report (benchmarks.shared.measured), e.g. "
        "docs/measured/score-precision.json",
    )
    args = p.parse_args(argv)
    if not (Path(args.workdir) / "config.json").is_file():
        p.error(f"--workdir {args.workdir}: not a jaxtpu run directory (no config.json)")
    started = start_report(args.report, "benchmarks.serving.score_precision")
    r = run(args.workdir, args.skip, args.rows, Path(args.out))
    show_and_keep(
        r, "score_precision", "benchmarks.serving.score_precision", args.report, argv, started
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
