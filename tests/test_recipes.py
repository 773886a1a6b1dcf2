"""The notebook as written (issue 27): the file's own folds, folds of pairs that keep every
comment on one side, folds stratified over the six labels, the notebooks' `.sample(n=...)`,
and the `lr` a metrics line reports."""

from __future__ import annotations

import json

import numpy as np
import pytest

from jaxtpu.core import data as jdata
from jaxtpu.core import presets
from jaxtpu.core.errors import ConfigError, DataError
from jaxtpu.core.tasks import LABELS


def _fold_file(tmp_path, folds, name="train_5folds.csv"):
    path = tmp_path / name
    rows = [f"{i},comment number {i},{i % 3 == 0:d},{f}" for i, f in enumerate(folds)]
    path.write_text("id,comment_text,toxic,kfold\n" + "\n".join(rows) + "\n")
    return path


def test_the_files_fold_column_is_the_split(tmp_path):
    from jaxtpu.core.tokens import load_tokenizer

    folds = np.arange(60) % 5
    cfg = presets.tiny().replace(train_csv=str(_fold_file(tmp_path, folds)), fold_column="kfold",
                                 fold=3, max_len=8)  # fmt: skip
    data = jdata.load_task_data(cfg, load_tokenizer(cfg_tokenizer()))
    assert len(data.valid) == 12 and len(data.train) == 48
    assert np.array_equal(data.valid_rows, np.flatnonzero(folds == 3))
    assert "fold 3 of the file's kfold (5 folds)" in data.info["split"]


def cfg_tokenizer() -> str:
    from jaxtpu.core.encoder import packaged_minilm_dir

    return packaged_minilm_dir()


@pytest.mark.parametrize(
    "folds, flags, message",
    [
        ([0] * 20, {"fold": 0}, "every row of .* is in fold 0; k-fold needs at least two folds"),
        ([0, 1] * 10, {"fold": 4}, "--fold 4: no row of .* has kfold = 4; its folds are 0, 1"),
        (["x"] * 20, {"fold": 0}, r"line 2: kfold='x' is not a fold number"),
    ],
)
def test_bad_fold_columns_are_one_line(tmp_path, folds, flags, message):
    cfg = presets.tiny().replace(train_csv=str(_fold_file(tmp_path, folds)), fold_column="kfold",
                                 max_len=8, **flags)  # fmt: skip
    with pytest.raises(DataError, match=message):
        jdata.load_task_data(cfg, None)


def test_a_fold_column_with_n_folds_is_refused():
    with pytest.raises(ConfigError, match="--fold-column kfold takes the folds from the file"):
        presets.tiny().replace(fold_column="kfold", n_folds=5)


def test_pair_folds_keep_every_comment_on_one_side():
    rng = np.random.default_rng(0)
    # 40 small groups of pairs that share comments, and one group too large for a fold
    less, more = [], []
    for g in range(40):
        texts = [f"g{g}c{i}" for i in range(3)]
        less += [texts[0], texts[1]]
        more += [texts[1], texts[2]]
    big = [f"big{i}" for i in range(30)]
    for _ in range(60):
        a, b = rng.choice(30, 2, replace=False)
        less.append(big[a])
        more.append(big[b])
    pairs = jdata.Pairs("p", less, more)
    groups = jdata.comment_groups(pairs)
    assert np.unique(groups).size == 41
    for fold in range(5):
        train, valid, lost = jdata.pair_split(pairs, 0.1, 0, n_folds=5, fold=fold)
        seen = {t for i in train for t in (pairs.less[i], pairs.more[i])}
        held = {t for i in valid for t in (pairs.less[i], pairs.more[i])}
        assert not seen & held
        assert train.size + valid.size + lost == len(pairs)
        assert 0 < lost < 60  # only pairs of the large group can straddle
    # the small groups are whole: each group's pairs sit in one fold
    less_f, more_f = jdata.pair_folds(pairs, 5, 0)
    small = [g for g in np.unique(groups) if (groups == g).sum() == 2]
    assert len(small) == 40
    for g in small:
        assert len(set(less_f[groups == g]) | set(more_f[groups == g])) == 1


def test_multilabel_folds_are_stratified_over_the_labels():
    rng = np.random.default_rng(1)
    n = 500
    labels = (rng.random(n) < 0.3).astype(np.float32)
    subs = (rng.random((n, 5)) < [0.05, 0.2, 0.02, 0.2, 0.1]).astype(np.float32)
    c = jdata.Comments("c", [f"t{i}" for i in range(n)], labels, subs)
    folds = jdata.fold_assignment(c, 5, seed=0, label_columns=LABELS)
    y = jdata.labels_of(c, LABELS)
    for j in range(6):
        per_fold = [y[folds == f, j].sum() for f in range(5)]
        assert max(per_fold) - min(per_fold) <= 2, (LABELS[j], per_fold)


def test_subsample_is_seeded_stratified_and_of_the_asked_size():
    rng = np.random.default_rng(2)
    labels = (rng.random(1000) < 0.25).astype(np.float32)
    c = jdata.Comments("c", [f"t{i}" for i in range(1000)], labels)
    a = jdata.subsample(c, 400, 0, ("toxic",))
    assert a.size == 400 and np.unique(a).size == 400
    assert np.array_equal(a, jdata.subsample(c, 400, 0, ("toxic",)))
    assert not np.array_equal(a, jdata.subsample(c, 400, 1, ("toxic",)))
    assert labels[a].sum() == round(400 * labels.mean())


def test_the_lr_of_a_metrics_line_is_the_rate_its_step_trained_with(tmp_path):
    """A linear schedule over 7 updates: step s trained at lr x (7 - (s - 1)) / 7."""
    from test_fake_backend import FakeBackend, _run

    _run(tmp_path, FakeBackend({}), epochs=1, schedule="linear", lr=1e-3)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lrs = {x["step"]: x["lr"] for x in lines if x["event"] == "train"}
    assert lrs[1] == pytest.approx(1e-3)
    for step, lr in lrs.items():
        assert lr == pytest.approx(1e-3 * (7 - (step - 1)) / 7, rel=1e-6), step
