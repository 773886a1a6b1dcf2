"""Perspective's scale learnt from a platform's history, and how far a model is from it
(framework-free; numpy only).

`fit` makes a monotone map from the model's probability to Perspective's logged score, over
history rows the model did not train on, in one of two ways (`METHODS`):

- `quantile` (the default): the model's score at each quantile of its scores goes to
  Perspective's score at the same quantile. As many comments pass each threshold as passed
  Perspective's on the history: a platform's threshold keeps the share of comments it
  withholds, which is what switching without re-tuning needs. Measured
  (`benchmarks.quality.perspective_scale`): the isotonic map left a learnt model's SEVERE_TOXICITY
  flagging a quarter as many comments as Perspective at 0.8.
- `isotonic`: isotonic regression (pool-adjacent-violators) of Perspective's score on the
  model's, made strictly increasing through each pooled block's centre, with (0, 0) and (1, 1)
  at the ends where the blocks leave room. It predicts Perspective's mean score for each of the
  model's, which regresses to the middle where the two disagree: fewer comments reach 0.8 and
  0.9 than Perspective's did (Perspective calibrated its own scores so, on rater fractions).

Either is increasing, so no comment the model ranked above another falls below it: every rank
correlation and ROC AUC is the model's own; only where the thresholds fall moves.
`jaxtpu.core.calibration` keeps the map and applies it with the run's calibration.

`compare` is what a platform checks before switching: per attribute, the rank correlation with
Perspective's scores, the mean difference, and at each threshold how many comments each flags
(strictly above, as Coral compares), how many both, and the F1 of jaxtpu's flags against
Perspective's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jaxtpu.core.serving.shadow import spearman

THRESHOLDS = (0.5, 0.7, 0.8, 0.9)
MIN_ROWS = 30  # scores fewer than this cannot place a scale: the attribute is left raw
METHODS = ("quantile", "isotonic")
LEVELS = 201  # the quantile map's evenly spaced levels (more in each tail)


def isotonic(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocks of the isotonic (non-decreasing) regression of `y` on `x`: each block's mean
    x, mean y and size, in increasing x. Rows of equal x are pooled first."""
    order = np.argsort(x, kind="stable")
    xs, ys = np.asarray(x, np.float64)[order], np.asarray(y, np.float64)[order]
    ux, start = np.unique(xs, return_index=True)
    size = np.diff(np.append(start, len(xs))).astype(np.float64)
    sums = np.add.reduceat(ys, start)
    bx, by, bn = [], [], []  # a stack of blocks: sum of x, sum of y, size
    for i in range(len(ux)):
        sx, sy, n = ux[i] * size[i], sums[i], size[i]
        while bn and by[-1] / bn[-1] >= sy / n:  # violates: pool with the block before
            sx, sy, n = sx + bx.pop(), sy + by.pop(), n + bn.pop()
        bx.append(sx)
        by.append(sy)
        bn.append(n)
    n = np.asarray(bn)
    return np.asarray(bx) / n, np.asarray(by) / n, n


def fit(
    p: np.ndarray, target: np.ndarray, method: str = "quantile"
) -> tuple[list[float], list[float]]:
    """The knots (x, y) of the increasing map from the model's probabilities `p` to
    Perspective's scores `target` (rows where either is NaN left out), by `method` (`METHODS`).

    Raises:
      ValueError: fewer than `MIN_ROWS` rows, or all of one score.
    """
    p, target = np.asarray(p, np.float64), np.asarray(target, np.float64)
    known = np.isfinite(p) & np.isfinite(target)
    p, target = p[known], target[known]
    if len(p) < MIN_ROWS or target.min() == target.max():
        raise ValueError(f"{len(p)} scored rows, {len(np.unique(target))} distinct scores")
    if method == "quantile":
        return quantiles(p, target)
    if method != "isotonic":
        raise ValueError(f"method {method!r}: one of {', '.join(METHODS)}")
    cx, cy, _ = isotonic(p, target)
    xs, ys = list(cx), list(cy)
    if xs[0] > 0 and ys[0] > 0:
        xs, ys = [0.0, *xs], [0.0, *ys]
    if xs[-1] < 1 and ys[-1] < 1:
        xs, ys = [*xs, 1.0], [*ys, 1.0]
    return [float(v) for v in xs], [float(v) for v in ys]


def quantiles(p: np.ndarray, target: np.ndarray) -> tuple[list[float], list[float]]:
    """The quantile map: the model's score at each quantile of its own scores goes to
    Perspective's score at the same quantile (`LEVELS` of them, denser in the tails, where the
    thresholds are), so as many comments pass each threshold as Perspective passed on these
    rows; knots of equal x are pooled."""
    tail = np.geomspace(1e-4, 0.05, 24)
    levels = np.unique(np.concatenate([[0.0], tail, np.linspace(0, 1, LEVELS), 1 - tail, [1.0]]))
    xs = np.quantile(p, levels)
    ys = np.maximum.accumulate(np.quantile(target, levels))
    ux, first = np.unique(xs, return_index=True)
    uy = np.array([ys[i:j].mean() for i, j in zip(first, [*first[1:], len(xs)], strict=True)])
    # strictly increasing by a ramp of a millionth: no two of the model's scores tie
    uy = np.maximum.accumulate(uy) * (1 - 1e-6) + np.arange(len(uy)) / len(uy) * 1e-6
    return [float(v) for v in ux], [float(v) for v in uy]


def apply(p: np.ndarray, xs: Sequence[float], ys: Sequence[float]) -> np.ndarray:
    """`p` through the map of knots (xs, ys): linear between knots, the end values beyond."""
    return np.interp(np.asarray(p, np.float64), np.asarray(xs), np.asarray(ys))


def compare(
    theirs: Mapping[str, np.ndarray], ours: Mapping[str, np.ndarray]
) -> dict[str, dict[str, Any]]:
    """Per attribute both have: Perspective's scores (`theirs`, NaN where unscored) against
    jaxtpu's (`ours`) on the same comments."""
    out: dict[str, dict[str, Any]] = {}
    for name, t in theirs.items():
        if name not in ours:
            continue
        t = np.asarray(t, np.float64)
        known = np.isfinite(t)
        t, o = t[known], np.asarray(ours[name], np.float64)[known]
        if not len(t):
            continue
        at = {}
        for threshold in THRESHOLDS:
            a, b = t > threshold, o > threshold  # strictly above, as Coral compares
            both = int((a & b).sum())
            f1 = 2 * both / (a.sum() + b.sum()) if a.sum() + b.sum() else None
            at[str(threshold)] = {
                "perspective": int(a.sum()),
                "jaxtpu": int(b.sum()),
                "both": both,
                "f1": f1,
            }
        out[name] = {
            "comments": int(len(t)),
            "rank_correlation": spearman(list(zip(t, o, strict=True))),
            "mean_difference": float((o - t).mean()),
            "above": at,
        }
    return out


def table(report: Mapping[str, Mapping[str, Any]]) -> str:
    """`compare`'s report as Markdown: a row per attribute."""
    head = " | ".join(f"> {t}: P / J / both / F1" for t in THRESHOLDS)
    lines = [
        f"| attribute | comments | rank correlation | mean difference (jaxtpu - Perspective) | "
        f"{head} |",
        "|---|---|---|---|" + "---|" * len(THRESHOLDS),
    ]
    for name, r in report.items():
        rho = "-" if r["rank_correlation"] is None else f"{r['rank_correlation']:.3f}"
        cells = " | ".join(
            f"{c['perspective']:,} / {c['jaxtpu']:,} / {c['both']:,} / "
            + ("-" if c["f1"] is None else f"{c['f1']:.2f}")
            for c in r["above"].values()
        )
        lines.append(
            f"| {name} | {r['comments']:,} | {rho} | {r['mean_difference']:+.3f} | {cells} |"
        )
    return "\n".join(lines)
