"""The Python API (`jaxtpu.api`): `jaxtpu.load(run).predict(texts)` for any iterable of texts,
and one line for a directory that is not a run."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxtpu.core.errors import UserError


@pytest.mark.e2e
@pytest.mark.model
def test_predict_scores_every_item_of_any_iterable(finished_run):
    import jaxtpu

    model = jaxtpu.load(finished_run, num_devices=1)
    texts = ["thanks for the edit", "you are an idiot", "ok"]
    scores = model.predict(texts)
    assert scores.shape == (3,)
    assert np.array_equal(model.predict(t for t in texts), scores)  # a generator, read once
    assert np.array_equal(model.predict(tuple(texts)), scores)
    with pytest.raises(UserError, match="item 1 is int"):
        model.predict(["fine", 3])
    with pytest.raises(UserError, match="not one"):
        model.predict("one string")


@pytest.mark.parametrize(
    "config, message",
    [
        (None, "no config.json; not a jaxtpu run directory"),
        ({"model_type": "bert", "hidden_size": 8}, "is a Hugging Face model directory"),
        ({"something": 1}, "its config.json is not a jaxtpu run's"),
        ([1, 2], "its config.json is not a jaxtpu run's"),
    ],
    ids=["empty", "hugging face", "other json", "not an object"],
)
def test_loading_a_directory_that_is_not_a_run_is_one_line(tmp_path, config, message):
    import jaxtpu

    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=message):
        jaxtpu.load(tmp_path, num_devices=1)
    with pytest.raises(UserError, match="no such run directory"):
        jaxtpu.load(tmp_path / "missing", num_devices=1)


def test_scoring_takes_every_local_device_by_default_and_makes_no_virtual_ones(monkeypatch):
    """0 (the scoring commands' default, the API's None): the devices JAX has, one on a CPU
    unless virtual ones were asked for; a number asks for that many, as training does."""
    import jax

    from jaxtpu.engine import hosts

    fake = [type("D", (), {"id": i, "platform": "cpu"})() for i in (3, 1, 2)]
    asked = []
    monkeypatch.setattr(jax, "local_devices", lambda: fake)
    monkeypatch.setattr(hosts, "init_devices", lambda n: asked.append(n) or fake[:n])
    assert [d.id for d in hosts.scoring_devices(0)] == [1, 2, 3] and asked == []
    assert hosts.scoring_devices(2) == fake[:2] and asked == [2]
    import jaxtpu

    with pytest.raises(UserError, match="num_devices must be >= 1"):
        jaxtpu.load("anywhere", num_devices=0)


def test_a_rules_models_pairs_are_checked_as_train_and_predict_check_rows():
    """An empty rule is refused before anything is scored (train and predict refuse such a
    row), as is an item that is not a pair of strings."""
    from jaxtpu.api import Model
    from jaxtpu.core.errors import UserError
    from jaxtpu.core.tasks import get_task
    from jaxtpu.core.textformat import TextFormat

    model = Model.__new__(Model)  # no scorer: the checks come before any scoring
    model.task, model.text_format = get_task("rules"), TextFormat("pair", "{rule}", rules=True)
    with pytest.raises(UserError, match="item 1's rule is empty"):
        model.logits([("No ads", "buy now"), ("  ", "a comment")])
    with pytest.raises(UserError, match="item 0 is str"):
        model.logits(["a comment"])
