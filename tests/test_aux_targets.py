"""Auxiliary targets (`--aux-columns`, `--aux-weight`): the task table's extra outputs, their
labels from the file, the loss, what predictions and metrics read (the task's own outputs),
bad values in one line, and a run through predict, the Python API, evaluate and export. Both
sides training to the same losses with them is parity_tests' roberta family trajectory."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from jaxtpu.core.data import taskdata
from jaxtpu.core.data.demo import demo_comments
from jaxtpu.core.data.records import SUBLABELS
from jaxtpu.core.errors import ConfigError, DataError
from jaxtpu.core.flags.presets import tiny
from jaxtpu.core.tasks import get_task

AUX = ("severe_toxicity", "male")


def test_the_task_table_carries_the_extra_outputs():
    plain, task = get_task("toxicity"), get_task("toxicity").with_aux(AUX, 0.5)
    assert plain.with_aux((), 0.5) is plain
    assert (task.outputs, task.main_outputs, task.label_shape) == (3, 1, (3,))
    assert task.batch_layout(8)["label"] == ((3,), "float32")
    scores = np.array([[0.0, 5.0, -5.0], [2.0, -1.0, 1.0]])
    np.testing.assert_array_equal(task.main(scores), [0.0, 2.0])
    assert task.score_columns() == ("toxic",) and task.score_columns(True) == ("toxic", *AUX)
    np.testing.assert_allclose(task.predictions(scores)[:, 0], 1 / (1 + np.exp(-scores[:, 0])))
    assert task.predictions(scores, every=True).shape == (2, 3)
    multi = get_task("multilabel").with_aux(AUX, 1.0)
    assert multi.outputs == 8 and multi.main(np.zeros((4, 8))).shape == (4, 6)


def test_the_metrics_read_the_tasks_outputs_alone():
    """The same scores of `toxic` give the same AUC whatever the auxiliary outputs hold."""
    rng = np.random.default_rng(0)
    n = 64
    labels = np.column_stack([rng.integers(0, 2, n), rng.random(n), rng.random(n)])
    scores = np.column_stack([labels[:, 0] + rng.normal(0, 1, n), rng.normal(0, 9, (n, 2))])
    task, plain = get_task("toxicity").with_aux(AUX, 1.0), get_task("toxicity")
    losses, weight = np.ones(n), np.ones(n)
    got = task.validation_metrics(scores, labels, losses, weight)
    want = plain.validation_metrics(scores[:, 0], labels[:, 0], losses, weight)
    assert got == want and 0.5 < got["val_auc"] < 1.0


def test_the_loss_adds_the_weighted_mean_bce_of_the_known_auxiliary_targets():
    import jax.numpy as jnp

    from jaxtpu.engine.steps import task_loss

    def bce(x: float, y: float) -> float:  # BCE with logits, written out
        return max(x, 0.0) - x * y + float(np.log1p(np.exp(-abs(x))))

    task = get_task("toxicity").with_aux(AUX, 0.3)
    scores = jnp.array([[0.5, -1.0, 2.0], [-0.2, 0.7, 0.1]])
    label = jnp.array([[1.0, 0.25, jnp.nan], [0.0, jnp.nan, jnp.nan]])
    expected = [
        bce(0.5, 1.0) + 0.3 * bce(-1.0, 0.25),  # one known auxiliary target
        bce(-0.2, 0.0),  # none known: the task's loss alone
    ]
    np.testing.assert_allclose(task_loss(task)(scores, label), expected, rtol=1e-6)
    np.testing.assert_allclose(
        task_loss(get_task("toxicity"))(scores[:, 0], label[:, 0]), [bce(0.5, 1.0), bce(-0.2, 0.0)]
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"task": "ranking"}, "the ranking task scores pairs"),
        ({"aux_columns": "male,male"}, "expected distinct column names"),
        ({"aux_columns": "male,"}, "expected distinct column names"),
        ({"aux_columns": "target"}, "target is the toxicity task's own label"),
        ({"task": "multilabel", "aux_columns": "obscene"}, "obscene is the multilabel task's"),
        ({"aux_columns": "", "aux_weight": 0.5}, "--aux-weight 0.5 applies with --aux-columns"),
        ({"weight_column": "male"}, "--weight-column male is also in --aux-columns"),
        ({"aux_weight": -1.0}, "--aux-weight must be >= 0"),
    ],
)
def test_a_config_the_targets_cannot_train_is_one_line(changes, message):
    with pytest.raises(ConfigError, match=message):
        tiny().replace(**{"aux_columns": "male", **changes})


def _csv(path: Path, n: int, aux: dict[str, list[str]]) -> Path:
    demo = demo_comments(n, seed=3)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "comment_text", "toxic", *SUBLABELS, *aux])
        for i, (t, y, sub) in enumerate(zip(demo.texts, demo.labels, demo.sublabels, strict=True)):
            w.writerow([f"c{i}", t, y, *sub, *(v[i] for v in aux.values())])
    return path


def _aux_values(n: int, seed: int = 0) -> dict[str, list[str]]:
    rng = np.random.default_rng(seed)
    return {c: ["" if rng.random() < 0.3 else f"{rng.random():.3f}" for _ in range(n)] for c in AUX}


def test_the_targets_come_from_the_file_blank_unscored(tmp_path, tokenizer):
    values = _aux_values(80)
    path = _csv(tmp_path / "a.csv", 80, values)
    valid = _csv(tmp_path / "v.csv", 30, {})  # a validation file without them
    cfg = tiny().replace(train_csv=str(path), aux_columns=",".join(AUX), valid_csv=str(valid))
    data = taskdata.load_task_data(cfg, tokenizer)
    assert data.train.label.shape == (80, 3) and data.valid.label.shape == (30, 3)
    assert np.isnan(data.valid.label[:, 1:]).all() and not np.isnan(data.valid.label[:, 0]).any()
    file_values = np.array([[float(v) if v else np.nan for v in values[c]] for c in AUX]).T
    got = np.sort(np.nan_to_num(data.train.label[:, 1:], nan=-1), 0)
    np.testing.assert_allclose(got, np.sort(np.nan_to_num(file_values, nan=-1), 0), atol=1e-6)
    bad = {**values, "male": ["1.5", *values["male"][1:]]}
    with pytest.raises(DataError, match=r"male=1.5 \(--aux-columns\) is outside \[0, 1\]"):
        taskdata.load_task_data(
            cfg.replace(train_csv=str(_csv(tmp_path / "b.csv", 80, bad))), tokenizer
        )
    with pytest.raises(DataError, match="--aux-columns severe_toxicity: .* has no such column"):
        taskdata.load_task_data(cfg.replace(train_csv=str(valid), valid_csv=None), tokenizer)


@pytest.mark.model
def test_a_run_with_targets_predicts_its_own_columns_unless_asked(tmp_path, capsys):
    """A tiny run with two auxiliary targets: predict writes `toxic` alone, --all-outputs every
    output; the Python API does the same; evaluate reports the task's metric; export writes
    the task's head unless asked for every output."""
    from jaxtpu import api, evaluate, export, predict, train

    path = _csv(tmp_path / "a.csv", 120, _aux_values(120))
    wd = tmp_path / "run"
    cfg = tiny().replace(
        train_csv=str(path), aux_columns=",".join(AUX), aux_weight=0.5, max_steps=3, workdir=str(wd)
    )
    train.train_and_evaluate(cfg)
    saved = json.loads((wd / "config.json").read_text())["config"]["train"]
    assert (saved["aux_columns"], saved["aux_weight"]) == (",".join(AUX), 0.5)
    header = (wd / "valid_scores.csv").read_text().splitlines()[0]
    assert header == "row,toxic"
    base = ["--workdir", str(wd), "--input", str(path), "--num-devices", "1"]
    assert predict.main([*base, "--output", str(tmp_path / "p.csv")]) == 0
    assert predict.main([*base, "--output", str(tmp_path / "all.csv"), "--all-outputs"]) == 0
    lines = (tmp_path / "p.csv").read_text().splitlines()
    every = (tmp_path / "all.csv").read_text().splitlines()
    assert lines[0] == "id,toxic" and every[0] == "id,toxic," + ",".join(AUX)
    assert [x.split(",")[:2] for x in every[1:]] == [x.split(",") for x in lines[1:]]
    model = api.load(wd, num_devices=1)
    texts = ["you are lovely", "you are an idiot"]
    probs = model.predict(texts)
    assert probs.shape == (2,)
    assert set(model.predict(texts, all_outputs=True)) == {"toxic", *AUX}
    capsys.readouterr()
    assert evaluate.main(["--workdir", str(wd), "--input", str(path), "--num-devices", "1"]) == 0
    out = capsys.readouterr().out
    auc = float(out.split("\n  auc: ")[1].split()[0])
    # the task's AUC, of the scores predict wrote for `toxic`
    from jaxtpu.core import metrics

    scored = np.array([float(x.split(",")[1]) for x in lines[1:]])
    labels = demo_comments(120, seed=3).labels
    assert auc == pytest.approx(metrics.roc_auc(scored, labels, np.ones(120)), abs=2e-6)
    # export: the task's head alone by default (a plain toxicity head), every output on request
    from safetensors.numpy import load_file

    assert export.main(["--workdir", str(wd), "--out", str(tmp_path / "hf")]) == 0
    argv = ["--workdir", str(wd), "--out", str(tmp_path / "all"), "--all-outputs"]
    assert export.main(argv) == 0
    heads = {}
    for name, outputs in (("hf", ["toxic"]), ("all", ["toxic", *AUX])):
        assert json.loads((tmp_path / name / "jaxtpu_head.json").read_text())["outputs"] == outputs
        heads[name] = load_file(str(tmp_path / name / "head.safetensors"))
    assert heads["hf"]["classifier.weight"].shape[0] == 1 and heads["all"][
        "classifier.bias"
    ].shape == (3,)
    np.testing.assert_array_equal(
        heads["hf"]["classifier.weight"], heads["all"]["classifier.weight"][:1]
    )


def test_columns_of_the_built_in_demo_data_are_refused(tokenizer):
    """The generated demo comments have no columns to weigh or learn: refused, not trained
    with blank targets."""
    for changes in ({"aux_columns": "male"}, {"weight_column": "w"}):
        cfg = tiny().replace(train_csv="", **changes)
        with pytest.raises(DataError, match="built-in demo data .* has no such column"):
            taskdata.load_task_data(cfg, tokenizer)
