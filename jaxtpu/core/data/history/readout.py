"""A Perspective attribute read out of the frozen model's vector (framework-free; numpy only).

`history fit-scale --readout`: for each attribute the history scores, a linear layer on the
model's pooled vector (the vector its classifier reads) regressed onto Perspective's logged
score, in logit units (ridge regression on standardised inputs; the L2 strength chosen by
k-fold cross-validation on the history, by the rank correlation of the held-out predictions
with Perspective's). The model itself is not changed: one pass gives its own scores and the
vector, and the readout is a dot product per attribute.

Why: a model trained on Jigsaw's labels ranks comments by what Jigsaw's raters marked, and no
monotone map (`scale`) changes a ranking. Perspective's attributes rank otherwise (THREAT,
IDENTITY_ATTACK and SEVERE_TOXICITY most), and the vector already holds much of what tells
them apart: on the shared Perspective-scored comments (2-fold, `benchmarks.quality.
perspective_scale`, docs/measured/perspective-scale.json) a readout of a Jigsaw MiniLM's vector
raised THREAT's rank correlation with Perspective from 0.18 to 0.63 and IDENTITY_ATTACK's from
0.30 to 0.70, where an epoch of fine-tuning on the same scores reached 0.36 and 0.51. The
map onto Perspective's scale is then fitted on the readout's out-of-fold predictions, which
are what a new comment gets, not on its fit to the rows it learnt from.

`--ngrams`: the same regression on the vector beside the text's word and character n-grams
(`jaxtpu.core.ngrams`, a weight for each of the 20,000 of the most comments), solved sparse
(scipy's lsqr). The vector blurs the one word that makes a comment an identity attack or a
threat; on the same comments it raised IDENTITY_ATTACK's F1 at 0.9 against Perspective's flags
from 0.22 to 0.50 and THREAT's from 0.35 to 0.49, every rank correlation within 0.006
(docs/measured/perspective-readouts.json).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jaxtpu.core import ngrams
from jaxtpu.core.serving.heads import folds_of
from jaxtpu.core.serving.shadow import spearman

L2_GRID = (0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)
FOLDS = 5
MIN_ROWS = 100  # fewer scored comments cannot choose an L2 strength by folds
CLIP = 1e-3  # Perspective's 0 and 1 as logits: +-6.9
# beside the n-grams: the standardised vector scaled so that a comment's vector weighs about as
# much as its n-grams (a norm of about 1 each, for a vector of some hundreds of values)
VECTOR_WEIGHT = 0.05
NGRAM_L2_GRID = (0.3, 1.0, 3.0, 10.0)


@dataclass(frozen=True)
class Fitted:
    """A readout: `weights` . vector + `bias` is the logit of Perspective's score; `held_out`
    the logit each fitting row got from the folds that did not see it; `l2` the strength
    chosen and `rank_correlation` the held-out predictions' with Perspective's scores."""

    weights: np.ndarray
    bias: float
    l2: float
    held_out: np.ndarray
    rank_correlation: float
    grams: dict[str, float] = field(default_factory=dict)


def logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, np.float64), CLIP, 1 - CLIP)
    return np.log(p) - np.log1p(-p)


def _ridge(x: np.ndarray, t: np.ndarray, l2: float) -> tuple[np.ndarray, float]:
    """Ridge regression of `t` on standardised `x` (the intercept unpenalised), as weights
    and bias of the raw `x`."""
    mu, sd = x.mean(0), x.std(0)
    sd = np.where(sd > 0, sd, 1.0)
    xs = (x - mu) / sd
    tc = t - t.mean()
    w = np.linalg.solve(xs.T @ xs + l2 * np.eye(x.shape[1]), xs.T @ tc)
    w = w / sd
    return w, float(t.mean() - mu @ w)


def fit(
    vectors: np.ndarray,
    scores: np.ndarray,
    folds: int = FOLDS,
    seed: int = 0,
    grams: Sequence[dict[str, float]] | None = None,
) -> Fitted:
    """The readout of Perspective's `scores` (in [0, 1], NaN where unscored: left out) from
    the model's `vectors` (N, hidden) and, given each text's n-gram `grams`
    (`jaxtpu.core.ngrams.features`), from those too: a weight for each of the `VOCABULARY`
    n-grams of the most scored comments.

    Raises:
      ValueError: fewer than `MIN_ROWS` scored rows, or one score for all.
    """
    known = np.isfinite(scores)
    x = np.asarray(vectors, np.float64)[known]
    y = np.asarray(scores, np.float64)[known]
    if len(y) < MIN_ROWS or y.min() == y.max():
        raise ValueError(f"{len(y)} scored rows, {len(np.unique(y))} distinct scores")
    t = logit(y)
    fold = folds_of(np.zeros(len(y)), folds, seed)  # one class: every row dealt round at random
    if grams is None:
        ridge, grid, design, vocab = _ridge, L2_GRID, x, []
    else:
        kept = [g for g, k in zip(grams, known, strict=True) if k]
        vocab = ngrams.vocabulary(kept)
        ridge, grid, design = _sparse_ridge, NGRAM_L2_GRID, _design(x, kept, vocab)
    best: tuple[float, float, np.ndarray] | None = None
    for l2 in grid:
        held = np.empty(len(y))
        for f in range(folds):
            w, b = ridge(design[fold != f], t[fold != f], l2)
            held[fold == f] = design[fold == f] @ w + b
        rho = spearman(list(zip(held, y, strict=True))) or 0.0  # None: a constant prediction
        if best is None or rho > best[0]:
            best = (rho, l2, held)
    assert best is not None
    rho, l2, held = best
    w, b = ridge(design, t, l2)
    full = np.full(len(scores), np.nan)
    full[known] = held
    if grams is None:
        return Fitted(w, b, l2, full, rho)
    # as weights of the raw vector and the n-grams: what `calibration.Readout` applies
    mu, sd = _moments(x)
    v = w[len(vocab) :] * VECTOR_WEIGHT / sd
    named = {g: float(c) for g, c in zip(vocab, w[: len(vocab)], strict=True) if c}
    return Fitted(v, float(b - mu @ v), l2, full, rho, named)


def _moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mu, sd = x.mean(0), x.std(0)
    return mu, np.where(sd > 0, sd, 1.0)


def _design(x: np.ndarray, each: Sequence[dict[str, float]], vocab: list[str]) -> Any:
    """The rows' n-gram values (of `vocab`) beside their standardised vectors times
    `VECTOR_WEIGHT`, as one sparse matrix."""
    from scipy import sparse

    index = {g: i for i, g in enumerate(vocab)}
    rows, cols, vals = [], [], []
    for r, f in enumerate(each):
        k, v = ngrams.indexed(f, index)
        rows += [r] * len(k)
        cols += k
        vals += v
    grams = sparse.csr_matrix((vals, (rows, cols)), shape=(len(each), len(vocab)))
    mu, sd = _moments(x)
    return sparse.hstack([grams, sparse.csr_matrix((x - mu) / sd * VECTOR_WEIGHT)]).tocsr()


def _sparse_ridge(x: Any, t: np.ndarray, l2: float) -> tuple[np.ndarray, float]:
    """Ridge regression of `t` on the sparse `x`, the intercept unpenalised: the columns
    centred implicitly (a linear operator), so the matrix stays sparse."""
    from scipy.sparse.linalg import LinearOperator, lsqr

    m = np.asarray(x.mean(0)).ravel()
    centred = LinearOperator(
        x.shape,
        matvec=lambda w: x @ w - m @ w,
        rmatvec=lambda r: x.T @ r - m * r.sum(),
        dtype=np.float64,
    )
    w = lsqr(centred, t - t.mean(), damp=math.sqrt(l2), atol=1e-8, btol=1e-8, iter_lim=2000)[0]
    return w, float(t.mean() - m @ w)
