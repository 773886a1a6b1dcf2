"""Pseudo-labels (the Multilingual winners' round): `predict --pseudo-label [--confidence C]`
writes an unlabelled file's scores as a training file of soft targets, and `train
--extra-train FILE [--extra-weight W]` adds it to the training rows, validation unchanged."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from helpers import one_line_exit_2

from jaxtpu.core.data import taskdata
from jaxtpu.core.data.demo import demo_comments
from jaxtpu.core.data.records import SUBLABELS
from jaxtpu.core.errors import ConfigError, DataError
from jaxtpu.core.flags.presets import tiny
from jaxtpu.engine.predictions import pseudo_rows


def test_extra_rows_that_are_validation_rows_are_left_out(tmp_path, tokenizer, caplog):
    """Issue 58: `--train-csv good.csv --extra-train good.csv` trained on all the validation
    comments and logged "validation unchanged"."""
    from jaxtpu.core.data.demo import SAMPLE_CSV

    with open(SAMPLE_CSV, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))[:121]
    good = tmp_path / "good.csv"
    with open(good, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    cfg = tiny().replace(train_csv=str(good), valid_fraction=0.2, extra_train=str(good))
    caplog.set_level("INFO", "jaxtpu")
    data = taskdata.load_task_data(cfg, tokenizer)
    plain = taskdata.load_task_data(cfg.replace(extra_train=""), tokenizer)
    valid = {bytes(r) for r in plain.valid.input_ids}
    left_out = data.info["extra_train_left_out"]
    assert left_out >= len(plain.valid) == 24  # every validation row (and any repeat of one)
    assert data.info["extra_train_examples"] == 120 - left_out
    assert len(data.train) == len(plain.train) + 120 - left_out
    assert not valid & {bytes(r) for r in data.train.input_ids[len(plain.train) :]}
    assert f"({left_out} that share a text with a validation row left out)" in caplog.text
    with pytest.raises(DataError, match="every one of its 1 rows shares a text with a valid"):
        one = tmp_path / "one.csv"
        with open(one, "w", newline="", encoding="utf-8") as f:
            csv.writer(f).writerows([rows[0], rows[1 + int(plain.valid_rows[0])]])
        taskdata.load_task_data(cfg.replace(extra_train=str(one)), tokenizer)


def test_pseudo_rows_keep_confident_non_empty_comments():
    probs = np.array([0.95, 0.5, 0.04, 0.8, 0.99])
    texts = ["a", "b", "c", "d", ""]
    rows = pseudo_rows(["1", "2", "3", "4", "5"], texts, probs, 0.9)
    assert rows == [["1", "a", 0.95], ["3", "c", 0.04]]  # 0.5 and 0.8 unsure, "" empty
    assert len(pseudo_rows(["1", "2", "3", "4", "5"], texts, probs, None)) == 4
    six = np.array([[0.97, 0.1, 0.2, 0.3, 0.4, 0.5]])  # a multi-label model: by `toxic`
    assert pseudo_rows(["x"], ["t"], six, 0.9) == [["x", "t", *six[0].tolist()]]


def test_flags_that_do_not_go_together_are_one_line(capsys, tmp_path):
    from jaxtpu import predict

    with pytest.raises(ConfigError, match="--extra-train adds labelled comments"):
        tiny().replace(extra_train="x.csv", task="ranking")
    with pytest.raises(ConfigError, match="--extra-weight 0.5 applies with --extra-train"):
        tiny().replace(extra_weight=0.5)
    base = ["--workdir", str(tmp_path), "--input", "x.csv", "--output", str(tmp_path / "o.csv")]
    err = one_line_exit_2(capsys, lambda: predict.main([*base, "--confidence", "0.9"]))
    assert "--confidence 0.9: goes with --pseudo-label" in err
    err = one_line_exit_2(
        capsys, lambda: predict.main([*base, "--pseudo-label", "--confidence", "0.4"])
    )
    assert "between 0.5 and 1" in err


def _labelled(path: Path, n: int, seed: int) -> Path:
    demo = demo_comments(n, seed=seed)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "comment_text", "toxic", *SUBLABELS])
        for i, (t, y, sub) in enumerate(zip(demo.texts, demo.labels, demo.sublabels, strict=True)):
            w.writerow([f"c{i}", t, y, *sub])
    return path


@pytest.mark.model
def test_one_round_of_pseudo_labels(tmp_path, capsys, tokenizer):
    """Train, score an unlabelled file as pseudo-labels (every comment, then the confident
    ones), and train again with them added: more training rows, the same validation rows."""
    from jaxtpu import predict, train

    labelled = _labelled(tmp_path / "train.csv", 120, seed=3)
    unlabelled = tmp_path / "test.csv"
    texts = demo_comments(40, seed=11).texts
    with open(unlabelled, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "comment_text"])
        w.writerows([[f"t{i}", "" if i == 7 else t] for i, t in enumerate(texts)])
    first = tmp_path / "round0"
    cfg = tiny().replace(train_csv=str(labelled), max_steps=6, workdir=str(first))
    before = train.train_and_evaluate(cfg)

    base = ["--workdir", str(first), "--input", str(unlabelled), "--num-devices", "1"]
    scores, pseudo = tmp_path / "scores.csv", tmp_path / "pseudo.csv"
    assert predict.main([*base, "--output", str(scores)]) == 0
    assert predict.main([*base, "--output", str(pseudo), "--pseudo-label"]) == 0
    assert "wrote 39 of 40 comments as pseudo-labels" in capsys.readouterr().out
    with open(scores, newline="") as f:
        scored = {r["id"]: float(r["toxic"]) for r in csv.DictReader(f)}
    with open(pseudo, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["id", "comment_text", "toxic"] and len(rows) == 39
    assert all(abs(float(r["toxic"]) - scored[r["id"]]) < 1e-6 for r in rows)
    assert "t7" not in {r["id"] for r in rows}  # the empty comment

    sureness = np.array([max(p, 1 - p) for i, p in scored.items() if i != "t7"])
    c = float(np.median(sureness))
    sure = tmp_path / "sure.csv"
    assert (
        predict.main([*base, "--output", str(sure), "--pseudo-label", "--confidence", f"{c}"]) == 0
    )
    with open(sure, newline="") as f:
        kept = {r["id"] for r in csv.DictReader(f)}
    assert kept == {i for i, p in scored.items() if i != "t7" and max(p, 1 - p) >= c}
    assert 0 < len(kept) < 39

    plain = taskdata.load_task_data(cfg, tokenizer)
    more_cfg = cfg.replace(extra_train=str(pseudo), extra_weight=0.5, workdir=str(tmp_path / "r1"))
    more = taskdata.load_task_data(more_cfg, tokenizer)
    # the demo's generated comments repeat: pseudo rows whose text is a validation comment's
    # are left out (issue 58), the others added
    with open(labelled, newline="", encoding="utf-8") as f:
        labelled_texts = [r["comment_text"] for r in csv.DictReader(f)]
    valid_texts = {labelled_texts[i] for i in plain.valid_rows}
    added = [r for r in rows if r["comment_text"] not in valid_texts]
    n = len(added)
    assert more.info["extra_train_left_out"] == 39 - n and 0 < n <= 39
    assert len(more.train) == len(plain.train) + n and more.info["extra_train_examples"] == n
    np.testing.assert_array_equal(more.valid_rows, plain.valid_rows)
    np.testing.assert_array_equal(more.valid.input_ids, plain.valid.input_ids)
    np.testing.assert_array_equal(more.train.row_weights[-n:], 0.5)
    np.testing.assert_array_equal(more.train.row_weights[:-n], 1.0)
    soft = np.sort(more.train.label[-n:])
    np.testing.assert_allclose(soft, np.sort([float(r["toxic"]) for r in added]), atol=1e-6)
    after = train.train_and_evaluate(more_cfg)
    assert after["steps"] > before["steps"]  # one epoch of more rows
