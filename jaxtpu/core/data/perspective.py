"""`jaxtpu train --perspective`: a run that learns Perspective's scores from a platform's
history (framework-free).

`resolve` (once, before the run directory records the config): every column of the training
file named exactly as a Perspective attribute (upper case, as `jaxtpu history import` writes
them; Jigsaw's own lower-case `insult` or `threat` are its labels, not Perspective's scores)
becomes an auxiliary target (`--aux-columns`: a soft target, blank = not scored), answered
under its own name (`--attributes`); the task's label columns keep their Perspective names
where no learnt column takes them (a multilabel run's `obscene` is PROFANITY unless the file
has PROFANITY).

`prepare` (before the data are read): the rows the run reads, written into WORKDIR/perspective/
so the ordinary data path reads them unchanged. A row without a `toxic` label takes its
TOXICITY score as one (Perspective's score is the share of raters who would call the comment
toxic, as Unintended Bias's `target` is), a row with neither is left out (counted); without
--valid-csv a seeded random --valid-fraction of each class (toxic at 0.5) validates.
`train.csv` and `valid.csv` say what the run trained on and what it did not. At the end,
`on_scale` maps each learnt column onto Perspective's scale on the held-out rows (as `jaxtpu
history fit-scale` does; fit-scale fits it again on another history).
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core import calibration, files
from jaxtpu.core.data.history import scale
from jaxtpu.core.data.history.rows import ATTRIBUTES
from jaxtpu.core.data.tables import open_table
from jaxtpu.core.errors import ConfigError, DataError, UserError
from jaxtpu.core.flags.schema import Config
from jaxtpu.core.serving.attributes import DEFAULT_ATTRIBUTES

log = logging.getLogger(__name__)

FOLDER = "perspective"  # in the run's directory
TRAIN, VALID = "train.csv", "valid.csv"


def learnt_columns(header: list[str]) -> list[str]:
    """The columns of `header` that hold Perspective's scores, in Perspective's order."""
    return [a for a in ATTRIBUTES if a in header]


def resolve(cfg: Config) -> Config:
    """`cfg` with --aux-columns and --attributes taken from the training file when
    --perspective is on; as it is otherwise, or when they were taken already.

    Raises:
      ConfigError: a task that does not score one comment, a split or a start it does not go
        with, --aux-columns naming other columns, or a training file without a Perspective
        attribute column or without a toxic label or TOXICITY.
    """
    if not cfg.train.perspective:
        return cfg
    task, d = cfg.task, cfg.data
    if task.comments_per_example != 1 or task.text_pairs:
        raise ConfigError(f"--perspective: the {task.name} task does not score one comment")
    given = {"--init-from": cfg.model.init_from, "--n-folds": d.n_folds,
             "--fold-column": d.fold_column, "--time-column": d.time_column}  # fmt: skip
    for flag, value in given.items():
        if value:
            raise ConfigError(f"--perspective does not go with {flag} (a random split only)")
    if not d.train_csv or d.train_csv == "sample":
        raise ConfigError("--perspective learns the Perspective columns of --train-csv: give one")
    try:
        header = open_table(d.train_csv).header
    except UserError as e:
        raise ConfigError(f"--perspective: {e}") from None
    learnt = learnt_columns(header)
    if not learnt:
        raise ConfigError(
            f"--perspective: {d.train_csv} has no column named by a Perspective attribute "
            f"({', '.join(ATTRIBUTES)}); write one with jaxtpu history import"
        )
    if "toxic" not in header and "TOXICITY" not in learnt:
        raise ConfigError(
            f"--perspective: {d.train_csv} has neither a toxic label nor Perspective's "
            "TOXICITY, which stands in for it"
        )
    aux = ",".join(learnt)
    if cfg.train.aux_columns and cfg.train.aux_columns != aux:
        raise ConfigError(
            f"--perspective learns {aux} (the file's Perspective columns); not with "
            f"--aux-columns {cfg.train.aux_columns}"
        )
    served = [f"{c}={c}" for c in learnt] + [
        f"{c}={DEFAULT_ATTRIBUTES[c]}"
        for c in cfg.task.label_columns
        if c in DEFAULT_ATTRIBUTES and DEFAULT_ATTRIBUTES[c] not in learnt
    ]
    return cfg.replace(aux_columns=aux, attributes=cfg.output.attributes or ",".join(served))


def prepare(cfg: Config, workdir: str | Path) -> Config:
    """`cfg` reading the rows written to WORKDIR/perspective/ when --perspective is on; as it
    is otherwise.

    Raises:
      DataError: a file that cannot be read, a label or score cell that is no number, or too
        few rows to hold some out.
    """
    if not cfg.train.perspective:
        return cfg
    d = cfg.data
    out = Path(workdir) / FOLDER
    header, rows, left = _rows(d.train_csv)
    if d.valid_csv:
        valid_header, valid, valid_left = _rows(d.valid_csv)
        _write(out / VALID, valid_header, valid)
        train = rows
        left += valid_left
    else:
        held = _held_out(rows, d.valid_fraction, cfg.train.seed, d.train_csv)
        train = [r for i, r in enumerate(rows) if i not in held]
        _write(out / VALID, header, [r for i, r in enumerate(rows) if i in held])
    _write(out / TRAIN, header, train)
    if left:
        log.warning(
            "--perspective: %d row(s) without a toxic label or a TOXICITY score left out", left
        )
    return cfg.replace(train_csv=str(out / TRAIN), valid_csv=str(out / VALID))


def _held_out(rows: list[dict[str, str]], fraction: float, seed: int, path: Any) -> set[int]:
    """A seeded `fraction` of each class of `toxic` (at 0.5), so the validation rows hold both
    whenever the file does."""
    if len(rows) < 2:
        raise DataError(f"{path}: {len(rows)} row(s) to learn from: too few to validate on")
    rng = np.random.default_rng([seed, 23])
    positive = np.array([float(r["toxic"]) >= 0.5 for r in rows])
    held: set[int] = set()
    for side in (True, False):
        where = np.flatnonzero(positive == side)
        if len(where) == 0:
            continue
        k = min(max(1, round(fraction * len(where))), len(where) - (len(where) > 1))
        held.update(rng.permutation(where)[:k].tolist())
    return held


def _rows(path: Any) -> tuple[list[str], list[dict[str, str]], int]:
    """A file's header (with `toxic`) and its rows, `toxic` taken from TOXICITY where blank;
    the rows with neither, counted."""
    table = open_table(path)
    header = table.header if "toxic" in table.header else [*table.header, "toxic"]
    rows, left = [], 0
    for _, row in table.rows():
        if not (row.get("toxic") or "").strip():
            score = (row.get("TOXICITY") or "").strip()
            if not score:
                left += 1
                continue
            row = {**row, "toxic": score}
        rows.append(row)
    return header, rows, left


def _write(path: Path, header: list[str], rows: list[dict[str, str]]) -> None:
    with files.atomic_write(path, newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, header, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def on_scale(
    cal: calibration.Calibration, logits: np.ndarray, labels: np.ndarray, source: Any
) -> calibration.Calibration:
    """`cal` with each learnt Perspective column mapped onto Perspective's scale (the default
    map of `jaxtpu history fit-scale`), fitted on the validation rows (file `source`) the run
    held out, never trained on: their calibrated probabilities against the Perspective scores
    they hold. A column with too few scored rows stays on jaxtpu's scale (said)."""
    z = cal.apply(logits).reshape(len(logits), -1)
    p, y = calibration.sigmoid(z), np.asarray(labels, np.float64).reshape(len(logits), -1)
    scales = []
    for j, column in enumerate(cal.columns):
        if column not in ATTRIBUTES:
            continue
        try:
            xs, ys = scale.fit(p[:, j], y[:, j])
        except ValueError as e:
            log.warning("%s: left on jaxtpu's own scale (%s held-out rows scored)", column, e)
            continue
        n, where = int(np.isfinite(y[:, j]).sum()), f"{Path(str(source)).name} (held out)"
        scales.append(calibration.PerspectiveScale(column, column, tuple(xs), tuple(ys), n, where))
    return cal.with_perspective(tuple(scales))
