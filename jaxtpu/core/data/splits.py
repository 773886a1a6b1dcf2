"""Which rows train and which validate: held-out fractions and k folds, stratified over the
label pattern (iterative stratification for several labels), and seeded subsamples
(framework-free)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from jaxtpu.core.data.pairing import pair_folds
from jaxtpu.core.data.records import Comments, Pairs
from jaxtpu.core.data.tokenized import labels_of

log = logging.getLogger(__name__)


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
        "pairs left out (one comment on each side)",
        pairs.source,
        train.size,
        valid.size,
        lost,
    )
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
    chosen = [
        rng.choice(np.flatnonzero(strata == v), q, replace=False)
        for v, q in zip(values, quota, strict=True)
    ]
    return np.sort(np.concatenate(chosen))
