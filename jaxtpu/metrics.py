"""Evaluation metrics over a whole evaluation set (numpy + scikit-learn only).

Framework-free: the torch side computes its metrics with these same functions. Inputs are
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
    from sklearn.metrics import roc_auc_score  # lazy: keeps `import jaxtpu.metrics` light

    scores, labels = np.asarray(scores, np.float64), np.asarray(labels)
    keep = _valid(weight, scores.shape[0])
    y = (labels[keep] >= 0.5).astype(np.int64)
    if np.unique(y).size < 2 or not np.all(np.isfinite(scores[keep])):
        return float("nan")
    return float(roc_auc_score(y, scores[keep]))


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


def evaluate(
    task: str, scores: np.ndarray, labels: np.ndarray, losses: np.ndarray, weight: np.ndarray
) -> dict[str, float]:
    """The validation metrics of a task from gathered per-example outputs.

    Args:
      task: 'toxicity' (scores (N,)) or 'ranking' (scores (N, 2): less, more).
      scores: model outputs for every evaluated row, pad rows included.
      labels: (N,) targets.
      losses: (N,) per-example loss.
      weight: (N,) 1 for real rows, 0 for padding.
    Returns:
      {'val_loss': ..., 'val_auc': ...} or {'val_loss': ..., 'val_agreement': ...}.
    """
    out = {"val_loss": weighted_mean(losses, weight)}
    if task == "toxicity":
        out["val_auc"] = roc_auc(scores, labels, weight)
    else:
        out["val_agreement"] = agreement(scores[:, 0], scores[:, 1], weight)
    return out


# Which metric decides the best checkpoint, per task (higher is better).
MONITOR = {"toxicity": "val_auc", "ranking": "val_agreement"}
