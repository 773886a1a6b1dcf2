"""Evaluation metrics over a whole evaluation set (numpy + scikit-learn only).

Framework-free: the torch side computes its metrics with these same functions; each task's
metric (`jaxtpu.core.tasks`) is built from them. Inputs are
the scores and labels gathered from every device, with pad rows marked by weight 0.
"""

from __future__ import annotations

import numpy as np


def _valid(weight: np.ndarray | None, n: int) -> np.ndarray:
    return np.ones(n, bool) if weight is None else np.asarray(weight) > 0


def roc_auc(scores: np.ndarray, labels: np.ndarray, weight: np.ndarray | None = None) -> float:
    """ROC AUC of scores (logits or probabilities) against labels.

    Float labels (the unintended-bias data) are binarised at 0.5. Returns NaN when the
    evaluated rows hold only one class, where AUC is undefined, or a score is NaN/Inf.
    """
    from sklearn.metrics import roc_auc_score  # lazy: keeps `import jaxtpu.core.metrics` light

    scores, labels = np.asarray(scores, np.float64), np.asarray(labels)
    keep = _valid(weight, scores.shape[0])
    y = (labels[keep] >= 0.5).astype(np.int64)
    if np.unique(y).size < 2 or not np.all(np.isfinite(scores[keep])):
        return float("nan")
    return float(roc_auc_score(y, scores[keep]))


def column_aucs(
    scores: np.ndarray, labels: np.ndarray, weight: np.ndarray | None = None
) -> list[float]:
    """ROC AUC of each column of (N, C) scores against (N, C) labels, each over the rows whose
    label in that column is known (NaN = blank: not scored); NaN where undefined."""
    scores, labels = np.asarray(scores), np.asarray(labels, np.float64)
    keep = _valid(weight, scores.shape[0])
    return [
        roc_auc(scores[:, j], labels[:, j], keep & ~np.isnan(labels[:, j]))
        for j in range(labels.shape[1])
    ]


def agreement(
    less_scores: np.ndarray, more_scores: np.ndarray, weight: np.ndarray | None = None
) -> float:
    """Share of pairs where the more toxic comment scores strictly higher (ties are misses)."""
    less, more = np.asarray(less_scores), np.asarray(more_scores)
    keep = _valid(weight, less.shape[0])
    if not keep.any():
        return float("nan")
    return float(np.mean(more[keep] > less[keep]))


def weighted_mean(values: np.ndarray, weight: np.ndarray | None = None) -> float:
    """Mean of per-example values, pad rows (weight 0) excluded."""
    values = np.asarray(values, np.float64)
    w = np.ones_like(values) if weight is None else np.asarray(weight, np.float64)
    total = w.sum()
    return float((values * w).sum() / total) if total > 0 else float("nan")
