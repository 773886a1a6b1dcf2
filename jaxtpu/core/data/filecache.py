"""The file cache: what a reader returns for a file, but its texts, kept by a hash of the
file's bytes, so a second run of the same file reads no comment (framework-free)."""

from __future__ import annotations

import functools
import hashlib
import logging
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core.data import readers
from jaxtpu.core.data.records import Comments, FileTexts, Groups, NumberColumn, Pairs
from jaxtpu.core.data.tables import Table
from jaxtpu.core.errors import DataError
from jaxtpu.core.files import atomic_write

log = logging.getLogger(__name__)


TABLE_VERSION = 2  # bump when what a reader returns for a file changes


def read_cached(
    kind: str,
    path: Path,
    fold_column: str,
    cache_dir: Path,
    table: Table | None = None,
    columns: Mapping[str, NumberColumn] | None = None,
) -> Comments | Pairs:
    """A file as its reader reads it, from the cache when this content was read before.

    The entry (`<key>.table.npz` beside the token entries) holds everything the reader returns
    but the texts: labels, sub-labels, identities, languages, ids, folds and each text's
    digest, keyed by a hash of the file's bytes (a changed file is read again). A run whose
    token entries exist (keyed by the same digests) then never reads the texts; `FileTexts`
    reads them from the file if it does need them (a new --max-len, another split).
    `table`: the file opened with its header read, when the caller has it; `columns`: the
    further numeric columns asked for (`NumberColumn`s, part of the key).
    """
    columns = dict(columns or {})
    asked = sorted((k, repr(v)) for k, v in columns.items())
    h = hashlib.sha256(f"{TABLE_VERSION}|{kind}|{fold_column}|{asked}|".encode())
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    entry = cache_dir / f"{h.hexdigest()[:32]}.table.npz"
    if entry.exists():
        try:
            with np.load(entry, allow_pickle=False) as z:
                data = _from_arrays(kind, path, fold_column, dict(z), columns)
            log.info("%s: read from the file cache (%d rows)", path, len(data))
            if data.dropped:
                log.warning("%s: dropped %d rows with an empty comment", path, data.dropped)
            return data
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            entry.unlink(missing_ok=True)
            log.warning(
                "file cache entry %s is damaged (%s); reading %s again",
                entry,
                type(e).__name__,
                path,
            )
    data = readers.READERS[kind](path, fold_column=fold_column, table=table, columns=columns)
    data.text_digests()
    try:
        with atomic_write(entry, "wb") as f:
            np.savez(f, **_to_arrays(data))
    except OSError as e:
        log.warning(
            "could not write the file cache in %s (%s); continuing without it", cache_dir, e
        )
    return data


def _to_arrays(data: Comments | Pairs) -> dict[str, np.ndarray]:
    common = {
        "n": np.asarray(len(data)),
        "dropped": np.asarray(data.dropped),
        "digests": data.text_digests(),
        "folds": np.zeros(0, np.int64) if data.folds is None else data.folds,
        "has_folds": np.asarray(data.folds is not None),
        "column_names": np.asarray(list(data.columns), dtype=str),
        "columns": np.stack(list(data.columns.values()), 1)
        if data.columns
        else np.zeros((len(data), 0), np.float32),
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
        "identities": np.stack([g.identities[k] for k in names], 1)
        if names
        else np.zeros((len(data), 0), np.float32),
        "lang": np.zeros(0, str) if g.lang is None else g.lang.astype(str),
        "has_lang": np.asarray(g.lang is not None),
    }


def _from_arrays(
    kind: str,
    path: Path,
    fold_column: str,
    z: dict[str, np.ndarray],
    columns: Mapping[str, NumberColumn],
) -> Any:
    n = int(z["n"])
    folds = z["folds"] if bool(z["has_folds"]) else None
    numbers = {
        k: z["columns"][:, j].astype(columns[k].dtype)
        for j, k in enumerate(z["column_names"].tolist())
    }

    @functools.cache
    def reread() -> Any:
        """The file read again for its texts, checked to be the rows the entry describes."""
        log.info("%s: reading its comments (their tokens are not in the cache)", path)
        data = readers.READERS[kind](path, fold_column=fold_column, columns=columns)
        if len(data) != n or not np.array_equal(data.text_digests(), z["digests"]):
            raise DataError(f"{path}: changed while this run was reading it; start the run again")
        return data

    rows = np.arange(n)
    if "labels" not in z:  # a Pairs entry (`_to_arrays`)
        less = FileTexts(lambda: reread().less, rows)
        more = FileTexts(lambda: reread().more, rows)
        return Pairs(str(path), less, more, int(z["dropped"]), folds, z["digests"], numbers)
    names = z["identity_names"].tolist()
    identities = {k: z["identities"][:, j] for j, k in enumerate(names)}
    groups = Groups(identities, z["lang"] if bool(z["has_lang"]) else None)
    texts = FileTexts(lambda: reread().texts, rows)
    return Comments(
        str(path),
        texts,
        z["labels"],
        z["sublabels"],
        z["ids"].tolist(),
        int(z["dropped"]),
        groups,
        folds,
        z["digests"],
        numbers,
    )
