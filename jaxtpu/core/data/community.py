"""`jaxtpu train --init-from RUN --train-csv DECISIONS`: the files a run that continues RUN
on new labelled rows (a community's moderators' decisions, `jaxtpu feedback export`) reads,
written into its run directory before it reads anything (framework-free).

- The newest --valid-fraction of the new rows by --time-column validate (the run's best
  model is chosen on them): a model is judged on decisions made after those it learnt from,
  as it will be used. Ties in time keep the file's order. Without --time-column, a seeded
  random draw.
- RUN's own validation rows (`taskdata.validation_rows` of its recorded config) are written
  too: the end of the run scores them under RUN and under the new model
  (`jaxtpu.engine.community`), what the new rows cost the old task.
- --replay-csv's rows join the training rows, a seeded sample of --replay-share of them,
  never a row whose text is one of either validation set's.
- A column the new rows leave blank stays blank: training leaves it out of their loss
  (multilabel's masked BCE), never reads it as 0.

Every file is written whole (`files.atomic_write`) from the same inputs and seed, so a resumed
or a second process's preparation writes the same rows.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core import files, storage
from jaxtpu.core.data.records import Comments, NumberColumn
from jaxtpu.core.data.tables import open_table
from jaxtpu.core.data.taskdata import read_task_file, validation_rows, without_validation_texts
from jaxtpu.core.data.tokenized import labels_of
from jaxtpu.core.data.tokens import default_cache_dir
from jaxtpu.core.errors import ConfigError, DataError
from jaxtpu.core.flags.schema import Config, from_dict
from jaxtpu.core.flags.values import is_run_dir

log = logging.getLogger(__name__)

FOLDER = "community"  # in the new run's directory
TRAIN, VALID, ORIGINAL, SUMMARY = "train.csv", "valid.csv", "original_valid.csv", "summary.json"
COMPARED = "compared.json"  # both validations under both models (`jaxtpu.engine.community`)
FEW_HELD_OUT = 10  # fewer held-out rows of a class than this: a weak choice of the best model


@dataclass(frozen=True)
class Prepared:
    """What `prepare` wrote and counted (its `summary.json`; never a text)."""

    run: str  # the run continued (--init-from)
    source: str  # the new rows' file (--train-csv)
    train_csv: str
    valid_csv: str
    original_valid: str  # RUN's validation rows
    original_what: str
    rows: int  # new rows read
    train_rows: int  # of them, training
    valid_rows: int  # of them, validating
    replayed: int  # --replay-csv rows added to training
    replay_left_out: int  # --replay-csv rows that share a text with a validation row
    split: str  # how the new rows were split
    communities: list[str]  # the `community` column's values, if the file has one
    first: str  # the new rows' first and last time (ISO 8601), '' without --time-column
    last: str
    valid_from: str  # the first validating row's time

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prepare(cfg: Config, workdir: str | Path) -> tuple[Config, Prepared | None]:
    """`cfg` reading the prepared files (and what they hold) when --init-from is a run
    directory; else `cfg` as it is and None.

    Raises:
      ConfigError: a split flag that does not go with continuing a run.
      DataError: the new rows cannot validate (one class), or a file cannot be read.
    """
    run = cfg.model.init_from
    if not is_run_dir(run):
        return cfg, None
    d, task = cfg.data, cfg.task
    _refuse(cfg, run)
    out = Path(workdir) / FOLDER
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(d.cache_dir) if d.cache_dir else default_cache_dir()
    columns = {d.time_column: _time_rule()} if d.time_column else None
    new = read_task_file(d.train_csv, task, cache_dir=None, columns=columns)
    assert isinstance(new, Comments)  # `validate` refuses pairs tasks
    times = new.columns.get(d.time_column) if d.time_column else None
    if d.valid_csv:
        tr, va, split = np.arange(len(new)), np.zeros(0, np.int64), f"--valid-csv {d.valid_csv}"
    else:
        tr, va, split = _newest(new, times, d.valid_fraction, cfg.train.seed, d.time_column)
        _check_both_classes(new, va, split, d.train_csv)
    original, original_what = _original_validation(run)
    held = _concat_texts(new.subset(va), original)
    replay, left_out = _replay(cfg, held, len(tr), cache)
    _check_other_labels(new.subset(tr), replay, task, d.train_csv)
    columns_out = task.label_columns
    train_csv, valid_csv, original_csv = out / TRAIN, out / VALID, out / ORIGINAL
    _write(train_csv, [new.subset(tr), *([replay] if replay is not None else [])], columns_out)
    if not d.valid_csv:
        _write(valid_csv, [new.subset(va)], columns_out)
    _write(original_csv, [original], columns_out)
    prepared = Prepared(
        run=str(run),
        source=str(d.train_csv),
        train_csv=str(train_csv),
        valid_csv=str(d.valid_csv or valid_csv),
        original_valid=str(original_csv),
        original_what=original_what,
        rows=len(new),
        train_rows=int(tr.size),
        valid_rows=int(va.size) if not d.valid_csv else 0,
        replayed=0 if replay is None else len(replay),
        replay_left_out=left_out,
        split=split,
        communities=_communities(d.train_csv),
        first=_iso(times.min()) if times is not None and times.size else "",
        last=_iso(times.max()) if times is not None and times.size else "",
        valid_from=_iso(times[va].min()) if times is not None and va.size else "",
    )
    files.write_text(out / SUMMARY, json.dumps(prepared.to_dict(), indent=1) + "\n")
    _say(prepared, d.replay_csv, len(original))
    return (
        cfg.replace(
            train_csv=str(train_csv),
            valid_csv=prepared.valid_csv,
            time_column="",
            replay_csv=None,
            replay_share=0.5,
        ),
        prepared,
    )


def record(run: str | Path) -> dict[str, Any] | None:
    """What a model card says of the decisions a run learnt from (`summary.json`, and the
    two validations of `compared.json` when written): counts, dates, communities and the run
    it continued, never a text; None for a run that continued none."""
    folder = Path(run) / FOLDER
    try:
        summary = json.loads((folder / SUMMARY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    keys = ("run", "source", "rows", "train_rows", "valid_rows", "replayed", "split",
            "communities", "first", "last", "valid_from")  # fmt: skip
    out = {k: summary.get(k) for k in keys}
    compared = folder / COMPARED
    if compared.is_file():
        out["compared"] = json.loads(compared.read_text(encoding="utf-8"))
    return out


def _refuse(cfg: Config, run: str) -> None:
    """What a continued run cannot do, each in one line."""
    d = cfg.data
    if d.n_folds or d.fold_column or d.holdout_rules:
        raise ConfigError(
            f"--init-from {run}: a continued run validates on its newest rows (--time-column)"
            ", a random --valid-fraction or a --valid-csv, not on folds"
        )
    if not d.train_csv or d.train_csv == "sample":
        raise ConfigError(
            f"--init-from {run}: give the new rows with --train-csv (e.g. the file `jaxtpu "
            "feedback export` wrote)"
        )
    extra = [
        f"--{k} {v}"
        for k, v in (("aux-columns", cfg.train.aux_columns), ("weight-column", d.weight_column))
        if v
    ]
    if extra:
        raise ConfigError(
            f"{', '.join(extra)} with --init-from {run}: the prepared files hold the label "
            "columns alone; continue a run without them"
        )
    header = open_table(d.train_csv).header if d.time_column else []
    if d.time_column and d.time_column not in header:
        raise DataError(
            f"--time-column {d.time_column}: {d.train_csv} has no such column (found: "
            f"{', '.join(header)}); give --time-column '' to hold out a random --valid-fraction "
            "instead"
        )


def _say(p: Prepared, replay_csv: str | None, n_original: int) -> None:
    log.info(
        "--init-from %s: %d new rows of %s: %d train, %d validate (%s)%s; %s: %d rows, "
        "scored under both models at the end",
        p.run,
        p.rows,
        p.source,
        p.train_rows,
        p.valid_rows,
        p.split,
        f"; {p.replayed} rows of {replay_csv} replayed" if replay_csv else "",
        p.original_what,
        n_original,
    )


def _time_rule() -> NumberColumn:
    return NumberColumn("--time-column", blank_ok=False, lo=-math.inf, time=True)


def _newest(
    rows: Comments, times: np.ndarray | None, fraction: float, seed: int, column: str
) -> tuple[np.ndarray, np.ndarray, str]:
    """(train, valid) indices: the newest `fraction` of the rows by `times` (ties: the
    file's order), or a seeded random draw without times; and a description."""
    n = len(rows)
    k = min(max(1, round(fraction * n)), n - 1) if n > 1 else 0
    if k == 0:
        raise DataError(
            f"{rows.source}: {n} row(s): too few to hold some out for validation; give more "
            "rows or a --valid-csv"
        )
    if times is None:
        order = np.random.default_rng([seed, 17]).permutation(n)
        how = f"a seeded random {fraction:.0%} (seed {seed})"
    else:
        order = np.argsort(times, kind="stable")
        how = f"the newest {fraction:.0%} by {column}"
    return np.sort(order[: n - k]), np.sort(order[n - k :]), how


def _check_both_classes(rows: Comments, va: np.ndarray, split: str, path: str) -> None:
    """The validating rows must hold both classes of the main label, or no AUC chooses the
    best model; with few of one class the choice is said to be weak (`few_held_out`)."""
    assert rows.labels is not None
    positive = int((rows.labels[va] >= 0.5).sum())
    if positive in (0, va.size):
        which = "toxic (>= 0.5)" if positive else "not toxic (< 0.5)"
        raise DataError(
            f"{path}: the {va.size} rows held out to validate ({split}) are all {which}, so "
            "their AUC is undefined; raise --valid-fraction, or wait for more decisions"
        )
    if weak := few_held_out(positive, va.size):
        log.warning("%s: %s", path, weak)


def few_held_out(positive: int, rows: int) -> str:
    """What is weak about choosing the best model on `rows` held-out rows of which
    `positive` are toxic: '' when each class has at least `FEW_HELD_OUT` rows. An AUC over
    a handful of one class takes a few values, ties at its top (the first best checkpoint
    wins, however early) and may pick a model that has forgotten what RUN knew."""
    fewer = min(positive, rows - positive)
    if fewer >= FEW_HELD_OUT:
        return ""
    which = "toxic (>= 0.5)" if positive == fewer else "not toxic (< 0.5)"
    return (
        f"only {fewer} of the {rows} rows held out to validate are {which}: their AUC chooses "
        "the best model on so few that the choice is close to arbitrary; raise "
        "--valid-fraction or wait for more decisions, and read RUN's validation in the closing "
        "line before serving the model"
    )


def _original_validation(run: str) -> tuple[Comments, str]:
    """RUN's validation rows: a continued run's own prepared validation file, else the
    rows RUN's recorded config validates on."""
    recorded = json.loads((Path(run) / "config.json").read_text(encoding="utf-8"))
    run_cfg = from_dict(recorded["config"])
    prepared = Path(run) / FOLDER / VALID
    if is_run_dir(run_cfg.model.init_from) and prepared.is_file():
        rows = read_task_file(str(prepared), run_cfg.task)
        what = f"{run}'s validation rows ({prepared})"
    else:
        _check_recorded_file(run, run_cfg)
        rows, where = validation_rows(run_cfg)
        what = f"{run}'s validation rows ({where})"
    assert isinstance(rows, Comments)
    return rows, what


def _check_recorded_file(run: str, run_cfg: Config) -> None:
    """RUN's validation rows are read again from the file RUN was given, as it recorded the
    path: one that is not here is one line saying why it is read and what to do, not a bare
    "no such file"."""
    d = run_cfg.data
    flag, path = ("--valid-csv", d.valid_csv) if d.valid_csv else ("--train-csv", d.train_csv)
    if not path or path == "sample" or storage.is_remote(path) or Path(path).exists():
        return
    relative = "" if Path(path).is_absolute() else " (a relative path: read from where you run)"
    raise DataError(
        f"--init-from {run}: its validation rows are read again from its {flag} {path}, which "
        f"is not here{relative}; run from where {run} was trained, or put the file there"
    )


def _concat_texts(a: Comments, b: Comments) -> Comments:
    """Texts of both, as one `Comments` (for `without_validation_texts`)."""
    texts = [*_texts(a), *_texts(b)]
    return Comments("validation", texts, None)


def _replay(cfg: Config, held: Comments, n_new: int, cache: Path) -> tuple[Comments | None, int]:
    """(the --replay-csv rows added to training, how many of the file's rows share a text
    with a validation row): a seeded sample of share/(1-share) x the new training rows."""
    d = cfg.data
    if not d.replay_csv:
        return None, 0
    rows = read_task_file(d.replay_csv, cfg.task, cache_dir=cache)
    assert isinstance(rows, Comments)
    rows, left_out = without_validation_texts(rows, held, f"--replay-csv {d.replay_csv}")
    want = round(n_new * d.replay_share / (1 - d.replay_share))
    take = min(want, len(rows))
    if take < want:
        log.warning(
            "--replay-csv %s: %d rows to replay, fewer than the %d --replay-share %g asks",
            d.replay_csv,
            len(rows),
            want,
            d.replay_share,
        )
    pick = np.random.default_rng([cfg.train.seed, 19]).choice(len(rows), take, replace=False)
    return rows.subset(np.sort(pick)), left_out


def _check_other_labels(new: Comments, replay: Comments | None, task: Any, path: str) -> None:
    """A multi-label run on new rows that label `toxic` alone learns the other labels from
    the replayed rows only: refused without them, with what to do."""
    if task.main_outputs <= 1 or replay is not None:
        return
    known = ~np.isnan(labels_of(new, task.label_columns))
    if not known[:, 1:].any():
        raise DataError(
            f"{path}: its rows label {task.label_columns[0]} alone; a {task.name} run would "
            f"learn {', '.join(task.label_columns[1:])} from nothing: add --replay-csv (the "
            "run's training file) so they keep what they knew"
        )


def _texts(rows: Comments) -> list[str]:
    return [rows.texts[i] for i in range(len(rows))]


def _write(path: Path, parts: list[Comments], columns: tuple[str, ...]) -> None:
    """`parts` as one classification CSV (id, comment_text, the label columns; a blank
    label stays blank)."""
    with files.atomic_write(path, newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["id", "comment_text", *columns])
        for rows in parts:
            labels = labels_of(rows, columns)
            ids = rows.ids or [""] * len(rows)
            for i, text in enumerate(_texts(rows)):
                out.writerow([ids[i], text, *(_cell(x) for x in labels[i])])


def _cell(x: float) -> str:
    return "" if math.isnan(x) else ("1" if x == 1 else "0" if x == 0 else repr(float(x)))


def _communities(path: str) -> list[str]:
    """The distinct values of the file's `community` column (`jaxtpu feedback export`'s)."""
    table = open_table(path)
    if "community" not in table.header:
        return []
    return sorted({(row.get("community") or "").strip() for _, row in table.rows()} - {""})


def _iso(seconds: float) -> str:
    return dt.datetime.fromtimestamp(float(seconds), dt.UTC).isoformat(timespec="seconds")
