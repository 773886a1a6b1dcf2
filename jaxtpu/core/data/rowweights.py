"""Per-row weights of the training loss: a column of the file (`--weight-column`) or the
Unintended Bias rule (`--bias-weights`), checked and summarised (framework-free).

The loss of a batch is then sum(w x loss) / sum(w) on both sides (`Task.batch_layout`'s
`row_weight`); validation rows are never weighted."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from jaxtpu.core.data.records import Comments, NumberColumn, Pairs
from jaxtpu.core.errors import DataError

log = logging.getLogger(__name__)

# The Unintended Bias weights of detoxify's `JigsawDataBiasBERT.compute_weigths` (credited there
# to the competition's 2nd-place solution): every row BASE, plus BIAS_TERM for a background
# positive (toxic, no identity) or a subgroup negative (non-toxic, an identity), plus BIAS_TERM
# for any identity mention. An identity is mentioned when its column is >= 0.5 (blank = 0); a
# comment is toxic when target >= 0.5.
BIAS_BASE, BIAS_TERM, BIAS_THRESHOLD = 0.25, 0.25, 0.5


# A weight must be a float32 number (1e39 or inf became a NaN loss at step 2), and all of them
# together far from float32's end: a batch's loss sums weight x loss in float32. Only their
# ratios matter, so a column that large can be scaled down.
MAX_WEIGHT = float(np.finfo(np.float32).max)
MAX_WEIGHT_SUM = 1e30


def weight_columns(cfg: Any) -> dict[str, NumberColumn]:
    """The numeric columns the training file must have for the run's row weights."""
    name = cfg.data.weight_column
    rule = NumberColumn("--weight-column", blank_ok=False, lo=0.0, hi=MAX_WEIGHT)
    return {name: rule} if name else {}


def bias_weights(target: np.ndarray, identities: dict[str, np.ndarray]) -> np.ndarray:
    """The `--bias-weights` rule (constants above) of comments with this `target` (N,) and
    identity columns ({name: (N,)}, NaN where blank): (N,) float32 in {0.25, 0.5, 0.75}."""
    mentioned = np.zeros(len(target), bool)
    for values in identities.values():
        mentioned |= np.nan_to_num(values, nan=0.0) >= BIAS_THRESHOLD
    toxic = np.asarray(target) >= BIAS_THRESHOLD
    weights = np.full(len(target), BIAS_BASE, np.float32)
    weights[toxic != mentioned] += BIAS_TERM  # background positive or subgroup negative
    weights[mentioned] += BIAS_TERM
    return weights


def row_weights(
    data: Comments | Pairs, cfg: Any, source: str, split: str = "training"
) -> np.ndarray | None:
    """The loss weights the config asks for of a split's rows (None: every row 1), refused
    when they cannot be used (every weight 0, no identity column) and summarised in the log."""
    d = cfg.data
    if d.weight_column:
        if d.weight_column not in data.columns and isinstance(data, Pairs):  # built from labels
            raise DataError(
                f"--weight-column {d.weight_column}: the {cfg.train.task} task trains on pairs "
                f"built from the labels of {source}, which carry no row weight; give a pairs "
                f"file (less_toxic, more_toxic, {d.weight_column})"
            )
        if d.weight_column not in data.columns:
            raise DataError(f"--weight-column {d.weight_column}: {source} has no such column")
        weights, how = data.columns[d.weight_column], f"--weight-column {d.weight_column}"
    elif d.bias_weights:
        assert isinstance(data, Comments) and data.labels is not None
        if not data.groups.identities:
            raise DataError(
                f"--bias-weights: {source} has no identity column (the Unintended Bias file's "
                "male, female, ..., psychiatric_or_mental_illness)"
            )
        weights, how = bias_weights(data.labels, data.groups.identities), "--bias-weights"
    else:
        return None
    total = float(np.sum(weights, dtype=np.float64))
    if total > MAX_WEIGHT_SUM:
        raise DataError(
            f"{how}: the {split} rows' weights sum to {total:.3g}, too close to float32's "
            f"limit for the loss (weight x loss is summed in float32); divide them by a "
            f"constant (only their ratios matter)"
        )
    weights = np.asarray(weights, np.float32)
    if not weights.any():
        raise DataError(f"{how}: every one of the {len(weights)} {split} rows has weight 0")
    zero = int((weights == 0).sum())
    valid = "" if split != "training" or cfg.data.weighted_val_loss else "; validation unweighted"
    log.info(
        "row weights (%s): mean %.3g, min %.3g, max %.3g over %d %s rows%s%s",
        how,
        weights.mean(),
        weights.min(),
        weights.max(),
        len(weights),
        split,
        f", {zero} at 0" if zero else "",
        valid,
    )
    return weights
