"""Evaluation metrics over a whole evaluation set (numpy only).

Framework-free: the torch side computes its metrics with these same functions; each task's
metric (`jaxtpu.core.tasks`) is built from them. Inputs are
the scores and labels gathered from every device, with pad rows marked by weight 0.
"""

from __future__ import annotations

import numpy as np


def probability(logits: np.ndarray) -> np.ndarray:
    """What a classifier's logit is reported as everywhere (validation scores, predict,
    evaluate, the Python API): its sigmoid, in float64."""
    return 1.0 / (1.0 + np.exp(-np.asarray(logits, np.float64)))


def _valid(weight: np.ndarray | None, n: int) -> np.ndarray:
    return np.ones(n, bool) if weight is None else np.asarray(weight) > 0


def roc_auc(scores: np.ndarray, labels: np.ndarray, weight: np.ndarray | None = None) -> float:
    """ROC AUC of scores (logits or probabilities) against labels.

    Float labels (the unintended-bias data) are binarised at 0.5. Returns NaN when the
    evaluated rows hold only one class, where AUC is undefined, or a score is NaN/Inf.

    Computed as the Mann-Whitney statistic: the probability that a positive row outscores a
    negative one, ties counting half (mid-ranks), which is the area under the ROC curve that
    scikit-learn's `roc_auc_score` integrates (the tests hold the two to 1e-12). Not
    scikit-learn itself: importing it takes about 2 s, in every process that evaluates.
    """
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels)
    keep = _valid(weight, scores.shape[0])
    y, s = labels[keep] >= 0.5, scores[keep]
    positives = int(y.sum())
    negatives = y.size - positives
    if not positives or not negatives or not np.all(np.isfinite(s)):
        return float("nan")
    rank_sum = float(_mid_ranks(s)[y].sum())
    return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def _mid_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of `x`, tied values sharing the mean of their ranks."""
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    starts = np.r_[0, np.flatnonzero(ordered[1:] != ordered[:-1]) + 1]
    ends = np.r_[starts[1:], x.size]
    ranks = np.empty(x.size, np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


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


def power_mean(values: np.ndarray, p: float) -> float:
    """The generalised mean (mean(x^p))^(1/p) of non-negative values (NaN for no values); for
    p < 0 a zero among them makes it 0, its limit."""
    values = np.asarray(values, np.float64)
    if not values.size:
        return float("nan")
    if p < 0 and (values == 0).any():
        return 0.0
    return float(np.mean(values**p) ** (1.0 / p))


BIAS_POWER = -5.0  # the Unintended Bias competition's power mean
BIAS_PARTS = ("subgroup_auc", "bpsn_auc", "bnsp_auc")


def bias_aucs(
    scores: np.ndarray, labels: np.ndarray, identity: np.ndarray, keep: np.ndarray
) -> dict[str, float]:
    """One identity's three AUCs of the Unintended Bias metric over the rows `keep`, labels and
    identity values binarised at 0.5: subgroup (the comments that mention it), BPSN
    (background positives, subgroup negatives) and BNSP (background negatives, subgroup
    positives). NaN where the rows hold one class."""
    y = np.asarray(labels) >= 0.5
    g = np.asarray(identity) >= 0.5
    rows = {
        "subgroup_auc": keep & g,
        "bpsn_auc": keep & ((g & ~y) | (~g & y)),
        "bnsp_auc": keep & ((g & y) | (~g & ~y)),
    }
    return {k: roc_auc(scores, y.astype(np.float64), m) for k, m in rows.items()}


def jigsaw_bias(
    scores: np.ndarray,
    labels: np.ndarray,
    identities: dict[str, np.ndarray],
    weight: np.ndarray | None = None,
) -> tuple[dict[str, float], list[str]]:
    """The Jigsaw Unintended Bias metric: 0.25 x overall AUC + 0.25 x the power mean
    (p = -5) over identity subgroups of each of subgroup, BPSN and BNSP AUC.

    Rows are in an identity's subgroup where its value is >= 0.5, and in its background
    otherwise, blank (NaN) values included: the competition's own benchmark code binarised each
    identity column with `np.where(df[col] >= 0.5, True, False)`, and every leaderboard score
    was computed that way. A subgroup whose rows hold one class (or none), so that one of its
    AUCs is undefined, is left out of all three means (the competition's code would give NaN).

    Returns:
      ({'jigsaw_bias', 'overall_auc', the three power means, '<part>_<identity>' of every
      scored identity}, the identities left out).
    """
    n = np.asarray(scores).shape[0]
    keep = _valid(weight, n)
    out = {"overall_auc": roc_auc(scores, labels, keep)}
    parts: dict[str, list[float]] = {k: [] for k in BIAS_PARTS}
    left_out = []
    for name, values in identities.items():
        values = np.asarray(values, np.float64)
        aucs = bias_aucs(scores, labels, np.nan_to_num(values, nan=0.0), keep)
        if not all(np.isfinite(v) for v in aucs.values()):
            left_out.append(name)
            continue
        for k, v in aucs.items():
            parts[k].append(v)
            out[f"{k}_{name}"] = v
    for k in BIAS_PARTS:
        out[k] = power_mean(np.asarray(parts[k]), BIAS_POWER)
    out["jigsaw_bias"] = 0.25 * out["overall_auc"] + 0.25 * sum(out[k] for k in BIAS_PARTS)
    return out, left_out


def group_aucs(
    scores: np.ndarray, labels: np.ndarray, groups: np.ndarray, weight: np.ndarray | None = None
) -> tuple[dict[str, float], list[str]]:
    """ROC AUC of each group's rows (`groups`: (N,) a name per row), in sorted order.

    Returns:
      ({group: AUC} of every group whose rows hold both classes, the groups left out because
      their rows hold one class).
    """
    groups = np.asarray(groups)
    keep = _valid(weight, groups.shape[0])
    out, left_out = {}, []
    for name in sorted(set(groups[keep].tolist())):
        auc = roc_auc(scores, labels, keep & (groups == name))
        if np.isfinite(auc):
            out[name] = auc
        else:
            left_out.append(name)
    return out, left_out


def mean_of(values: dict[str, float]) -> float:
    """The unweighted mean of the values (NaN when there are none): each group counts once,
    whatever its number of rows."""
    return float(np.mean(list(values.values()))) if values else float("nan")


def language_aucs(
    scores: np.ndarray, labels: np.ndarray, langs: np.ndarray, weight: np.ndarray | None = None
) -> tuple[dict[str, float], list[str]]:
    """ROC AUC per language (the Multilingual competition's breakdown) and their mean.

    Returns:
      ({'mean_language_auc', 'auc_<lang>' of every language with both classes}, the languages
      left out because their rows hold one class).
    """
    aucs, left_out = group_aucs(scores, labels, langs, weight)
    out = {f"auc_{lang}": v for lang, v in aucs.items()}
    out["mean_language_auc"] = mean_of(aucs)
    return out, left_out


def rank_within(scores: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Each score's rank among its group's scores, scaled to [0, 1] (mid-ranks for ties; 0.5
    for a group of one row): the per-group rank that ensembles of the Agile Community Rules
    competition averaged. It keeps each group's order, so each group's AUC, and their mean,
    are unchanged."""
    scores, groups = np.asarray(scores, np.float64), np.asarray(groups)
    out = np.empty(scores.shape[0], np.float64)
    for name in set(groups.tolist()):
        rows = np.flatnonzero(groups == name)
        if rows.size == 1:
            out[rows] = 0.5
            continue
        out[rows] = (_mid_ranks(scores[rows]) - 1.0) / (rows.size - 1)
    return out
