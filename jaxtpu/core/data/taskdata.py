"""The one entry point of a run's data: read the files a config names (through the file cache),
split, pair (ranking) and tokenize, with the checks that refuse a set the task cannot use
(framework-free)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core import storage
from jaxtpu.core.data import prompts, readers, rules, templates
from jaxtpu.core.data.demo import SAMPLE_CSV, demo_comments
from jaxtpu.core.data.filecache import read_cached
from jaxtpu.core.data.filekinds import BY_NAME, kind_of
from jaxtpu.core.data.pairing import pairs_from_labels
from jaxtpu.core.data.readers import missing_columns_error
from jaxtpu.core.data.records import Comments, Groups, NumberColumn, Pairs
from jaxtpu.core.data.rowweights import row_weights, weight_columns
from jaxtpu.core.data.splits import split, subsample
from jaxtpu.core.data.tables import open_table
from jaxtpu.core.data.tokenized import Examples, encode, labels_of
from jaxtpu.core.data.tokens import default_cache_dir
from jaxtpu.core.errors import DataError
from jaxtpu.core.flags.schema import Config
from jaxtpu.core.tasks import TASKS, Task
from jaxtpu.core.textformat import PLAIN, PROMPT, TextFormat

log = logging.getLogger(__name__)


def read_task_file(
    path: str | os.PathLike,
    task: Task,
    fold_column: str = "",
    cache_dir: Any = None,
    columns: Mapping[str, NumberColumn] | None = None,
    fmt: TextFormat = PLAIN,
) -> Comments | Pairs:
    """Reads a training/validation file of one of the kinds the task reads (`Task.reads`), with
    the fold ids of `fold_column` when one is asked for and the numeric `columns` a run asks
    for; with a `cache_dir`, through the file cache (`read_cached`; not a rules file, whose
    first texts come from the run's text format `fmt`, and which is small): a rules row's
    first text, or each row's prompt. A file in a bucket is read from its local copy
    (`storage.fetch`), its messages naming the URL."""
    if storage.is_remote(path):
        local = storage.fetch(str(path))
        with storage.named(local, str(path)):
            return read_task_file(local, task, fold_column, cache_dir, columns, fmt)
    table = open_table(path)  # the header, read once: the reader takes it from here
    kind = kind_of(table.header)
    if kind is None or kind.name not in task.reads:
        readers_of = [t.name for t in TASKS.values() if kind and kind.name in t.reads]
        if kind and kind.labelled and readers_of:
            raise DataError(
                f"{path}: {kind.what}; train on it with --task {' or --task '.join(readers_of)}, "
                f"not --task {task.name}"
            )
        expected = " or ".join(BY_NAME[k].expected for k in task.reads)
        raise missing_columns_error(path, table.header, expected)
    if kind.by_rule:  # its first texts are the run's template of its columns; not cached
        return readers.read_rules(
            path,
            fold_column=fold_column,
            table=table,
            columns=columns,
            template=templates.template_of(fmt),
        )
    if cache_dir is None:
        data = readers.READERS[kind.name](
            path, fold_column=fold_column, table=table, columns=columns
        )
    else:
        data = read_cached(kind.name, Path(path), fold_column, Path(cache_dir), table, columns)
    if isinstance(data, Comments) and data.groups and task.comments_per_example == 2:
        log.warning(
            "%s: identity/lang columns not used: the %s task is scored by agreement over pairs",
            path,
            task.name,
        )
        data.groups = Groups()
    return templates.prompted(data, fmt) if isinstance(data, Comments) else data


def number_columns(cfg: Config, training: bool = True) -> dict[str, NumberColumn]:
    """The numeric columns a run reads beyond the Jigsaw ones: the row weights' (training file,
    and with --weighted-val-loss the validation file) and the auxiliary targets
    (`--aux-columns`: a validation file without one leaves that target unscored)."""
    weighted = training or cfg.data.weighted_val_loss
    return {**(weight_columns(cfg) if weighted else {}), **aux_columns(cfg.task, training)}


def aux_columns(task: Task, required: bool) -> dict[str, NumberColumn]:
    """The auxiliary targets' columns of a file (`Task.aux_columns`); when not `required`, a
    file without one leaves that target unscored (blank)."""
    aux = NumberColumn("--aux-columns", blank_ok=True, lo=0.0, hi=1.0, required=required)
    return dict.fromkeys(task.aux_columns, aux)


@dataclass
class TaskData:
    train: Examples
    valid: Examples
    info: dict[str, Any]
    valid_rows: np.ndarray | None = None  # the validation rows' places in the training file


def check_label_columns(train: Comments | Pairs, task: Task, source: str) -> None:
    """A task of several labels needs them: refused when no label besides the first has a
    value in the training rows (it would only ever learn that one); a label column without
    any value is named in the log."""
    if not isinstance(train, Comments):
        return
    known = ~np.isnan(labels_of(train, task.label_columns))
    blank = [c for c, seen in zip(task.label_columns, known.any(0), strict=True) if not seen]
    if blank and set(blank) >= set(task.label_columns[1:]):
        raise DataError(
            f"{source}: no value in any of the label columns {', '.join(task.label_columns[1:])}"
            f" (missing or blank in all {len(train)} training rows); --task {task.name} needs "
            "them (--task toxicity trains on toxic alone)"
        )
    if blank:
        log.warning(
            "%s: label column(s) %s have no value in the training rows: those outputs learn "
            "nothing",
            source,
            ", ".join(blank),
        )


def without_validation_texts(
    more: Comments | Pairs, valid: Comments | Pairs, what: str
) -> tuple[Comments | Pairs, int]:
    """`more` (rows added to training) without those that share a text with a validation
    row (for pairs: either comment with any validation comment), so validation stays unseen,
    and how many were left out. Raises DataError when that leaves none."""
    seen = {bytes(x) for x in valid.text_digests().reshape(-1, 16)}
    digests = more.text_digests().reshape(len(more), -1, 16)
    hit = np.array([any(bytes(x) in seen for x in row) for row in digests], bool)
    if hit.all() and len(more):
        raise DataError(
            f"{what}: every one of its {len(more)} rows shares a text with a validation row; "
            "adding them would train on the validation set"
        )
    return (more.subset(np.flatnonzero(~hit)) if hit.any() else more), int(hit.sum())


def load_task_data(cfg: Config, tokenizer: Any) -> TaskData:
    """Reads, splits, (for ranking) pairs and tokenizes the data a config asks for.

    Args:
      cfg: the run's configuration.
      tokenizer: a Hugging Face fast tokenizer.
    Returns:
      train and validation `Examples` plus an `info` dict describing what was loaded.
    """
    d, task = cfg.data, cfg.task
    cache = Path(d.cache_dir) if d.cache_dir else default_cache_dir()
    data, source = _training_rows(cfg, cache)
    train, valid, valid_rows, split_desc = _splits(cfg, data, source, cache)
    _log_prompt(cfg, train, tokenizer)
    weights = row_weights(train, cfg, source)
    train_ex = encode(train, tokenizer, d.max_len, d.cache_dir, task)
    train_ex.row_weights = weights
    train_ex, extra, overlap = _extra_train(cfg, train_ex, valid, tokenizer, cache)
    train_ex, examples = rules.with_examples(cfg, train_ex, valid, tokenizer)
    valid_ex = encode(valid, tokenizer, d.max_len, d.cache_dir, task)
    if d.weighted_val_loss:
        valid_ex.row_weights = row_weights(valid, cfg, split_desc, "validation")
    info = {
        "source": source,
        "demo": not d.train_csv,
        "split": split_desc,
        "train_examples": len(train_ex),
        "extra_train_examples": extra,
        "extra_train_left_out": overlap,
        **({"rule_examples": vars(examples)} if examples else {}),
        "valid_examples": len(valid_ex),
        "dropped_rows": getattr(data, "dropped", 0),
        "token_cache_hit": train_ex.cache_hit and valid_ex.cache_hit,
        "unit": task.unit,
    }
    return TaskData(train_ex, valid_ex, info, valid_rows)


def validation_rows(cfg: Config) -> tuple[Comments | Pairs, str]:
    """The validation rows of a run of `cfg` (a finished run's recorded config): its
    --valid-csv, else the rows its split of the training file holds out, the same rows it
    validated on; and what they are."""
    d = cfg.data
    cache = Path(d.cache_dir) if d.cache_dir else default_cache_dir()
    if d.valid_csv:
        columns = number_columns(cfg, training=False)
        valid = read_task_file(d.valid_csv, cfg.task, cache_dir=cache, columns=columns)
        return valid, f"validation file {d.valid_csv}"
    data, source = _training_rows(cfg, cache)
    _, va, split_desc = _split_rows(data, cfg, source)
    return data.subset(va), f"{source}, {split_desc}"


def _splits(
    cfg: Config, data: Comments | Pairs, source: str, cache: Path
) -> tuple[Any, Any, np.ndarray | None, str]:
    """(train, validation, the validation rows' indices or None, how it was split): a
    --valid-csv, else a split of `data`; ranking's pairs built within each split, so no comment
    is in both; a validation set whose metric is undefined refused."""
    d, task, seed = cfg.data, cfg.task, cfg.train.seed
    valid_rows = None
    if d.valid_csv:
        columns = number_columns(cfg, training=False)
        train = data
        valid = read_task_file(
            d.valid_csv, task, cache_dir=cache, columns=columns, fmt=cfg.text_format
        )
        split_desc = f"validation file {d.valid_csv}"
    else:
        tr, valid_rows, split_desc = _split_rows(data, cfg, source)
        train, valid = data.subset(tr), data.subset(valid_rows)
    if task.main_outputs > 1:
        check_label_columns(train, task, source)
    if task.comments_per_example == 2:
        if isinstance(train, Comments):
            train = pairs_from_labels(train, int(len(train) * d.pairs_per_comment), seed)
        if isinstance(valid, Comments):
            valid = pairs_from_labels(valid, int(len(valid) * d.pairs_per_comment), seed + 1)
    why = task.undefined(valid.labels) if isinstance(valid, Comments) else None
    if why:
        raise DataError(
            f"validation set ({split_desc}, {len(valid)} {task.unit}): {why}, so "
            f"{task.monitor} is undefined and no best model could be chosen; give a --valid-csv "
            "with both classes, a larger --valid-fraction, or more rows"
        )
    return train, valid, valid_rows, split_desc


def _log_prompt(cfg: Config, train: Any, tokenizer: Any) -> None:
    """Logs the first prompt as the model reads it (--prompt-template)."""
    if isinstance(train, Comments) and train.form == PROMPT:
        chat = getattr(tokenizer, "chat_template", None)
        how = "laid out by the tokenizer's chat template" if chat else "no chat template"
        # the comment left as {comment}: a file-cached run's texts stay unread
        first = prompts.prompt_text(tokenizer, train.first[0], "{comment}")
        log.info("each row is one prompt (--prompt-template, %s); the first: %r", how, first[:400])


def _extra_train(
    cfg: Config, train_ex: Examples, valid: Any, tokenizer: Any, cache: Path
) -> tuple[Examples, int, int]:
    """(training examples with --extra-train's rows appended, how many, how many left out
    for sharing a text with a validation row)."""
    d, task = cfg.data, cfg.task
    if not d.extra_train:
        return train_ex, 0, 0
    more = read_task_file(
        d.extra_train,
        task,
        cache_dir=cache,
        columns=aux_columns(task, False),
        fmt=cfg.text_format,
    )
    more, overlap = without_validation_texts(more, valid, f"--extra-train {d.extra_train}")
    log.info(
        "--extra-train %s: %d more training %s, each of weight %g; validation unchanged%s",
        d.extra_train,
        len(more),
        task.unit,
        d.extra_weight,
        f" ({overlap} that share a text with a validation row left out)" if overlap else "",
    )
    more_ex = encode(more, tokenizer, d.max_len, d.cache_dir, task)
    return train_ex.concat(more_ex, train_ex.row_weights, d.extra_weight), len(more), overlap


def _training_rows(cfg: Config, cache: Path) -> tuple[Comments | Pairs, str]:
    """The rows the run learns from before any split (the --train-csv file, or demo comments),
    cut to --max-rows and --subsample, and a description of where they came from."""
    d, task, seed = cfg.data, cfg.task, cfg.train.seed
    if d.train_csv:
        path = SAMPLE_CSV if d.train_csv == "sample" else d.train_csv
        data = read_task_file(
            path, task, d.fold_column, cache, number_columns(cfg), cfg.text_format
        )
        source = str(path)
    else:
        data = templates.prompted(demo_comments(d.demo_size, seed), cfg.text_format)
        source = f"built-in demo data ({d.demo_size} generated comments)"
        asked = [f"--aux-columns {c}" for c in task.aux_columns]
        asked += [f"--weight-column {d.weight_column}"] if d.weight_column else []
        if asked:
            raise DataError(
                f"{', '.join(asked)}: the {source} has no such column; give a --train-csv"
            )
    if d.max_rows and len(data) > d.max_rows:
        data = data.subset(np.arange(d.max_rows))
    if d.subsample and len(data) > d.subsample:
        data = data.subset(subsample(data, d.subsample, seed, task.label_columns))
        source += f" (seeded sample of {d.subsample} rows, stratified)"
    elif d.subsample:
        log.warning(
            "--subsample %d: %s has %d rows, no more than that: training on all of them",
            d.subsample,
            source,
            len(data),
        )
    return data, source


def _split_rows(data: Comments | Pairs, cfg: Config, source: str) -> tuple[Any, Any, str]:
    """(train rows, validation rows, a description) of a file without --valid-csv: the file's
    own folds (--fold-column), fold k of --n-folds, or a held-out fraction."""
    d, seed = cfg.data, cfg.train.seed
    if d.holdout_rules:
        return rules.holdout_split(data, d.holdout_rules, seed, source)
    if d.fold_column:
        assert data.folds is not None
        ids = np.unique(data.folds)
        if ids.size < 2:
            raise DataError(
                f"--fold-column {d.fold_column}: every row of {source} is in fold {ids[0]}; "
                "k-fold needs at least two folds"
            )
        if d.fold not in ids:
            raise DataError(
                f"--fold {d.fold}: no row of {source} has {d.fold_column} = {d.fold}; its folds "
                f"are {', '.join(map(str, ids))}"
            )
        tr, va = np.flatnonzero(data.folds != d.fold), np.flatnonzero(data.folds == d.fold)
        return tr, va, f"fold {d.fold} of the file's {d.fold_column} ({ids.size} folds)"
    tr, va = split(data, d.valid_fraction, seed, d.n_folds, d.fold, cfg.task.label_columns)
    if va.size == 0 or tr.size == 0:
        raise DataError(
            f"{source}: {len(data)} rows are too few to split into train and validation; "
            "give more rows or a --valid-csv"
        )
    how = "by shared comments" if isinstance(data, Pairs) else "stratified"
    if d.n_folds:
        return tr, va, f"fold {d.fold} of {d.n_folds} ({how}, seed {seed})"
    return tr, va, f"held-out {d.valid_fraction:.0%} ({how}, seed {seed})"
