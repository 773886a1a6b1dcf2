"""The learning-rate range test's arithmetic (framework-free; `jaxtpu lr-find` runs it): the
exponential sweep of the rate, the bias-corrected smoothing of the loss, fastai's stop and
Lightning's suggestion rule."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

SMOOTHING = 0.98  # fastai's exponential moving average of the loss (bias-corrected)

DIVERGED = 4.0  # stop once the smoothed loss exceeds this x its minimum (fastai's stop_div)

SKIP_START = 0.1  # the first share of the steps is left out of the suggestion (Lightning's)


def sweep_rate(step: Any, start: float, end: float, steps: int, xp: Any = np) -> Any:
    """The rate of optimizer update `step` (0-based): start x (end / start)^(step / (steps - 1))."""
    frac = xp.minimum(xp.asarray(step, xp.float32) / max(steps - 1, 1), 1.0)
    return start * (end / start) ** frac


def smooth(losses: Sequence[float], beta: float = SMOOTHING) -> np.ndarray:
    """Bias-corrected exponential moving average: avg_i = beta avg_(i-1) + (1 - beta) loss_i,
    reported as avg_i / (1 - beta^(i+1))."""
    out, avg = [], 0.0
    for i, x in enumerate(losses):
        avg = beta * avg + (1 - beta) * x
        out.append(avg / (1 - beta ** (i + 1)))
    return np.asarray(out)


def suggest(lrs: np.ndarray, smoothed: np.ndarray) -> tuple[float | None, str]:
    """The suggested rate and why: the steepest descent of the smoothed loss against log10(lr)
    (Lightning's rule), among the steps after the first tenth and up to the smoothed loss's
    minimum (past it the loss rises: those rates are too high). None when the loss never
    falls there."""
    n = len(lrs)
    lo, hi = max(int(n * SKIP_START), 1), int(np.argmin(smoothed))
    if hi - lo < 2:
        return None, (
            "the smoothed loss reaches its minimum in the first steps: no falling stretch to "
            "suggest from (lower --start-lr, or more --lr-find-steps)"
        )
    slope = np.gradient(smoothed[lo : hi + 1], np.log10(lrs[lo : hi + 1]))[:-1]  # not the min
    i = lo + int(np.argmin(slope))
    if slope[i - lo] >= 0:
        return None, "the smoothed loss does not fall over the sweep"
    why = (
        f"steepest descent of the smoothed loss (step {i + 1}, slope {slope[i - lo]:.3g} per "
        f"decade), below the minimum at lr {lrs[hi]:.3g}"
    )
    return float(lrs[i]), why
