"""Reading the Jigsaw files into `Comments` and `Pairs`: which kind a file is (from its header),
its comment, label, sub-label, identity, language and fold columns, each value checked, rows
read as a stream (framework-free)."""

from __future__ import annotations

import datetime as dt
import logging
import math
import os
import sys
from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from jaxtpu.core.data.filekinds import BY_NAME, kind_of
from jaxtpu.core.data.records import (
    IDENTITIES,
    LANG_COLUMN,
    RULE_EXAMPLES,
    RULE_ID,
    RULE_LABEL,
    SUBLABELS,
    TEXT_COLUMNS,
    Comments,
    Groups,
    NumberColumn,
    Pairs,
)
from jaxtpu.core.data.tables import Structured, Table, open_table
from jaxtpu.core.data.templates import (
    PromptTemplate,
    RuleTemplate,
    normalize_text,
    prompted,
    template_of,
)
from jaxtpu.core.errors import DataError
from jaxtpu.core.tasks import LABEL_COLUMNS
from jaxtpu.core.textformat import PLAIN, TextFormat

log = logging.getLogger(__name__)


def _by_rule(header: list[str]) -> bool:
    """Whether a file of columns `header` asks about a rule in each row (its kind's
    `by_rule`: the Agile Community Rules files)."""
    kind = kind_of(header)
    return kind is not None and kind.by_rule


def columns(path: str | os.PathLike) -> list[str]:
    """The header of an input file (validated like any input file)."""
    return open_table(path).header


def _one_column(path: Any, header: list[str], names: Sequence[str], what: str) -> str:
    """The one column of `names` the file has (a file with two of them is ambiguous)."""
    found = [c for c in names if c in header]
    if len(found) > 1:
        raise DataError(
            f"{path}: has both {' and '.join(found)} columns; which is the {what} is ambiguous, "
            "keep one"
        )
    return found[0]


def missing_columns_error(path: Any, header: list[str], expected: str) -> DataError:
    return DataError(
        f"{path}: missing columns; found: {', '.join(header) or '(none)'}; expected: {expected}"
    )


def _parse_label(path: Any, where: str, column: str, value: str | None, blank_ok: bool) -> float:
    value = (value or "").strip()
    if not value:
        if blank_ok:
            return float("nan")
        raise DataError(f"{path}: {where}: {column} is blank, expected a number in [0, 1]")
    try:
        x = float(value)
    except ValueError:
        raise DataError(
            f"{path}: {where}: {column}={value!r} is not a number, expected a value in [0, 1]"
        ) from None
    if not 0.0 <= x <= 1.0:  # also rejects nan
        raise DataError(f"{path}: {where}: {column}={value} is outside [0, 1]")
    return x


def _check_number_columns(table: Table, columns: Mapping[str, NumberColumn]) -> None:
    for name, rule in columns.items():
        if name not in table.header and rule.required:
            raise DataError(
                f"{rule.flag} {name}: {table.path} has no such column; found: "
                f"{', '.join(table.header)}"
            )


def _parse_number(path: Any, where: str, column: str, value: Any, rule: NumberColumn) -> float:
    """A value of a `NumberColumn`: NaN for a blank where allowed, else a number in range."""
    text = (value or "").strip() if isinstance(value, str) or value is None else str(value)
    within = f"[{_num(rule.lo)}, {_num(rule.hi)}]" if math.isfinite(rule.hi) else f">= {rule.lo:g}"
    if not text:
        if rule.blank_ok:
            return math.nan
        raise DataError(
            f"{path}: {where}: {column} ({rule.flag}) is blank, expected a number {within}"
        )
    try:
        x = parse_time(text) if rule.time else float(text)
    except ValueError:
        what = "an ISO 8601 time (2026-11-05T14:03:00) or a number" if rule.time else within
        raise DataError(
            f"{path}: {where}: {column}={text!r} ({rule.flag}) is not "
            f"{'a number, expected ' if not rule.time else ''}{what}"
        ) from None
    if not rule.lo <= x <= rule.hi:  # also rejects nan
        bad = f"outside {within}" if math.isfinite(rule.hi) else f"not {within}"
        raise DataError(f"{path}: {where}: {column}={text} ({rule.flag}) is {bad}")
    return x


def parse_time(text: str) -> float:
    """An ISO 8601 time (UTC unless it says) or a number, as seconds since the epoch.

    Raises:
      ValueError: neither.
    """
    try:
        return float(text)
    except ValueError:
        when = dt.datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _num(x: float) -> str:
    return f"{x:g}"


def _read_numbers(
    path: Any, where: str, row: dict[str, Any], columns: Mapping[str, NumberColumn], out: array
) -> None:
    out.extend(_parse_number(path, where, c, row.get(c), rule) for c, rule in columns.items())


def _number_arrays(columns: Mapping[str, NumberColumn], values: array, n: int) -> dict:
    """Each column's values (collected as float64, in `array('d')`) in its own dtype."""
    table = _numpy(values, np.float64, (n, len(columns)))
    return {c: table[:, j].astype(rule.dtype) for j, (c, rule) in enumerate(columns.items())}


def _check_fold_column(table: Table, column: str) -> None:
    if column and column not in table.header:
        raise DataError(
            f"--fold-column {column}: {table.path} has no such column; found: "
            f"{', '.join(table.header)}"
        )


def _fold_id(path: Any, where: str, row: dict[str, str], column: str) -> int:
    value = (row.get(column) or "").strip()
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not number.is_integer():
        raise DataError(f"{path}: {where}: {column}={value!r} is not a fold number")
    return int(number)


def _text(row: dict[str, str], column: str, where: str = "", path: Any = "") -> str:
    value = row.get(column)
    if isinstance(value, Structured):
        raise DataError(
            f"{path}: {where}: {column} holds a JSON {'list' if value[:1] == '[' else 'object'}"
            ", not text; give the comment itself as a string"
        )
    return normalize_text(value) if isinstance(value, str) else ""


def _text_and_id(path: Any, header: list[str], labelled: bool) -> tuple[str, str]:
    """The (text, id) columns of a classification file (`labelled`) or of any file to score."""
    kind = kind_of(header)
    ok = ("classification",) if labelled else ("classification", "score", "unlabelled")
    if kind is None or kind.name not in ok:
        expected = "comment_text, toxic (or target)" + (
            "" if labelled else " (or comment_text or content alone, or comment_id, text)"
        )
        raise missing_columns_error(path, header, expected)
    if kind.severity:
        return "text", "comment_id"
    return _one_column(path, header, TEXT_COLUMNS, "comment text"), "id"


def comments_to_score(
    path: str | os.PathLike, chunk: int, fmt: TextFormat = PLAIN
) -> Iterator[Comments]:
    """The comments of a file to score, `chunk` rows at a time, as a stream (`predict` on
    millions of rows): each an unlabelled `Comments` of its rows, empty comments kept (every id
    gets a score) and counted in `dropped`; `ids` empty when the file has no id column. A
    rules file's rows are read in the run's text format `fmt` (text pairs of its
    --rule-template and the body, or prompts; by default the rule alone, then the body);
    with a --prompt-template, every row is its prompt."""
    table = open_table(path)
    if _by_rule(table.header):
        whole = read_rules(path, False, table=table, template=template_of(fmt))
        for start in range(0, len(whole), chunk):
            part = whole.subset(np.arange(start, min(start + chunk, len(whole))))
            part.dropped = sum(not t for t in part.texts)
            yield part
        return
    text_col, id_col = _text_and_id(path, table.header, labelled=False)
    with_ids = id_col in table.header
    texts: list[str] = []
    ids: list[str] = []
    empty = 0
    for where, row in table.rows():
        text = _text(row, text_col, where, path)
        empty += not text
        texts.append(text)
        if with_ids:
            ids.append((row.get(id_col) or "").strip())
        if len(texts) == chunk:
            yield prompted(Comments(str(path), texts, None, ids=ids, dropped=empty), fmt)
            texts, ids, empty = [], [], 0
    if texts:
        yield prompted(Comments(str(path), texts, None, ids=ids, dropped=empty), fmt)


def read_comments(
    path: str | os.PathLike,
    labelled: bool = True,
    fold_column: str = "",
    table: Table | None = None,
    columns: Mapping[str, NumberColumn] | None = None,
) -> Comments:
    """Reads a Kaggle classification file (CSV, Parquet or JSON Lines, `jaxtpu.core.data.tables`):
    the comment (`comment_text`, or the Multilingual test file's `content`), the label (`toxic`,
    or Unintended Bias's `target`, a fraction kept as a soft target), optional `id`, sub-labels,
    identity columns (`IDENTITIES`) and `lang`.

    With `labelled=False` also accepts files to score: the comment (+ optional `id`) or the
    Rate Severity `comments_to_score.csv` (`comment_id`, `text`); there, empty comments are kept
    (every id must get a score), counted in `dropped` and warned about.
    Otherwise rows whose comment is empty after whitespace normalisation are dropped and counted.
    `columns`: further numeric columns a run asks for (`NumberColumn`), into `Comments.columns`.
    The rows are read as a stream: numbers go straight into compact arrays, and no row outlives
    its turn.
    """
    table = table or open_table(path)  # a caller that read the header already passes it
    header = table.header
    text_col, id_col = _text_and_id(path, header, labelled)
    label_col = _one_column(path, header, LABEL_COLUMNS, "label") if labelled else ""
    subs = [(SUBLABELS.index(c), c) for c in SUBLABELS if c in header] if labelled else []
    idents = [c for c in IDENTITIES if c in header] if labelled else []
    with_lang = labelled and LANG_COLUMN in header
    columns = columns or {}
    _check_fold_column(table, fold_column)
    _check_number_columns(table, columns)
    numbers = array("d")
    texts: list[str] = []
    ids: list[str] = []
    labels, sublabels, identity_values = array("f"), array("f"), array("f")
    langs: list[str] = []
    folds = array("q")
    rows = dropped = 0
    for where, row in table.rows():
        rows += 1
        text = _text(row, text_col, where, path)
        if not text:
            dropped += 1
            if labelled:
                continue
        texts.append(text)
        ids.append((row.get(id_col) or "").strip())
        if fold_column:
            folds.append(_fold_id(path, where, row, fold_column))
        _read_numbers(path, where, row, columns, numbers)
        if labelled:
            labels.append(_parse_label(path, where, label_col, row.get(label_col), blank_ok=False))
            sublabels.extend(_sublabels(path, where, row, subs))
            identity_values.extend(
                _parse_label(path, where, c, row.get(c), blank_ok=True) for c in idents
            )
            if with_lang:
                langs.append(_lang(path, where, row))
    if dropped == rows:
        raise DataError(f"{path}: all {rows} rows dropped ({text_col} empty)")
    if dropped:
        what = "dropped" if labelled else "scoring as empty text"
        log.warning("%s: %s %d of %d rows with an empty %s", path, what, dropped, rows, text_col)
    n = len(texts)
    return Comments(
        str(path),
        texts,
        _numpy(labels, np.float32) if labelled else None,
        _numpy(sublabels, np.float32, (n, len(SUBLABELS))) if labelled else None,
        ids,
        dropped,
        _groups(
            path, idents, _numpy(identity_values, np.float32, (n, len(idents))), with_lang and langs
        ),
        _numpy(folds, np.int64) if fold_column else None,
        columns=_number_arrays(columns, numbers, n),
    )


def _sublabels(path: Any, where: str, row: Mapping[str, Any], subs: list) -> list[float]:
    """A row's five sub-labels in `SUBLABELS` order (NaN: blank, or a column the file lacks)."""
    out = [math.nan] * len(SUBLABELS)
    for i, c in subs:
        out[i] = _parse_label(path, where, c, row.get(c), blank_ok=True)
    return out


def _lang(path: Any, where: str, row: Mapping[str, Any]) -> str:
    lang = (row.get(LANG_COLUMN) or "").strip()
    if not lang:
        raise DataError(f"{path}: {where}: lang is blank, expected a language")
    return sys.intern(lang)


def _numpy(values: array, dtype: Any, shape: tuple[int, ...] = (-1,)) -> np.ndarray:
    """The numbers an `array.array` collected, as a numpy array of its own."""
    return np.frombuffer(values, dtype).reshape(shape).copy()


def _groups(path: Any, names: list[str], values: np.ndarray, langs: list[str] | bool) -> Groups:
    """The identity columns (each must have a known value somewhere) and the languages (False:
    the file has no lang column)."""
    identities = {}
    for j, name in enumerate(names):
        if np.isnan(values[:, j]).all():
            raise DataError(
                f"{path}: identity column {name} is blank in all {values.shape[0]} rows; give "
                "its values or drop the column"
            )
        identities[name] = values[:, j]
    return Groups(identities, None if langs is False else np.asarray(langs))


def read_pairs(
    path: str | os.PathLike,
    fold_column: str = "",
    table: Table | None = None,
    columns: Mapping[str, NumberColumn] | None = None,
) -> Pairs:
    """Reads a Rate Severity pairs file (`less_toxic`, `more_toxic`, optional `worker`, and
    the numeric `columns` a run asks for)."""
    table = table or open_table(path)
    if kind_of(table.header) is not BY_NAME["pairs"]:
        raise missing_columns_error(path, table.header, "less_toxic, more_toxic")
    if LANG_COLUMN in table.header:
        raise DataError(
            f"{path}: a lang column goes with a classification file (per-language AUC); a "
            "pairs file is scored by agreement over all its pairs: drop the column"
        )
    columns = columns or {}
    _check_fold_column(table, fold_column)
    _check_number_columns(table, columns)
    less, more, folds, numbers = [], [], array("q"), array("d")
    rows = dropped = 0
    for where, row in table.rows():
        rows += 1
        a, b = _text(row, "less_toxic", where, path), _text(row, "more_toxic", where, path)
        if not a or not b:
            dropped += 1
            continue
        less.append(a)
        more.append(b)
        if fold_column:
            folds.append(_fold_id(path, where, row, fold_column))
        _read_numbers(path, where, row, columns, numbers)
    if not less:
        raise DataError(f"{path}: all {rows} rows dropped (less_toxic or more_toxic empty)")
    if dropped:
        log.warning("%s: dropped %d of %d pairs with an empty comment", path, dropped, rows)
    folds_or_none = _numpy(folds, np.int64) if fold_column else None
    numbers_of = _number_arrays(columns, numbers, len(less))
    return Pairs(str(path), less, more, dropped, folds_or_none, columns=numbers_of)


def _rule(path: Any, where: str, row: Mapping[str, Any]) -> str:
    rule = _text(row, "rule", where, path)
    if not rule:
        raise DataError(f"{path}: {where}: rule is empty; every row asks about one rule")
    return sys.intern(rule)


def _violation(path: Any, where: str, value: Any) -> float:
    text = (value or "").strip() if isinstance(value, str) or value is None else str(value)
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if x not in (0.0, 1.0):
        raise DataError(f"{path}: {where}: {RULE_LABEL}={text!r} is not 0 or 1")
    return x


def read_rules(
    path: str | os.PathLike,
    labelled: bool = True,
    fold_column: str = "",
    table: Table | None = None,
    columns: Mapping[str, NumberColumn] | None = None,
    template: RuleTemplate | PromptTemplate | None = None,
) -> Comments:
    """Reads an Agile Community Rules file (`train.csv`, or with `labelled=False` `test.csv`):
    each row a text pair, the first text the `template` over its columns (`--rule-template`,
    default the rule alone) and the second the comment (`body`), its label `rule_violation`
    (0 or 1), its id `row_id` and its rule (`Groups.rule`, for the per-rule AUC). Rows with
    an empty body are dropped when labelled (kept and counted when scored, as
    `read_comments`); an empty rule is refused."""
    table = table or open_table(path)
    header = table.header
    if not _by_rule(header):
        raise missing_columns_error(path, header, "body, rule (an Agile Community Rules file)")
    if labelled and RULE_LABEL not in header:
        raise missing_columns_error(path, header, f"body, rule, {RULE_LABEL} (labelled rows)")
    template = template or RuleTemplate()
    template.check(path, header)
    columns = columns or {}
    _check_fold_column(table, fold_column)
    _check_number_columns(table, columns)
    texts, first, ids, rules = [], [], [], []
    labels, folds, numbers = array("f"), array("q"), array("d")
    rows = dropped = 0
    for where, row in table.rows():
        rows += 1
        text = _text(row, "body", where, path)
        rule = _rule(path, where, row)
        if not text:
            dropped += 1
            if labelled:
                continue
        texts.append(text)
        first.append(template.render(row))
        rules.append(rule)
        ids.append(str(row.get(RULE_ID) or "").strip())
        if labelled:
            labels.append(_violation(path, where, row.get(RULE_LABEL)))
        if fold_column:
            folds.append(_fold_id(path, where, row, fold_column))
        _read_numbers(path, where, row, columns, numbers)
    if dropped == rows:
        raise DataError(f"{path}: all {rows} rows dropped (body empty)")
    if dropped:
        what = "dropped" if labelled else "scoring as empty text"
        log.warning("%s: %s %d of %d rows with an empty body", path, what, dropped, rows)
    _warn_duplicate_ids(path, ids)
    n = len(texts)
    return Comments(
        str(path),
        texts,
        _numpy(labels, np.float32) if labelled else None,
        ids=ids,
        dropped=dropped,
        groups=Groups(rule=np.asarray(rules, dtype=object)),
        folds=_numpy(folds, np.int64) if fold_column else None,
        columns=_number_arrays(columns, numbers, n),
        first=first,
        form=template.form,
    )


def _warn_duplicate_ids(path: Any, ids: list[str]) -> None:
    """One line when a rules file's row_ids repeat: a submission with repeated ids is one
    Kaggle rejects, and a training file's usually holds a row twice."""
    seen: set[str] = set()
    repeated = [i for i in ids if i and (i in seen or seen.add(i))]
    if repeated:
        log.warning(
            "%s: %d rows repeat a %s, the first %r: each row's id should be its own (a "
            "submission with repeated ids is refused by Kaggle)",
            path,
            len(repeated),
            RULE_ID,
            repeated[0],
        )


def rule_examples(path: str | os.PathLike) -> list[tuple[str, str, float, dict[str, Any]]]:
    """The examples of every row of a rules file, flattened: (rule, normalised example text,
    its label: 1 for `positive_example_*`, 0 for `negative_example_*`, the row it came from),
    empty examples skipped. Refused when the file lacks an example column."""
    table = open_table(path)
    if not _by_rule(table.header):
        raise missing_columns_error(
            path, table.header, "body, rule (an Agile Community Rules file)"
        )
    missing = [c for c in RULE_EXAMPLES if c not in table.header]
    if missing:
        raise DataError(
            f"--rule-examples {path}: missing example column(s) {', '.join(missing)}; found: "
            f"{', '.join(table.header)}"
        )
    out = []
    for where, row in table.rows():
        rule = _rule(path, where, row)
        for column, label in RULE_EXAMPLES.items():
            text = _text(row, column, where, path)
            if text:
                out.append((rule, text, label, row))
    if not out:
        raise DataError(f"--rule-examples {path}: no example text in any of its rows")
    return out


READERS = {"pairs": read_pairs, "classification": read_comments, "rules": read_rules}
