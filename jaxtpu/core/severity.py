"""Severity from a multi-label model (the Rate Severity winners' scoring): a comment's score is
a weighted sum of its six label probabilities, and the weights are searched on validation
pairs to maximise agreement (framework-free).

The search (`search_weights`) is coordinate ascent on a grid. It starts from the weights pairs
are built with (`tasks.SEVERITY_WEIGHTS`). In each pass it takes the labels in order; for
each it tries every grid value (0, step, ..., top) with the other weights held, and moves to
the value of highest agreement. Only a strict gain moves it, so ties keep the current weight.
It stops after a pass that moves nothing, or after `max_passes`. Agreement is a step function
of the weights, so a gradient method has nothing to follow. The grid keeps the search
deterministic and cheap: each trial is one matrix-vector product over the pairs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from jaxtpu.core import metrics
from jaxtpu.core.errors import UserError
from jaxtpu.core.tasks import LABELS, SEVERITY_WEIGHTS


def parse_label_weights(text: str) -> np.ndarray:
    """`--label-weights w1,...,w6` (one per label of `LABELS`, in order, finite, >= 0, not
    all 0) -> (6,) float64."""
    parts = [p.strip() for p in text.split(",")]
    try:
        weights = np.array([float(p) for p in parts])
    except ValueError:
        weights = np.array([])
    if weights.shape != (len(LABELS),) or not np.isfinite(weights).all() or (weights < 0).any():
        raise UserError(
            f"--label-weights {text}: expected {len(LABELS)} numbers >= 0 separated by commas, "
            f"one per label ({', '.join(LABELS)})"
        )
    if not weights.any():
        raise UserError(f"--label-weights {text}: every weight is 0; every comment would tie")
    return weights


def format_weights(weights: np.ndarray) -> str:
    """The `--label-weights` value of `weights`."""
    return ",".join(f"{w:g}" for w in weights)


def severity(probs: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(N, 6) label probabilities -> (N,) severity scores."""
    return np.asarray(probs, np.float64) @ np.asarray(weights, np.float64)


def pair_agreement(less: np.ndarray, more: np.ndarray, weights: np.ndarray) -> float:
    """Agreement (`metrics.agreement`: strictly higher, ties miss) of the weighted scores of
    each pair's (6,) probabilities."""
    return metrics.agreement(severity(less, weights), severity(more, weights))


@dataclass
class Search:
    weights: np.ndarray
    agreement: float
    start_agreement: float
    passes: int


MAX_GRID = 1001  # weights tried per label: each trial holds one score margin per pair


def check_grid(step: float, top: float) -> int:
    """The number of weights `search_weights` tries per label (0, step, ..., top), or a
    one-line UserError for a grid that is not one (step <= 0, top < step, not finite) or is
    finer than `MAX_GRID` points (a pairs x grid array of that size is built per label)."""
    if not (np.isfinite(step) and np.isfinite(top) and 0 < step <= top):
        raise UserError(f"--step {step:g} --top {top:g}: expected 0 < step <= top, both finite")
    points = math.ceil(top / step + 0.5)  # len(np.arange(0, top + step / 2, step))
    if points > MAX_GRID:
        raise UserError(
            f"--step {step:g} --top {top:g}: {points:,} weights per label; at most {MAX_GRID:,} "
            f"(a coarser --step or a lower --top, e.g. --step {top / (MAX_GRID - 1):.3g})"
        )
    return points


def search_weights(
    less: np.ndarray,
    more: np.ndarray,
    step: float = 0.1,
    top: float = 2.0,
    start: np.ndarray | None = None,
    max_passes: int = 20,
) -> Search:
    """Coordinate ascent on the grid (see the module docstring) over pairs whose comments
    have the label probabilities `less`, `more` (P, 6)."""
    check_grid(step, top)
    grid = np.round(np.arange(0.0, top + step / 2, step), 10)
    weights = np.array(SEVERITY_WEIGHTS if start is None else start, np.float64)
    # the pairs' score margins (more - less) are linear in the weights: changing label j's
    # weight moves every margin by (new - old) x the pair's difference in that label
    diff = np.asarray(more, np.float64) - np.asarray(less, np.float64)  # (P, 6)
    margin = diff @ weights
    best = float(np.mean(margin > 0))
    first, passes = best, 0
    for passes in range(1, max_passes + 1):  # noqa: B007 (reported)
        moved = False
        for j in range(len(weights)):
            trials = margin[:, None] + np.outer(diff[:, j], grid - weights[j])  # (P, grid)
            scores = (trials > 0).mean(0)
            k = int(np.argmax(scores))  # the first of equals: the lowest weight
            if scores[k] > best:
                weights[j], moved = grid[k], True
                margin = diff @ weights  # afresh, so no rounding accumulates
                best = float(np.mean(margin > 0))
        if not moved:
            break
    return Search(weights, best, first, passes)
