"""A new task is a table row, its metric and one loss: a toy task registered here only
(two outputs, `toxic` and `insult`) trains, predicts and passes preflight with nothing else
changed, and preflight compiles every task of the table (its batch from `Task.batch_layout`)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from jaxtpu import predict, train
from jaxtpu.core import metrics
from jaxtpu.core.flags import presets
from jaxtpu.core.tasks import TASKS, Task, _both_classes
from jaxtpu.engine import steps
from jaxtpu.preflight import fit as pf_fit
from jaxtpu.preflight import targets as pf_targets

TOY = Task(
    name="toxic_insult",
    comments_per_example=1,
    head_dropout=0.1,
    monitor="val_toy_auc",
    metric=lambda s, y, w: {"val_toy_auc": float(np.mean(metrics.column_aucs(s, y, w)))},
    reads=("classification",),
    unit="comments",
    undefined=_both_classes,
    label_columns=("toxic", "insult"),
)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(TASKS, TOY.name, TOY)
    monkeypatch.setitem(steps.LOSSES, TOY.name, steps.LOSSES["multilabel"])  # masked BCE
    return TOY


@pytest.mark.model
def test_a_toy_task_trains_predicts_and_passes_preflight(toy, tmp_path):
    assert toy.batch_layout(16)["label"] == ((2,), "float32")
    cfg = presets.tiny().replace(task=toy.name, max_steps=6, workdir=str(tmp_path / "run"))
    summary = train.train_and_evaluate(cfg)
    assert summary["steps"] == 6 and np.isfinite(summary["final"]["val_toy_auc"])
    record = json.loads((tmp_path / "run" / "config.json").read_text())
    assert record["resolved"]["task"] == toy.name

    texts = tmp_path / "score.csv"
    texts.write_text("id,comment_text\na,thanks for the edit\nb,you are an idiot\n")
    out = tmp_path / "scores.csv"
    args = ["--workdir", str(tmp_path / "run"), "--input", str(texts), "--output", str(out)]
    assert predict.main(args) == 0
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["id", "toxic", "insult"] and [r[0] for r in rows[1:]] == ["a", "b"]
    assert all(0.0 <= float(x) <= 1.0 for r in rows[1:] for x in r[1:])

    devices, capacity = pf_targets.target_devices("cpu", 8)
    report = pf_fit.check(cfg, "cpu", devices, capacity, flops=False)
    assert report.fits and report.total > 0 and not report.error


@pytest.mark.model
@pytest.mark.parametrize("task", sorted(TASKS))
def test_preflight_compiles_every_task_of_the_table(task):
    devices, capacity = pf_targets.target_devices("cpu", 8)
    cfg = presets.tiny().replace(task=task, parallel="jit")
    report = pf_fit.check(cfg, "cpu", devices, capacity, flops=False)
    assert report.fits and report.params > 0 and report.total > 0 and not report.error
