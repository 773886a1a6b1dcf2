"""`--task multilabel`: the six Jigsaw labels, blank sub-labels masked in the loss and the
metric, the same loss on both sides, training and the Kaggle submission."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from jaxtpu import predict, train
from jaxtpu.core.data import demo, readers, tokenized
from jaxtpu.core.flags import presets
from jaxtpu.core.tasks import LABELS, SEVERITY_WEIGHTS, get_task
from jaxtpu.engine import steps

torch = pytest.importorskip("torch", reason="the torch side's loss is compared")


def test_real_rows_with_blank_sub_labels_keep_toxic_only():
    comments = readers.read_comments(demo.SAMPLE_CSV)
    labels = tokenized.labels_of(comments, LABELS)
    assert labels.shape == (len(comments), 6)
    blank = np.isnan(labels[:, 1:]).all(1)
    assert 0.1 < blank.mean() < 0.5  # the sample has rows labelled for toxic only
    assert not np.isnan(labels[:, 0]).any()
    assert np.array_equal(labels[:, 0], comments.labels)
    assert (np.isnan(labels[:, 1:]).any(1) == blank).all()  # blank is all five or none


def test_masked_loss_is_the_mean_over_known_labels_and_the_same_on_both_sides():
    from torchxla_ref import steps as torch_steps

    rng = np.random.default_rng(0)
    scores = rng.normal(size=(5, 6)).astype(np.float32) * 3
    labels = (rng.random((5, 6)) < 0.4).astype(np.float32)
    labels[1, 1:] = np.nan  # toxic only
    labels[3, [2, 4]] = np.nan
    ours = np.asarray(steps.LOSSES["multilabel"](scores, labels, 0.5))
    theirs = torch_steps.LOSSES["multilabel"](torch.tensor(scores), torch.tensor(labels), 0.5)
    theirs = theirs.numpy()
    # independent: log-loss of the known entries, averaged per row
    p = 1 / (1 + np.exp(-scores.astype(np.float64)))
    bce = -(labels * np.log(p) + (1 - labels) * np.log(1 - p))
    known = ~np.isnan(labels)
    expected = np.where(known, bce, 0).sum(1) / known.sum(1)
    np.testing.assert_allclose(ours, expected, rtol=1e-5)
    np.testing.assert_allclose(theirs, expected, rtol=1e-5)

    # no NaN reaches the gradient, and a blank label gets none
    import jax

    grad = np.asarray(jax.grad(lambda s: steps.LOSSES["multilabel"](s, labels, 0.5).sum())(scores))
    assert np.isfinite(grad).all() and (grad[~known] == 0).all()


def test_metric_is_the_mean_column_auc_over_known_rows_and_skips_one_class_columns():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(1)
    n = 200
    labels = (rng.random((n, 6)) < 0.3).astype(np.float32)
    labels[:, 3] = 0.0  # threat: one class, no AUC
    labels[rng.random(n) < 0.3, 1:] = np.nan
    scores = labels * 0.5 + rng.normal(size=(n, 6))
    scores = np.nan_to_num(scores)
    weight = np.ones(n, np.float32)
    weight[-10:] = 0  # eval padding rows
    got = get_task("multilabel").metric(scores, labels, weight)
    expected = {}
    for j, name in enumerate(LABELS):
        rows = ~np.isnan(labels[:, j]) & (weight > 0)
        if j != 3:
            expected[name] = roc_auc_score(labels[rows, j], scores[rows, j])
    assert set(got) == {"val_mean_auc", *(f"val_auc_{k}" for k in expected)}
    for name, value in expected.items():
        assert got[f"val_auc_{name}"] == pytest.approx(value, abs=1e-12)
    assert got["val_mean_auc"] == pytest.approx(np.mean(list(expected.values())), abs=1e-12)


@pytest.mark.model
def test_trains_on_real_comments_and_predict_writes_the_kaggle_columns(tmp_path):
    workdir = tmp_path / "run"
    cfg = presets.tiny().replace(
        task="multilabel",
        train_csv="sample",
        max_rows=320,
        max_len=32,
        epochs=2,
        parallel="pmap",
        workdir=str(workdir),
        log_every=1,
    )
    summary = train.train_and_evaluate(cfg)
    assert summary["train_compiles"] == 1
    evals = [
        json.loads(x)
        for x in (workdir / "metrics.jsonl").read_text().splitlines()
        if json.loads(x).get("event") == "eval"
    ]
    last = evals[-1]
    per_label = [last[k] for k in last if k.startswith("val_auc_")]
    assert "val_auc_toxic" in last and len(per_label) >= 3
    assert last["val_mean_auc"] == pytest.approx(np.mean(per_label))
    losses = [
        json.loads(x)["loss"]
        for x in (workdir / "metrics.jsonl").read_text().splitlines()
        if json.loads(x).get("event") == "train"
    ]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]

    src = tmp_path / "to_score.csv"
    src.write_text("id,comment_text\nx1,you are an idiot\nx2,thanks for the citation\n")
    out = tmp_path / "submission.csv"
    assert predict.main(["--workdir", str(workdir), "--input", str(src), "--output", str(out)]) == 0
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["id", *LABELS]
    assert [r[0] for r in rows[1:]] == ["x1", "x2"]
    probs = np.array([[float(v) for v in r[1:]] for r in rows[1:]])
    assert probs.shape == (2, 6) and ((probs > 0) & (probs < 1)).all()

    # a Rate Severity file is ranked by the severity weights of the six probabilities
    src = tmp_path / "comments_to_score.csv"
    src.write_text("comment_id,text\nx1,you are an idiot\nx2,thanks for the citation\n")
    out = tmp_path / "severity.csv"
    assert predict.main(["--workdir", str(workdir), "--input", str(src), "--output", str(out)]) == 0
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["comment_id", "score"]
    np.testing.assert_allclose([float(r[1]) for r in rows[1:]], probs @ SEVERITY_WEIGHTS, rtol=1e-5)

    # Its exports load back into the tool that wrote them: the state dict through --init-from
    # (with the HF export's config.json and tokenizer) gives the trained weights exactly, as a
    # multi-label model; a toxicity run is told what the file is.
    from jax.tree_util import tree_leaves_with_path

    from jaxtpu import export
    from jaxtpu.core.errors import CheckpointError
    from jaxtpu.core.flags.runspec import RunSpec
    from jaxtpu.engine import scoring, weights

    hf, sd = tmp_path / "hf", tmp_path / "model.bin"
    assert export.main(["--workdir", str(workdir), "--out", str(hf)]) == 0
    assert export.main(["--workdir", str(workdir), "--out", str(sd), "--format", "state-dict"]) == 0
    back = cfg.replace(init_from=str(sd), model_dir=str(hf), workdir="")
    loaded = weights.load_model(back, RunSpec.resolve(back, 1), head_required=True)
    trained = dict(tree_leaves_with_path(scoring.load_trained(workdir).params))
    for path, leaf in tree_leaves_with_path(loaded.params):
        np.testing.assert_array_equal(np.asarray(leaf), np.asarray(trained[path]), str(path))
    as_toxicity = back.replace(task="toxicity")
    with pytest.raises(CheckpointError, match="its head scores 6 outputs per comment"):
        weights.load_model(as_toxicity, RunSpec.resolve(as_toxicity, 1), head_required=True)

    # jaxtpu.evaluate scores a labelled file by the Kaggle metric, as validation does.
    from jaxtpu import evaluate

    report = tmp_path / "eval.json"
    argv = ["--workdir", str(workdir), "--input", str(demo.SAMPLE_CSV), "--out", str(report)]
    assert evaluate.main(argv) == 0
    got = json.loads(report.read_text())
    assert got["metric"] == "mean_column_auc" and got["examples"] == len(
        readers.read_comments(demo.SAMPLE_CSV)
    )
    assert got["value"] == pytest.approx(
        np.mean([got[f"auc_{k}"] for k in LABELS if f"auc_{k}" in got])
    )
