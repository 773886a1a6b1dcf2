"""Per-row loss weights (`--weight-column`, `--bias-weights`): the Unintended Bias rule against
its written definition, the file's column through the reader and the file cache into the
training batches (validation unweighted), the weighted mean, and bad values in one line. Both
sides training to the same losses with weights is parity_tests' roberta family trajectory."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from jaxtpu.core.data import taskdata
from jaxtpu.core.data.demo import demo_comments
from jaxtpu.core.data.records import IDENTITIES, SUBLABELS
from jaxtpu.core.data.rowweights import bias_weights
from jaxtpu.core.errors import ConfigError, DataError
from jaxtpu.core.flags.presets import tiny


def test_the_bias_rule_is_its_written_definition():
    """docs/competitions/unintended-bias.md: 0.25 for every row; +0.25 for a background positive
    (toxic, no identity mentioned) or a subgroup negative (not toxic, an identity mentioned);
    +0.25 when an identity is mentioned. Mentioned: a column >= 0.5; toxic: target >= 0.5."""
    rng = np.random.default_rng(0)
    n = 400
    target = rng.choice([0.0, 0.2, 0.5, 0.7, 1.0], n)
    ids = {
        k: np.where(rng.random(n) < 0.3, np.nan, rng.choice([0.0, 0.1, 0.5, 0.9], n))
        for k in IDENTITIES[:4]
    }
    got = bias_weights(target, ids)
    for i in range(n):
        mentioned = any(not math.isnan(v[i]) and v[i] >= 0.5 for v in ids.values())
        toxic = target[i] >= 0.5
        expected = {
            (False, False): 0.25,  # background negative
            (True, False): 0.5,  # background positive
            (False, True): 0.75,  # subgroup negative
            (True, True): 0.5,  # subgroup positive
        }[toxic, mentioned]
        assert got[i] == expected, (i, target[i], {k: v[i] for k, v in ids.items()})
    assert set(np.unique(got)) == {0.25, 0.5, 0.75}


def _weighted_csv(path: Path, weights: list[str], extra: dict[str, list[str]] | None = None):
    demo = demo_comments(len(weights), seed=3)
    extra = extra or {}
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "comment_text", "toxic", *SUBLABELS, "w", *extra])
        for i, (t, y, sub) in enumerate(zip(demo.texts, demo.labels, demo.sublabels, strict=True)):
            w.writerow([f"c{i}", t, y, *sub, weights[i], *(v[i] for v in extra.values())])
    return path


def test_a_weight_column_weights_the_training_rows_only(tmp_path, tokenizer):
    """The file's weights reach the training examples (from the file and again from the file
    cache), a batch's row weight is its real-row weight times them, and the validation rows
    keep weight 1."""
    weights = np.round(np.random.default_rng(1).uniform(0, 3, 120), 3)
    weights[::7] = 0.0
    path = _weighted_csv(tmp_path / "w.csv", [f"{x:g}" for x in weights])
    cfg = tiny().replace(train_csv=str(path), weight_column="w", cache_dir=str(tmp_path / "c"))
    for _ in range(2):  # read, then from the file cache
        data = taskdata.load_task_data(cfg, tokenizer)
        train = data.train.row_weights
        assert data.valid.row_weights is None
        both = np.concatenate([train, weights[data.valid_rows]])
        np.testing.assert_allclose(np.sort(both), np.sort(weights.astype(np.float32)))
    idx = np.arange(6)
    real = np.array([1, 1, 1, 1, 0, 0], np.float32)  # two rows pad the batch
    batch = data.train.take(idx, real)
    np.testing.assert_array_equal(batch["row_weight"], real * train[idx])
    np.testing.assert_array_equal(batch["weight"], real)
    np.testing.assert_array_equal(data.valid.take(idx, real)["row_weight"], real)
    plain = taskdata.load_task_data(cfg.replace(weight_column=""), tokenizer)
    assert plain.train.row_weights is None


def test_the_weighted_mean_of_a_batch():
    """sum(w x) / sum(w) with fractional weights (no clamp of the sum at 1), 0 for a batch whose
    weights are all 0 (a padding slot), never NaN."""
    import jax.numpy as jnp

    from jaxtpu.engine.steps import _weighted_mean

    x = jnp.array([1.0, 2.0, 4.0])
    assert float(_weighted_mean(x, jnp.array([0.1, 0.1, 0.0]))) == pytest.approx(1.5)
    assert float(_weighted_mean(x, jnp.array([0.5, 0.0, 1.5]))) == pytest.approx(3.25)
    assert float(_weighted_mean(x, jnp.zeros(3))) == 0.0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", "w=-1 (--weight-column) is outside [0, 3.40282e+38]"),
        ("", "w (--weight-column) is blank"),
        ("heavy", "w='heavy' (--weight-column) is not a number"),
        ("nan", "w=nan (--weight-column) is outside [0, 3.40282e+38]"),
        ("inf", "w=inf (--weight-column) is outside [0, 3.40282e+38]"),  # issue 58: a NaN
        ("1e39", "w=1e39 (--weight-column) is outside [0, 3.40282e+38]"),  # loss at step 2
        ("1e38", "the training rows' weights sum to 1e+38, too close to float32's limit"),
    ],
)
def test_a_bad_weight_is_one_line_naming_the_row(tmp_path, tokenizer, value, message):
    weights = ["1"] * 40
    weights[5] = value
    path = _weighted_csv(tmp_path / "w.csv", weights)
    where = "row 7|line 7" if "sum to" not in message else "--weight-column w"
    with pytest.raises(DataError, match=where) as e:
        taskdata.load_task_data(tiny().replace(train_csv=str(path), weight_column="w"), tokenizer)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_weights_that_cannot_train_are_refused(tmp_path, tokenizer):
    path = _weighted_csv(tmp_path / "w.csv", ["0"] * 40)
    with pytest.raises(DataError, match="every one of the .* training rows has weight 0"):
        taskdata.load_task_data(tiny().replace(train_csv=str(path), weight_column="w"), tokenizer)
    with pytest.raises(DataError, match="--weight-column kg: .* has no such column; found: id,"):
        taskdata.load_task_data(tiny().replace(train_csv=str(path), weight_column="kg"), tokenizer)
    with pytest.raises(DataError, match="--bias-weights: .* has no identity column"):
        taskdata.load_task_data(tiny().replace(train_csv=str(path), bias_weights=True), tokenizer)
    ranking = tiny().replace(train_csv=str(path), weight_column="w", task="ranking")
    with pytest.raises(DataError, match="pairs built from the labels .* carry no row weight"):
        taskdata.load_task_data(ranking, tokenizer)
    with pytest.raises(ConfigError, match="both weight the rows"):
        tiny().replace(weight_column="w", bias_weights=True)
    with pytest.raises(ConfigError, match="--bias-weights weights comments .* ranking"):
        tiny().replace(bias_weights=True, task="ranking")


def test_bias_weights_come_from_the_target_and_identity_columns(tmp_path, tokenizer):
    n = 60
    rng = np.random.default_rng(2)
    male = [("" if rng.random() < 0.3 else f"{rng.choice([0, 0.6]):g}") for _ in range(n)]
    path = _weighted_csv(tmp_path / "b.csv", ["1"] * n, {"male": male})
    cfg = tiny().replace(train_csv=str(path), bias_weights=True)
    data = taskdata.load_task_data(cfg, tokenizer)
    labels = demo_comments(n, seed=3).labels
    train_rows = np.setdiff1d(np.arange(n), data.valid_rows)
    values = np.array([float(m) if m else np.nan for m in male])
    expected = bias_weights(labels[train_rows], {"male": values[train_rows]})
    # the training rows are the file's rows but the validation ones, in a shuffled order
    np.testing.assert_array_equal(np.sort(data.train.row_weights), np.sort(expected))


class _LabelAsLoss:
    """A backend stub whose per-example validation loss is the example's label."""

    def local_rows(self, n: int) -> slice:
        return slice(None)

    def eval_batch(self, batch: dict) -> dict:
        noise = (batch["input_ids"][:, 1] % 7) / 7.0  # a fixed score per comment
        return {"score": batch["label"] * 0.6 + noise, "loss": batch["label"].astype(np.float64)}


def test_weighted_val_loss_weighs_the_validation_loss_alone(tmp_path, tokenizer):
    """--weighted-val-loss: the validation rows get their weights by the same rule, val_loss is
    their weighted mean, and the metric (AUC) does not move."""
    from jaxtpu.core.data.buckets import Batcher
    from jaxtpu.core.run.loop import score_examples

    weights = np.round(np.random.default_rng(4).uniform(0, 3, 120), 3)
    path = _weighted_csv(tmp_path / "w.csv", [f"{x:g}" for x in weights])
    cfg = tiny().replace(train_csv=str(path), weight_column="w")
    plain = taskdata.load_task_data(cfg, tokenizer)
    data = taskdata.load_task_data(cfg.replace(weighted_val_loss=True), tokenizer)
    valid = data.valid
    np.testing.assert_allclose(valid.row_weights, weights[data.valid_rows], rtol=1e-6)
    batcher = Batcher.for_data("none", valid.real_lengths(), 8, 16)
    got, _ = score_examples(_LabelAsLoss(), valid, batcher, cfg.task)
    want, _ = score_examples(_LabelAsLoss(), plain.valid, batcher, cfg.task)
    labels = valid.label.astype(np.float64)
    w = weights[data.valid_rows]
    assert got["val_loss"] == pytest.approx(np.sum(w * labels) / np.sum(w))
    assert want["val_loss"] == pytest.approx(labels.mean())
    assert got["val_auc"] == want["val_auc"] and 0.5 < got["val_auc"] < 1
    with pytest.raises(ConfigError, match="--weighted-val-loss goes with"):
        tiny().replace(weighted_val_loss=True)
