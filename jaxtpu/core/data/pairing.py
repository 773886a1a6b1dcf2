"""Ranking pairs: built from labelled comments by severity, grouped by the comments they share,
and given folds so that no comment sits on both sides of a split (framework-free)."""

from __future__ import annotations

import numpy as np

from jaxtpu.core.data.records import Comments, Pairs, take_texts
from jaxtpu.core.errors import DataError


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
        take_texts(comments.texts, less),
        take_texts(comments.texts, more),
        digests=np.stack([d[less], d[more]], 1),
    )


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
