"""Perspective's scale learnt from a platform's history, and how far a model is from it
(framework-free; numpy only).

`fit` is isotonic regression (the pool-adjacent-violators algorithm) of Perspective's logged
score on the model's probability, over history rows the model did not train on, made into a
strictly increasing piecewise-linear map: through each pooled block's centre (its mean
probability, its mean score), with (0, 0) and (1, 1) at the ends where the blocks leave room.
Strictly increasing, so the map never ties two comments the model ranked apart: every rank
correlation and ROC AUC is the model's own; only where the thresholds fall moves (Perspective
calibrated its own scores the same way, by isotonic regression). `jaxtpu.core.calibration`
keeps the map and applies it with the run's calibration.

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


def fit(p: np.ndarray, target: np.ndarray) -> tuple[list[float], list[float]]:
    """The knots (x, y) of the strictly increasing map from the model's probabilities `p` to
    Perspective's scores `target` (rows where either is NaN left out).

    Raises:
      ValueError: fewer than `MIN_ROWS` rows, or all of one score.
    """
    p, target = np.asarray(p, np.float64), np.asarray(target, np.float64)
    known = np.isfinite(p) & np.isfinite(target)
    p, target = p[known], target[known]
    if len(p) < MIN_ROWS or target.min() == target.max():
        raise ValueError(f"{len(p)} scored rows, {len(np.unique(target))} distinct scores")
    cx, cy, _ = isotonic(p, target)
    xs, ys = list(cx), list(cy)
    if xs[0] > 0 and ys[0] > 0:
        xs, ys = [0.0, *xs], [0.0, *ys]
    if xs[-1] < 1 and ys[-1] < 1:
        xs, ys = [*xs, 1.0], [*ys, 1.0]
    return [float(v) for v in xs], [float(v) for v in ys]


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
