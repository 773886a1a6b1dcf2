"""Every fold in one command (`--all-folds`), as the notebooks' fold loops do: each fold trains
into its own run directory, then the folds' best metrics (mean and spread) and their
out-of-fold predictions are written beside them (framework-free: both sides' trainers run it).

    RUN/fold-0/ ... RUN/fold-4/    one run directory per fold (config.json says which fold)
    RUN/folds.json                 each fold's best monitored value and step; mean, std
    RUN/oof.csv                    row, fold, the best model's prediction of each validation row
"""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core import storage
from jaxtpu.core.data import demo, taskdata
from jaxtpu.core.data.tokens import default_cache_dir
from jaxtpu.core.errors import ConfigError, UserError
from jaxtpu.core.flags.schema import Config
from jaxtpu.core.run.loop import VALID_SCORES
from jaxtpu.core.run.rundir import default_workdir, strict_json

log = logging.getLogger("jaxtpu")


def fold_ids(cfg: Config) -> list[int]:
    """The folds of the run: 0..--n-folds - 1, or the values of the file's --fold-column."""
    d = cfg.data
    if d.valid_csv:
        raise ConfigError(
            "--all-folds draws each fold's validation set from the training file; drop --valid-csv"
        )
    if d.fold_column:
        path = demo.SAMPLE_CSV if d.train_csv == "sample" else d.train_csv
        if not path:
            raise ConfigError("--fold-column needs a --train-csv that has the column")
        # through the file cache: the folds' runs then find the file read
        cache = d.cache_dir or default_cache_dir()
        folds = taskdata.read_task_file(path, cfg.task, d.fold_column, cache).folds
        return sorted(set(np.asarray(folds).tolist()))
    if not d.n_folds:
        raise ConfigError("--all-folds needs the folds: --n-folds K, or --fold-column NAME")
    return list(range(d.n_folds))


def train_folds(cfg: Config, train_one: Callable[[Config], Any]) -> dict[str, Any]:
    """Trains every fold with `train_one` (a side's `train_and_evaluate`), each in
    RUN/fold-K; with --resume, a fold that finished is kept as it is and an interrupted one
    continues. RUN may be a bucket URL (each fold is a bucket run directory). Returns the
    folds' record (also RUN/folds.json)."""
    ids = fold_ids(cfg)
    base = cfg.output.workdir or str(default_workdir(cfg.train.task))
    if not cfg.output.resume and storage.listing(base):
        raise UserError(
            f"--workdir {base} exists; pass --resume to continue its folds, or choose another"
        )
    results = []
    for k in ids:
        wd = storage.join(base, f"fold-{k}")
        if cfg.output.resume and storage.exists(storage.join(wd, "summary.json")):
            log.info("fold %d: finished earlier, kept (%s)", k, wd)
        else:
            log.info("fold %d of %s: training into %s", k, ids, wd)
            resume = cfg.output.resume and storage.exists(storage.join(wd, "config.json"))
            train_one(cfg.replace(fold=k, workdir=wd, all_folds=False, resume=resume))
        summary = json.loads(storage.read_bytes(storage.join(wd, "summary.json")))
        if summary.get("stopped_by") in ("SIGTERM", "SIGINT"):
            log.info("fold %d stopped by %s; continue with --resume", k, summary["stopped_by"])
            return {"stopped_by": summary["stopped_by"], "workdir": base, "steps": 0}
        results.append({"fold": k, "workdir": wd, **_best(summary)})
    values = np.array([r["best"] for r in results], np.float64)
    oof = storage.join(base, "oof.csv")
    record = {
        "monitor": results[0]["monitor"],
        "folds": results,
        "mean": float(np.mean(values)),
        "std": float(np.std(values)),
        "oof": oof,
    }
    rows = write_oof(base, ids)
    storage.write_output_text(
        storage.join(base, "folds.json"), strict_json(record, indent=2) + "\n"
    )
    log.info("%s", table(record))
    log.info("out-of-fold predictions of %d rows: %s", rows, oof)
    return {**record, "workdir": base}


def _best(summary: dict[str, Any]) -> dict[str, Any]:
    best = summary["best"]
    value = best["value"] if best["value"] is not None else float("nan")
    return {"monitor": summary["monitor"], "best": value, "step": best["step"]}


def write_oof(base: str | Path, ids: list[int]) -> int:
    """RUN/oof.csv from each fold's `valid_scores.csv`, by row; returns the rows written."""
    header, rows = None, []
    for k in ids:
        text = storage.read_bytes(storage.join(base, f"fold-{k}", VALID_SCORES)).decode()
        reader = csv.reader(io.StringIO(text, newline=""))
        first = next(reader)
        header = header or first
        rows += [[int(r[0]), k, *r[1:]] for r in reader]
    rows.sort(key=lambda r: r[0])
    assert header is not None
    out = io.StringIO(newline="")
    w = csv.writer(out)
    w.writerow(["row", "fold", *header[1:]])
    w.writerows(rows)
    storage.write_output_text(storage.join(base, "oof.csv"), out.getvalue())
    return len(rows)


def table(record: dict[str, Any]) -> str:
    lines = [f"{'fold':>4}  best {record['monitor']:<16} step"]
    for r in record["folds"]:
        lines.append(f"{r['fold']:>4}  {r['best']:<21.4f} {r['step']}")
    lines.append(f"mean {record['mean']:.4f} +- {record['std']:.4f} (std over folds)")
    return "\n".join(lines)
