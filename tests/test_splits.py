"""Splits and folds (`jaxtpu.core.data.splits`, `pairing`, `jaxtpu.core.run.folds`): the
file's own folds, folds of pairs that keep every comment on one side, folds stratified
over the six labels, `--subsample`, a one-class validation set, and `--all-folds`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import (
    SIDE_COMMANDS,
    TOXIC_HEADER,
    cli,
    one_line,
)

from jaxtpu.core.data import demo, pairing, records, splits, taskdata, tokenized
from jaxtpu.core.errors import ConfigError, DataError
from jaxtpu.core.flags import presets
from jaxtpu.core.tasks import LABELS


@pytest.mark.e2e
@pytest.mark.parametrize("side", SIDE_COMMANDS)
def test_a_validation_set_with_one_class_is_refused_at_the_start(tmp_path, side):
    module, base = SIDE_COMMANDS[side]
    train_csv = tmp_path / "train.csv"
    train_csv.write_text(TOXIC_HEADER + "".join(f"{i},comment {i},{i % 2}\n" for i in range(64)))
    valid_csv = tmp_path / "valid.csv"
    valid_csv.write_text(TOXIC_HEADER + "".join(f"{i},fine comment {i},0\n" for i in range(20)))
    proc = cli(
        module,
        *base,
        "--workdir",
        tmp_path / "run",
        "--train-csv",
        train_csv,
        "--valid-csv",
        valid_csv,
    )
    one_line(proc, "all 20 labels are non-toxic, so val_auc is undefined")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def _fold_file(tmp_path, folds, name="train_5folds.csv"):
    path = tmp_path / name
    rows = [f"{i},comment number {i},{i % 3 == 0:d},{f}" for i, f in enumerate(folds)]
    path.write_text("id,comment_text,toxic,kfold\n" + "\n".join(rows) + "\n")
    return path


def test_the_files_fold_column_is_the_split(tmp_path):
    from jaxtpu.core.data.tokens import load_tokenizer

    folds = np.arange(60) % 5
    cfg = presets.tiny().replace(
        train_csv=str(_fold_file(tmp_path, folds)), fold_column="kfold", fold=3, max_len=8
    )
    data = taskdata.load_task_data(cfg, load_tokenizer(cfg_tokenizer()))
    assert len(data.valid) == 12 and len(data.train) == 48
    assert np.array_equal(data.valid_rows, np.flatnonzero(folds == 3))
    assert "fold 3 of the file's kfold (5 folds)" in data.info["split"]


def cfg_tokenizer() -> str:
    from jaxtpu.core.hf.encoder import packaged_minilm_dir

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
    cfg = presets.tiny().replace(
        train_csv=str(_fold_file(tmp_path, folds)), fold_column="kfold", max_len=8, **flags
    )
    with pytest.raises(DataError, match=message):
        taskdata.load_task_data(cfg, None)


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
    pairs = records.Pairs("p", less, more)
    groups = pairing.comment_groups(pairs)
    assert np.unique(groups).size == 41
    for fold in range(5):
        train, valid, lost = splits.pair_split(pairs, 0.1, 0, n_folds=5, fold=fold)
        seen = {t for i in train for t in (pairs.less[i], pairs.more[i])}
        held = {t for i in valid for t in (pairs.less[i], pairs.more[i])}
        assert not seen & held
        assert train.size + valid.size + lost == len(pairs)
        assert 0 < lost < 60  # only pairs of the large group can straddle
    # the small groups are whole: each group's pairs sit in one fold
    less_f, more_f = pairing.pair_folds(pairs, 5, 0)
    small = [g for g in np.unique(groups) if (groups == g).sum() == 2]
    assert len(small) == 40
    for g in small:
        assert len(set(less_f[groups == g]) | set(more_f[groups == g])) == 1


def test_multilabel_folds_are_stratified_over_the_labels():
    rng = np.random.default_rng(1)
    n = 500
    labels = (rng.random(n) < 0.3).astype(np.float32)
    subs = (rng.random((n, 5)) < [0.05, 0.2, 0.02, 0.2, 0.1]).astype(np.float32)
    c = records.Comments("c", [f"t{i}" for i in range(n)], labels, subs)
    folds = splits.fold_assignment(c, 5, seed=0, label_columns=LABELS)
    y = tokenized.labels_of(c, LABELS)
    for j in range(6):
        per_fold = [y[folds == f, j].sum() for f in range(5)]
        assert max(per_fold) - min(per_fold) <= 2, (LABELS[j], per_fold)


def test_subsample_is_seeded_stratified_and_of_the_asked_size():
    rng = np.random.default_rng(2)
    labels = (rng.random(1000) < 0.25).astype(np.float32)
    c = records.Comments("c", [f"t{i}" for i in range(1000)], labels)
    a = splits.subsample(c, 400, 0, ("toxic",))
    assert a.size == 400 and np.unique(a).size == 400
    assert np.array_equal(a, splits.subsample(c, 400, 0, ("toxic",)))
    assert not np.array_equal(a, splits.subsample(c, 400, 1, ("toxic",)))
    assert labels[a].sum() == round(400 * labels.mean())


@pytest.mark.model
def test_all_folds_train_each_fold_and_write_their_record_and_oof(tmp_path):
    """--all-folds: three tiny folds, each in its own run directory; folds.json has each
    fold's best value, their mean and spread; oof.csv has every row once, predicted by the
    fold that held it out; --resume keeps finished folds; predict averages the folds."""
    from jaxtpu import predict, train

    base = tmp_path / "cv"
    argv = [
        "--preset",
        "tiny",
        "--n-folds",
        "3",
        "--all-folds",
        "--max-steps",
        "4",
        "--demo-size",
        "96",
        "--workdir",
        str(base),
    ]
    assert train.main(argv) == 0
    record = json.loads((base / "folds.json").read_text())
    assert [f["fold"] for f in record["folds"]] == [0, 1, 2]
    values = [f["best"] for f in record["folds"]]
    assert record["mean"] == pytest.approx(np.mean(values)) and record["monitor"] == "val_auc"
    for f in record["folds"]:
        summary = json.loads((base / f"fold-{f['fold']}" / "summary.json").read_text())
        assert summary["best"]["value"] == f["best"]
    oof = np.loadtxt(base / "oof.csv", delimiter=",", skiprows=1)
    assert np.array_equal(oof[:, 0], np.arange(96))  # every row once
    folds = splits.fold_assignment(demo.demo_comments(96, 0), 3, 0)
    assert np.array_equal(oof[:, 1], folds)
    assert ((oof[:, 2] > 0) & (oof[:, 2] < 1)).all()

    stamp = (base / "fold-0" / "summary.json").stat().st_mtime_ns
    assert train.main([*argv, "--resume"]) == 0  # finished folds are kept as they are
    assert (base / "fold-0" / "summary.json").stat().st_mtime_ns == stamp

    texts = tmp_path / "score.csv"
    texts.write_text("id,comment_text\na,thanks for the edit\nb,you are an idiot\n")
    outs = []
    for workdirs in (["fold-0"], ["fold-1"], ["fold-2"], ["fold-0", "fold-1", "fold-2"]):
        out = tmp_path / f"{len(outs)}.csv"
        assert (
            predict.main(
                [
                    "--workdir",
                    *[str(base / w) for w in workdirs],
                    "--input",
                    str(texts),
                    "--output",
                    str(out),
                ]
            )
            == 0
        )
        outs.append(np.loadtxt(out, delimiter=",", skiprows=1, usecols=1))
    np.testing.assert_allclose(outs[3], np.mean(outs[:3], axis=0), rtol=1e-6)


def test_a_subsample_larger_than_the_data_says_it_trains_on_all_rows(tokenizer, caplog):
    cfg = presets.tiny().replace(demo_size=64, subsample=500, max_len=8)
    with caplog.at_level("WARNING"):
        data = taskdata.load_task_data(cfg, tokenizer)
    assert len(data.train) + len(data.valid) == 64
    assert "--subsample 500: built-in demo data (64 generated comments) has 64 rows" in caplog.text
    assert "training on all of them" in caplog.text
