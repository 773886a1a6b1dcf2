"""Jigsaw CSVs, ranking pairs, splits, tokenized examples and deterministic batches.

Framework-free (numpy only): both `jaxtpu` and `torchxla_ref` take their batches from here, so
the two sides see exactly the same examples in the same order.

A batch is laid out as its task's `Task.batch_spec` says (`Examples.take` cuts one out); a
ranking example holds [0] the less toxic and [1] the more toxic comment. Which rows each batch
holds is `jaxtpu.core.data.buckets.Batcher`'s business.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import os
import sys
import zipfile
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np

from jaxtpu.core.data.buckets import real_lengths
from jaxtpu.core.data.tables import Table, open_table
from jaxtpu.core.data.tokens import cached_tokens, default_cache_dir, digest_texts
from jaxtpu.core.errors import DataError
from jaxtpu.core.files import atomic_write
from jaxtpu.core.flags.schema import Config
from jaxtpu.core.tasks import LABELS, Task, get_task

log = logging.getLogger(__name__)

SUBLABELS = LABELS[1:]  # ("severe_toxic", "obscene", "threat", "insult", "identity_hate")
# Severity weights for pairs built from labels (as in public Rate Severity solutions):
# toxic, then SUBLABELS in order.
SEVERITY_WEIGHTS = np.array([0.32, 1.5, 0.16, 1.5, 0.64, 1.5], np.float32)

# The default run's 2,000 real comments (`--train-csv sample`; source and licence beside it).
SAMPLE_CSV = Path(__file__).with_name("sample") / "jigsaw_sample.csv"

CLASSIFICATION_COLUMNS = ("comment_text", "toxic")
PAIRS_COLUMNS = ("less_toxic", "more_toxic")
SCORE_COLUMNS = ("comment_id", "text")
# The comment's column: `content` is the Multilingual competition's test.csv name for it.
TEXT_COLUMNS = ("comment_text", "content")
# The label: `toxic` (0/1, the Toxic Comment and Multilingual files) or `target` (the share of
# raters who found the comment toxic, Unintended Bias), trained on as a soft target.
LABEL_COLUMNS = ("toxic", "target")
# The identities of the Unintended Bias metric (the competition's own list), fractions of
# raters, blank where the comment was not annotated.
IDENTITIES = (
    "male", "female", "homosexual_gay_or_lesbian", "christian", "jewish", "muslim", "black",
    "white", "psychiatric_or_mental_illness",
)  # fmt: skip
LANG_COLUMN = "lang"  # the Multilingual competition's language of each comment


# --------------------------------------------------------------------------- containers


@dataclass
class Groups:
    """What a file says about each comment besides its labels, for the metrics that break
    the score down by it (never a model input): the Unintended Bias identities and the
    Multilingual language."""

    identities: dict[str, np.ndarray] = field(default_factory=dict)  # (N,) float32, NaN blank
    lang: np.ndarray | None = None  # (N,) str

    def __bool__(self) -> bool:
        return bool(self.identities) or self.lang is not None

    def describe(self) -> str:
        """'identities male, female; languages es, it' (those the file has)."""
        parts = []
        if self.identities:
            parts.append("identities " + ", ".join(self.identities))
        if self.lang is not None:
            parts.append("languages " + ", ".join(sorted(set(self.lang.tolist()))))
        return "; ".join(parts)

    def take(self, idx: np.ndarray) -> Groups:
        return Groups(
            {k: v[idx] for k, v in self.identities.items()},
            None if self.lang is None else self.lang[idx],
        )


class FileTexts(Sequence[str]):
    """Rows of a file's comments that are read from the file only when first needed: a run
    whose tokens are all in the cache never reads them (`read_task_file` with a cache). `load`
    gives every kept row's text; the subsets of one file share what it read."""

    def __init__(self, load: Callable[[], Sequence[str]], rows: np.ndarray) -> None:
        self.load, self.rows = load, rows

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        texts = self.load()
        if isinstance(i, slice):
            return [texts[r] for r in self.rows[i].tolist()]
        return texts[int(self.rows[i])]

    def __iter__(self) -> Iterator[str]:
        texts = self.load()
        return (texts[r] for r in self.rows.tolist())

    def take(self, idx: np.ndarray) -> FileTexts:
        return FileTexts(self.load, self.rows[idx])


def _take(texts: Sequence[str], idx: np.ndarray) -> Sequence[str]:
    if isinstance(texts, FileTexts):
        return texts.take(idx)
    return [texts[i] for i in idx]


@dataclass
class Comments:
    """Labelled (or, for scoring, unlabelled) comments from one file."""

    source: str
    texts: Sequence[str]  # a list, or `FileTexts` read when needed
    labels: np.ndarray | None  # (N,) float32 in [0, 1]
    sublabels: np.ndarray | None = None  # (N, 5) float32, NaN where blank
    ids: list[str] = field(default_factory=list)
    dropped: int = 0
    groups: Groups = field(default_factory=Groups)
    folds: np.ndarray | None = None  # (N,) int64: the file's --fold-column
    digests: np.ndarray | None = None  # (N, 16) uint8 `digest_texts`, made when first asked

    def __len__(self) -> int:
        return len(self.texts)

    def text_digests(self) -> np.ndarray:
        if self.digests is None:
            self.digests = digest_texts(self.texts)
        return self.digests

    def subset(self, idx: np.ndarray) -> Comments:
        return Comments(
            self.source,
            _take(self.texts, idx),
            None if self.labels is None else self.labels[idx],
            None if self.sublabels is None else self.sublabels[idx],
            [self.ids[i] for i in idx] if self.ids else [],
            groups=self.groups.take(idx),
            folds=None if self.folds is None else self.folds[idx],
            digests=None if self.digests is None else self.digests[idx],
        )

    def severity(self) -> np.ndarray:
        """Weighted sum of the six labels; rows with blank sub-labels use `toxic` alone."""
        assert self.labels is not None
        sev = self.labels * SEVERITY_WEIGHTS[0]
        if self.sublabels is not None:
            sub = self.sublabels
            complete = ~np.isnan(sub).any(axis=1)
            sev = sev + np.where(complete, np.nan_to_num(sub) @ SEVERITY_WEIGHTS[1:], 0.0)
        return sev.astype(np.float32)


@dataclass
class Pairs:
    """Ranking pairs: `more[i]` is more toxic than `less[i]`."""

    source: str
    less: Sequence[str]  # lists, or `FileTexts` read when needed
    more: Sequence[str]
    dropped: int = 0
    folds: np.ndarray | None = None  # (N,) int64: the file's --fold-column
    digests: np.ndarray | None = None  # (N, 2, 16) uint8: less, more; made when first asked

    def __len__(self) -> int:
        return len(self.less)

    def text_digests(self) -> np.ndarray:
        if self.digests is None:
            self.digests = np.stack([digest_texts(self.less), digest_texts(self.more)], 1)
        return self.digests

    def subset(self, idx: np.ndarray) -> Pairs:
        return Pairs(
            self.source,
            _take(self.less, idx),
            _take(self.more, idx),
            folds=None if self.folds is None else self.folds[idx],
            digests=None if self.digests is None else self.digests[idx],
        )


# --------------------------------------------------------------------------- CSV reading


def normalize_text(text: str) -> str:
    """Collapses all runs of whitespace (newlines, tabs) to one space."""
    return " ".join(text.split())


def columns(path: str | os.PathLike) -> list[str]:
    """The header of an input file (validated like any input file)."""
    return open_table(path).header


def file_kind(header: list[str]) -> str | None:
    """What a file is, read from its columns: 'pairs', 'score', 'classification',
    'unlabelled' (comments to score) or None."""
    cols = set(header)
    text = cols & set(TEXT_COLUMNS)
    if set(PAIRS_COLUMNS) <= cols:
        return "pairs"
    if text and cols & set(LABEL_COLUMNS):
        return "classification"
    if set(SCORE_COLUMNS) <= cols:
        return "score"
    if text:
        return "unlabelled"
    return None


def _one_column(path: Any, header: list[str], names: Sequence[str], what: str) -> str:
    """The one column of `names` the file has (a file with two of them is ambiguous)."""
    found = [c for c in names if c in header]
    if len(found) > 1:
        raise DataError(
            f"{path}: has both {' and '.join(found)} columns; which is the {what} is ambiguous, "
            "keep one"
        )
    return found[0]


def _missing_columns_error(path: Any, header: list[str], expected: str) -> DataError:
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


def _text(row: dict[str, str], column: str) -> str:
    value = row.get(column)
    return normalize_text(value) if isinstance(value, str) else ""


def _text_and_id(path: Any, header: list[str], labelled: bool) -> tuple[str, str]:
    """The (text, id) columns of a classification file (`labelled`) or of any file to score."""
    kind = file_kind(header)
    ok = ("classification",) if labelled else ("classification", "score", "unlabelled")
    if kind not in ok:
        expected = "comment_text, toxic (or target)" + (
            "" if labelled else " (or comment_text or content alone, or comment_id, text)"
        )
        raise _missing_columns_error(path, header, expected)
    if kind == "score":
        return "text", "comment_id"
    return _one_column(path, header, TEXT_COLUMNS, "comment text"), "id"


def comments_to_score(path: str | os.PathLike, chunk: int) -> Iterator[Comments]:
    """The comments of a file to score, `chunk` rows at a time, as a stream (`predict` on
    millions of rows): each an unlabelled `Comments` of its rows, empty comments kept (every id
    gets a score) and counted in `dropped`; `ids` empty when the file has no id column."""
    table = open_table(path)
    text_col, id_col = _text_and_id(path, table.header, labelled=False)
    with_ids = id_col in table.header
    texts: list[str] = []
    ids: list[str] = []
    empty = 0
    for _, row in table.rows():
        text = _text(row, text_col)
        empty += not text
        texts.append(text)
        if with_ids:
            ids.append((row.get(id_col) or "").strip())
        if len(texts) == chunk:
            yield Comments(str(path), texts, None, ids=ids, dropped=empty)
            texts, ids, empty = [], [], 0
    if texts:
        yield Comments(str(path), texts, None, ids=ids, dropped=empty)


def read_comments(
    path: str | os.PathLike, labelled: bool = True, fold_column: str = ""
) -> Comments:
    """Reads a Kaggle classification file (CSV, Parquet or JSON Lines, `jaxtpu.core.data.tables`):
    the comment (`comment_text`, or the Multilingual test file's `content`), the label (`toxic`,
    or Unintended Bias's `target`, a fraction kept as a soft target), optional `id`, sub-labels,
    identity columns (`IDENTITIES`) and `lang`.

    With `labelled=False` also accepts files to score: the comment (+ optional `id`) or the
    Rate Severity `comments_to_score.csv` (`comment_id`, `text`); there, empty comments are kept
    (every id must get a score), counted in `dropped` and warned about.
    Otherwise rows whose comment is empty after whitespace normalisation are dropped and counted.
    The rows are read as a stream: numbers go straight into compact arrays, and no row outlives
    its turn.
    """
    table = open_table(path)
    header = table.header
    text_col, id_col = _text_and_id(path, header, labelled)
    label_col = _one_column(path, header, LABEL_COLUMNS, "label") if labelled else ""
    subs = [(SUBLABELS.index(c), c) for c in SUBLABELS if c in header] if labelled else []
    idents = [c for c in IDENTITIES if c in header] if labelled else []
    with_lang = labelled and LANG_COLUMN in header
    _check_fold_column(table, fold_column)
    texts: list[str] = []
    ids: list[str] = []
    labels, sublabels, identity_values = array("f"), array("f"), array("f")
    langs: list[str] = []
    folds = array("q")
    rows = dropped = 0
    blank_subs = [math.nan] * len(SUBLABELS)
    for where, row in table.rows():
        rows += 1
        text = _text(row, text_col)
        if not text:
            dropped += 1
            if labelled:
                continue
        texts.append(text)
        ids.append((row.get(id_col) or "").strip())
        if fold_column:
            folds.append(_fold_id(path, where, row, fold_column))
        if not labelled:
            continue
        labels.append(_parse_label(path, where, label_col, row.get(label_col), blank_ok=False))
        sub = list(blank_subs)
        for i, c in subs:
            sub[i] = _parse_label(path, where, c, row.get(c), blank_ok=True)
        sublabels.extend(sub)
        identity_values.extend(
            _parse_label(path, where, c, row.get(c), blank_ok=True) for c in idents
        )
        if with_lang:
            lang = (row.get(LANG_COLUMN) or "").strip()
            if not lang:
                raise DataError(f"{path}: {where}: lang is blank, expected a language")
            langs.append(sys.intern(lang))
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
        ),  # fmt: skip
        _numpy(folds, np.int64) if fold_column else None,
    )


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


def read_pairs(path: str | os.PathLike, fold_column: str = "") -> Pairs:
    """Reads a Rate Severity pairs file (`less_toxic`, `more_toxic`, optional `worker`)."""
    table = open_table(path)
    if file_kind(table.header) != "pairs":
        raise _missing_columns_error(path, table.header, "less_toxic, more_toxic")
    if LANG_COLUMN in table.header:
        raise DataError(
            f"{path}: a lang column goes with a classification file (per-language AUC); a "
            "pairs file is scored by agreement over all its pairs: drop the column"
        )
    _check_fold_column(table, fold_column)
    less, more, folds = [], [], array("q")
    rows = dropped = 0
    for where, row in table.rows():
        rows += 1
        a, b = _text(row, "less_toxic"), _text(row, "more_toxic")
        if not a or not b:
            dropped += 1
            continue
        less.append(a)
        more.append(b)
        if fold_column:
            folds.append(_fold_id(path, where, row, fold_column))
    if not less:
        raise DataError(f"{path}: all {rows} rows dropped (less_toxic or more_toxic empty)")
    if dropped:
        log.warning("%s: dropped %d of %d pairs with an empty comment", path, dropped, rows)
    return Pairs(str(path), less, more, dropped, _numpy(folds, np.int64) if fold_column else None)


_EXPECTED = {
    "pairs": "less_toxic, more_toxic (pairs)",
    "classification": "comment_text, toxic or target (labels)",
}
_READERS = {"pairs": read_pairs, "classification": read_comments}


def read_task_file(
    path: str | os.PathLike, task: Task, fold_column: str = "", cache_dir: Any = None
) -> Comments | Pairs:
    """Reads a training/validation file of one of the kinds the task reads (`Task.reads`), with
    the fold ids of `fold_column` when one is asked for; with a `cache_dir`, through the file
    cache (`_read_cached`)."""
    header = columns(path)
    kind = file_kind(header)
    if kind not in task.reads:
        raise _missing_columns_error(path, header, " or ".join(_EXPECTED[k] for k in task.reads))
    if cache_dir is None:
        data = _READERS[kind](path, fold_column=fold_column)
    else:
        data = _read_cached(kind, Path(path), fold_column, Path(cache_dir))
    if isinstance(data, Comments) and data.groups and task.comments_per_example == 2:
        log.warning(
            "%s: identity/lang columns not used: the %s task is scored by agreement over pairs",
            path, task.name,
        )  # fmt: skip
        data.groups = Groups()
    return data


# --------------------------------------------------------------------------- the file cache

TABLE_VERSION = 1  # bump when what a reader returns for a file changes


def _read_cached(kind: str, path: Path, fold_column: str, cache_dir: Path) -> Comments | Pairs:
    """A file as its reader reads it, from the cache when this content was read before.

    The entry (`<key>.table.npz` beside the token entries) holds everything the reader returns
    but the texts: labels, sub-labels, identities, languages, ids, folds and each text's
    digest, keyed by a hash of the file's bytes (a changed file is read again). A run whose
    token entries exist (keyed by the same digests) then never reads the texts; `FileTexts`
    reads them from the file if it does need them (a new --max-len, another split).
    """
    h = hashlib.sha256(f"{TABLE_VERSION}|{kind}|{fold_column}|".encode())
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    entry = cache_dir / f"{h.hexdigest()[:32]}.table.npz"
    if entry.exists():
        try:
            with np.load(entry, allow_pickle=False) as z:
                data = _from_arrays(kind, path, fold_column, dict(z))
            log.info("%s: read from the file cache (%d rows)", path, len(data))
            if data.dropped:
                log.warning("%s: dropped %d rows with an empty comment", path, data.dropped)
            return data
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            entry.unlink(missing_ok=True)
            log.warning("file cache entry %s is damaged (%s); reading %s again", entry,
                        type(e).__name__, path)  # fmt: skip
    data = _READERS[kind](path, fold_column=fold_column)
    data.text_digests()
    try:
        with atomic_write(entry, "wb") as f:
            np.savez(f, **_to_arrays(data))
    except OSError as e:
        log.warning("could not write the file cache in %s (%s); continuing without it",
                    cache_dir, e)  # fmt: skip
    return data


def _to_arrays(data: Comments | Pairs) -> dict[str, np.ndarray]:
    common = {
        "n": np.asarray(len(data)),
        "dropped": np.asarray(data.dropped),
        "digests": data.text_digests(),
        "folds": np.zeros(0, np.int64) if data.folds is None else data.folds,
        "has_folds": np.asarray(data.folds is not None),
    }
    if isinstance(data, Pairs):
        return common
    assert data.labels is not None and data.sublabels is not None
    g = data.groups
    names = list(g.identities)
    return {
        **common,
        "labels": data.labels,
        "sublabels": data.sublabels,
        "ids": np.asarray(data.ids, dtype=str),
        "identity_names": np.asarray(names, dtype=str),
        "identities": np.stack([g.identities[k] for k in names], 1) if names
        else np.zeros((len(data), 0), np.float32),
        "lang": np.zeros(0, str) if g.lang is None else g.lang.astype(str),
        "has_lang": np.asarray(g.lang is not None),
    }  # fmt: skip


def _from_arrays(kind: str, path: Path, fold_column: str, z: dict[str, np.ndarray]) -> Any:
    n = int(z["n"])
    folds = z["folds"] if bool(z["has_folds"]) else None

    @functools.cache
    def reread() -> Any:
        """The file read again for its texts, checked to be the rows the entry describes."""
        log.info("%s: reading its comments (their tokens are not in the cache)", path)
        data = _READERS[kind](path, fold_column=fold_column)
        if len(data) != n or not np.array_equal(data.text_digests(), z["digests"]):
            raise DataError(f"{path}: changed while this run was reading it; start the run again")
        return data

    rows = np.arange(n)
    if kind == "pairs":
        less = FileTexts(lambda: reread().less, rows)
        more = FileTexts(lambda: reread().more, rows)
        return Pairs(str(path), less, more, int(z["dropped"]), folds, z["digests"])
    names = z["identity_names"].tolist()
    identities = {k: z["identities"][:, j] for j, k in enumerate(names)}
    groups = Groups(identities, z["lang"] if bool(z["has_lang"]) else None)
    texts = FileTexts(lambda: reread().texts, rows)
    return Comments(str(path), texts, z["labels"], z["sublabels"], z["ids"].tolist(),
                    int(z["dropped"]), groups, folds, z["digests"])  # fmt: skip


# --------------------------------------------------------------------------- demo data

_NEUTRAL = (
    "thanks for the edit on the article",
    "i added a citation to the history section",
    "please see the talk page before reverting",
    "the infobox needs a better image",
    "welcome to wikipedia and happy editing",
    "this source looks reliable to me",
    "can you check the dates in the timeline",
    "i moved the paragraph to the right section",
    "good point, i agree with the merge",
    "the map is out of date after the election",
)
_TOXIC = ("idiot", "stupid", "moron", "loser", "pathetic", "dumb")
_OBSCENE = ("crap", "damn", "sucks")
_THREAT = ("i will hurt you", "watch your back")


def demo_comments(n: int, seed: int = 0) -> Comments:
    """A built-in dataset in the Jigsaw schema with an easy, learnable signal.

    About 30 % of comments insult the reader; their sub-labels follow the words used, so
    severity (for ranking pairs) is learnable too.
    """
    rng = np.random.default_rng(seed)
    texts, labels, subs = [], [], []
    for _ in range(n):
        base = _NEUTRAL[rng.integers(len(_NEUTRAL))]
        toxic = rng.random() < 0.3
        sub = [0.0] * len(SUBLABELS)
        if toxic:
            words = [f"you are a {_TOXIC[rng.integers(len(_TOXIC))]}"]
            sub[SUBLABELS.index("insult")] = 1.0
            if rng.random() < 0.4:
                words.append(_OBSCENE[rng.integers(len(_OBSCENE))])
                sub[SUBLABELS.index("obscene")] = 1.0
            if rng.random() < 0.2:
                words.append(_THREAT[rng.integers(len(_THREAT))])
                sub[SUBLABELS.index("threat")] = 1.0
                sub[SUBLABELS.index("severe_toxic")] = 1.0
            text = f"{base}, {' and '.join(words)}"
        else:
            text = base
        texts.append(text)
        labels.append(float(toxic))
        subs.append(sub)
    return Comments("demo", texts, np.asarray(labels, np.float32), np.asarray(subs, np.float32))


# --------------------------------------------------------------------------- pairs, splits


def pairs_from_labels(comments: Comments, n_pairs: int, seed: int) -> Pairs:
    """Samples `n_pairs` pairs of comments whose severities differ, ordered less -> more."""
    sev = comments.severity()
    if np.unique(sev).size < 2:
        raise DataError(
            f"{comments.source}: all comments have the same severity; cannot build ranking pairs"
        )
    rng = np.random.default_rng([seed, 7])
    less_idx, more_idx = [], []
    while len(less_idx) < n_pairs:
        i = rng.integers(len(sev), size=2 * n_pairs)
        j = rng.integers(len(sev), size=2 * n_pairs)
        keep = sev[i] != sev[j]
        i, j = i[keep], j[keep]
        swap = sev[i] > sev[j]
        less_idx.extend(np.where(swap, j, i).tolist())
        more_idx.extend(np.where(swap, i, j).tolist())
    less, more = np.asarray(less_idx[:n_pairs]), np.asarray(more_idx[:n_pairs])
    d = comments.text_digests()
    return Pairs(
        comments.source,
        _take(comments.texts, less),
        _take(comments.texts, more),
        digests=np.stack([d[less], d[more]], 1),
    )


def _strata(data: Comments | Pairs, label_columns: Sequence[str] = ("toxic",)) -> np.ndarray:
    """The stratum of each example: the pattern of its labels (each >= 0.5 or not; blank
    counts as not), over the task's label columns; one stratum for pairs."""
    if isinstance(data, Comments) and data.labels is not None:
        bits = np.nan_to_num(labels_of(data, tuple(label_columns))) >= 0.5
        return (bits * (1 << np.arange(bits.shape[1]))).sum(1).astype(np.int64)
    return np.zeros(len(data), np.int64)


def fold_assignment(
    data: Comments | Pairs, n_folds: int, seed: int, label_columns: Sequence[str] = ("toxic",)
) -> np.ndarray:
    """Stratified (over `label_columns`), seeded fold id (0..n_folds-1) of every example: by
    label for one label column, by iterative stratification for several (`_iterative_folds`)."""
    if len(label_columns) > 1 and isinstance(data, Comments) and data.labels is not None:
        return _iterative_folds(labels_of(data, tuple(label_columns)), n_folds, seed)
    strata = _strata(data, label_columns)
    rng = np.random.default_rng([seed, 11])
    folds = np.empty(len(strata), np.int64)
    offset = 0
    for s in np.unique(strata):
        idx = rng.permutation(np.flatnonzero(strata == s))
        folds[idx] = (np.arange(idx.size) + offset) % n_folds
        offset += idx.size
    return folds


def _iterative_folds(labels: np.ndarray, n_folds: int, seed: int) -> np.ndarray:
    """Folds balanced over several labels at once (Sechidis et al., 2011, "On the
    stratification of multi-label data"): labels are taken rarest first; each example
    positive for it and not yet placed goes to the fold that still wants the most of that
    label (ties: the most room left, then the lowest fold), and its labels count against that
    fold's wants. Examples positive for no label fill the folds with the most room. Blank
    labels count as negative."""
    rng = np.random.default_rng([seed, 11])
    y = np.nan_to_num(labels) >= 0.5
    n = y.shape[0]
    wants = np.tile(y.sum(0) / n_folds, (n_folds, 1)).astype(np.float64)
    room = np.full(n_folds, n / n_folds)
    folds = np.full(n, -1, np.int64)
    for j in np.argsort(y.sum(0), kind="stable"):
        for i in rng.permutation(np.flatnonzero(y[:, j] & (folds < 0))):
            f = int(np.lexsort((-room, -wants[:, j]))[0])
            folds[i] = f
            wants[f] -= y[i]
            room[f] -= 1
    for i in rng.permutation(np.flatnonzero(folds < 0)):
        f = int(np.argmax(room))
        folds[i] = f
        room[f] -= 1
    return folds


def comment_groups(pairs: Pairs) -> np.ndarray:
    """The group of each pair: pairs that share a comment (directly or through others) are
    one group, the connected components of the comments-as-nodes graph (union-find)."""
    return _components(*_comment_keys(pairs))


def _components(less: list[bytes], more: list[bytes]) -> np.ndarray:
    """`comment_groups` of the pairs whose comments are these keys."""
    parent: dict[bytes, bytes] = {}

    def root(x: bytes) -> bytes:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in zip(less, more, strict=True):
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[ra] = rb
    roots = [root(a) for a in less]
    return np.unique(roots, return_inverse=True)[1].astype(np.int64)


def _comment_keys(pairs: Pairs) -> tuple[list[bytes], list[bytes]]:
    """Each pair's two comments as hashable keys (their digests: equal texts, equal keys)."""
    d = pairs.text_digests()
    return [x.tobytes() for x in d[:, 0]], [x.tobytes() for x in d[:, 1]]


def pair_folds(pairs: Pairs, n_folds: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A fold for both comments of every pair, so that a comment sits on one side of a split:
    whole groups of pairs that share comments (`comment_groups`) go to one fold, filling the
    emptiest fold first; a group larger than a fold's share is split comment by comment
    (seeded), and its pairs whose comments fall in different folds are then lost to the
    folds that hold one of the comments.

    Returns:
      (fold of each pair's less toxic comment, of its more toxic comment).
    """
    keys = _comment_keys(pairs)
    groups = _components(*keys)
    sizes = np.bincount(groups)
    rng = np.random.default_rng([seed, 23])
    order = rng.permutation(sizes.size)
    order = order[np.argsort(-sizes[order], kind="stable")]
    share = len(pairs) / n_folds
    group_fold, filled = np.full(sizes.size, -1, np.int64), np.zeros(n_folds)
    for g in order:
        if sizes[g] <= share:
            group_fold[g] = f = int(np.argmin(filled))
            filled[f] += sizes[g]
    less, more = group_fold[groups], group_fold[groups]
    split = np.flatnonzero(less < 0)  # pairs of the groups too large for one fold
    if split.size:
        a, b = keys
        split_keys = sorted({a[i] for i in split} | {b[i] for i in split})
        draws = rng.integers(n_folds, size=len(split_keys)).tolist()
        fold_of = dict(zip(split_keys, draws, strict=True))
        less[split] = [fold_of[a[i]] for i in split]
        more[split] = [fold_of[b[i]] for i in split]
    return less, more


def split(
    data: Comments | Pairs,
    valid_fraction: float,
    seed: int,
    n_folds: int = 0,
    fold: int = 0,
    label_columns: Sequence[str] = ("toxic",),
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded (train, valid) indices: a held-out fraction, or fold `fold` of k; stratified over
    `label_columns` for comments, by shared comments for pairs (`pair_split`)."""
    if isinstance(data, Pairs):
        return pair_split(data, valid_fraction, seed, n_folds, fold)[:2]
    if n_folds:
        folds = fold_assignment(data, n_folds, seed, label_columns)
        return np.flatnonzero(folds != fold), np.flatnonzero(folds == fold)
    strata = _strata(data, label_columns)
    rng = np.random.default_rng([seed, 13])
    train, valid = [], []
    for s in np.unique(strata):
        idx = rng.permutation(np.flatnonzero(strata == s))
        k = int(round(idx.size * valid_fraction))
        valid.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(valid))


def pair_split(
    pairs: Pairs, valid_fraction: float, seed: int, n_folds: int = 0, fold: int = 0
) -> tuple[np.ndarray, np.ndarray, int]:
    """(train, valid, lost) pairs with no comment on both sides: validation is fold `fold` of
    `n_folds` (or fold 0 of round(1 / valid_fraction)) of `pair_folds`; training is every pair
    with neither comment in it; `lost` counts the pairs with one comment on each side."""
    k = n_folds or max(int(round(1 / valid_fraction)), 2)
    less, more = pair_folds(pairs, k, seed)
    inside = (less == fold).astype(int) + (more == fold)
    valid, train = np.flatnonzero(inside == 2), np.flatnonzero(inside == 0)
    lost = int((inside == 1).sum())
    log.info(
        "%s: pairs split so that no comment is on both sides: %d train, %d validation, %d "
        "pairs left out (one comment on each side)", pairs.source, train.size, valid.size, lost,
    )  # fmt: skip
    return train, valid, lost


def subsample(
    data: Comments | Pairs, n: int, seed: int, label_columns: Sequence[str]
) -> np.ndarray:
    """A seeded random sample of `n` rows (the notebooks' `.sample(n=...)`), stratified over
    the label pattern for comments (each stratum keeps its share, rounded), in file order."""
    if n >= len(data):
        return np.arange(len(data))
    rng = np.random.default_rng([seed, 29])
    strata = _strata(data, label_columns)
    values, counts = np.unique(strata, return_counts=True)
    quota = np.floor(counts * n / len(data)).astype(int)
    remainder = counts * n / len(data) - quota
    quota[np.argsort(-remainder, kind="stable")[: n - quota.sum()]] += 1
    chosen = [rng.choice(np.flatnonzero(strata == v), q, replace=False)
              for v, q in zip(values, quota, strict=True)]  # fmt: skip
    return np.sort(np.concatenate(chosen))


@dataclass
class Examples:
    """Tokenized examples of one split, ready to batch."""

    input_ids: np.ndarray  # (N, L) or (N, 2, L)
    attention_mask: np.ndarray
    label: np.ndarray  # (N, *Task.label_shape), NaN where a sub-label is blank
    cache_hit: bool = False
    groups: Groups = field(default_factory=Groups)  # for the metrics, never batched
    lengths: np.ndarray | None = None  # (N,) `real_lengths` when the tokenizer gave them

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def real_lengths(self) -> np.ndarray:
        """Each example's `buckets.real_lengths`, without reading the token arrays when they
        came from the cache (which keeps them beside the entry)."""
        if self.lengths is not None:
            return self.lengths
        return real_lengths(self.attention_mask)

    def take(
        self, idx: np.ndarray, weight: np.ndarray | None = None, length: int | None = None
    ) -> dict[str, np.ndarray]:
        """The batch of rows `idx`, cut to `length` tokens (None: all; see
        `jaxtpu.core.data.buckets`)."""
        if weight is None:
            weight = np.ones(idx.shape[0], np.float32)
        cut = slice(None, length)
        return {
            "input_ids": self.input_ids[idx, ..., cut],
            "attention_mask": self.attention_mask[idx, ..., cut],
            "label": self.label[idx],
            "weight": weight.astype(np.float32),
        }


def encode(
    data: Comments | Pairs,
    tokenizer: Any,
    max_len: int,
    cache_dir: Any = None,
    task: Task | None = None,
) -> Examples:
    """Tokenizes comments, or both sides of each pair (ranking), with the labels of `task`
    (default: toxicity) laid out as its `Task.batch_spec` says (`labels_of`)."""
    task = task or get_task("toxicity")
    if isinstance(data, Pairs):
        n = len(data)
        # Each pair's two comments side by side: (2n, L) is (n, 2, L) without a copy.
        both = lambda: [t for pair in zip(data.less, data.more, strict=True) for t in pair]  # noqa: E731
        digests = data.text_digests().reshape(2 * n, 16)
        t = cached_tokens(both, digests, tokenizer, max_len, cache_dir)
        pair = lambda a: a.reshape(n, 2, max_len)  # noqa: E731
        longer = t.lengths.reshape(n, 2).max(1)
        return Examples(pair(t.ids), pair(t.mask), np.ones(n, np.float32), t.cache_hit,
                        lengths=longer)  # fmt: skip
    t = cached_tokens(lambda: data.texts, data.text_digests(), tokenizer, max_len, cache_dir)
    labels = labels_of(data, task.label_columns).reshape(len(data), *task.label_shape)
    return Examples(t.ids, t.mask, labels, t.cache_hit, data.groups, t.lengths)


def labels_of(data: Comments, label_columns: tuple[str, ...]) -> np.ndarray:
    """(N, columns) float32 of these label columns (`toxic` and the `SUBLABELS`), NaN where a
    sub-label is blank (or the file has no such column); unlabelled comments get zeros."""
    n = len(data)
    if data.labels is None:
        return np.zeros((n, len(label_columns)), np.float32)
    sub = data.sublabels if data.sublabels is not None else np.full((n, len(SUBLABELS)), np.nan)
    by_name = {"toxic": data.labels, **{c: sub[:, i] for i, c in enumerate(SUBLABELS)}}
    return np.column_stack([by_name[c] for c in label_columns]).astype(np.float32)


# --------------------------------------------------------------------------- one entry point


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
            "nothing", source, ", ".join(blank),
        )  # fmt: skip


def load_task_data(cfg: Config, tokenizer: Any) -> TaskData:
    """Reads, splits, (for ranking) pairs and tokenizes the data a config asks for.

    Args:
      cfg: the run's configuration.
      tokenizer: a Hugging Face fast tokenizer.
    Returns:
      train and validation `Examples` plus an `info` dict describing what was loaded.
    """
    d, task, seed = cfg.data, cfg.task, cfg.run.seed
    cache = Path(d.cache_dir) if d.cache_dir else default_cache_dir()
    if d.train_csv:
        path = SAMPLE_CSV if d.train_csv == "sample" else d.train_csv
        data = read_task_file(path, task, d.fold_column, cache)
        source = str(path)
    else:
        data = demo_comments(d.demo_size, seed)
        source = f"built-in demo data ({d.demo_size} generated comments)"
    if d.max_rows and len(data) > d.max_rows:
        data = data.subset(np.arange(d.max_rows))
    if d.subsample and len(data) > d.subsample:
        data = data.subset(subsample(data, d.subsample, seed, task.label_columns))
        source += f" (seeded sample of {d.subsample} rows, stratified)"
    valid_rows = None
    if d.valid_csv:
        train, valid = data, read_task_file(d.valid_csv, task, cache_dir=cache)
        split_desc = f"validation file {d.valid_csv}"
    else:
        tr, valid_rows, split_desc = _split_rows(data, cfg, source)
        train, valid = data.subset(tr), data.subset(valid_rows)
    if task.outputs > 1:
        check_label_columns(train, task, source)
    if task.comments_per_example == 2:
        # Build pairs within each split, so no comment is in both train and validation pairs.
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
    train_ex = encode(train, tokenizer, d.max_len, d.cache_dir, task)
    valid_ex = encode(valid, tokenizer, d.max_len, d.cache_dir, task)
    info = {
        "source": source,
        "demo": not d.train_csv,
        "split": split_desc,
        "train_examples": len(train_ex),
        "valid_examples": len(valid_ex),
        "dropped_rows": getattr(data, "dropped", 0),
        "token_cache_hit": train_ex.cache_hit and valid_ex.cache_hit,
        "unit": task.unit,
    }
    return TaskData(train_ex, valid_ex, info, valid_rows)


def _split_rows(data: Comments | Pairs, cfg: Config, source: str) -> tuple[Any, Any, str]:
    """(train rows, validation rows, a description) of a file without --valid-csv: the file's
    own folds (--fold-column), fold k of --n-folds, or a held-out fraction."""
    d, seed = cfg.data, cfg.run.seed
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
