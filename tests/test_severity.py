"""Severity from a multi-label model: `--label-weights`, the weight search on pairs whose
answer is known, and the three commands on a tiny multilabel run (`severity-weights`,
`evaluate --label-weights`, `predict --label-weights`)."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest

from jaxtpu.core.data.records import SUBLABELS
from jaxtpu.core.errors import UserError
from jaxtpu.core.severity import (
    MAX_GRID,
    check_grid,
    format_weights,
    pair_agreement,
    parse_label_weights,
    search_weights,
    severity,
)
from jaxtpu.core.tasks import SEVERITY_WEIGHTS


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1,2,3", "expected 6 numbers >= 0"),
        ("1,2,3,4,5,x", "expected 6 numbers >= 0"),
        ("1,2,3,4,5,-1", "expected 6 numbers >= 0"),
        ("1,2,3,4,5,nan", "expected 6 numbers >= 0"),
        ("0,0,0,0,0,0", "every weight is 0"),
    ],
)
def test_bad_label_weights_are_one_line(text, message):
    with pytest.raises(UserError, match=message):
        parse_label_weights(text)


def test_label_weights_round_trip():
    w = parse_label_weights("0.32, 1.5,0.16,1.5,0.64,1.5")
    np.testing.assert_allclose(w, SEVERITY_WEIGHTS, rtol=1e-6)
    np.testing.assert_array_equal(parse_label_weights(format_weights(w)), w)


def _pairs(truth: np.ndarray, n: int = 600, seed: int = 0):
    """Pairs of random label probabilities, ordered by severity under `truth`."""
    rng = np.random.default_rng(seed)
    a, b = rng.random((n, 6)), rng.random((n, 6))
    swap = severity(a, truth) > severity(b, truth)
    less, more = np.where(swap[:, None], b, a), np.where(swap[:, None], a, b)
    return less, more


def test_the_search_finds_weights_that_rank_pairs_as_the_truth_does():
    truth = np.array([0.0, 2.0, 0.0, 0.0, 1.0, 0.0])
    less, more = _pairs(truth)
    found = search_weights(less, more, step=0.1, top=2.0)
    assert found.start_agreement < 0.8  # the built-in weights rank these pairs poorly
    assert found.agreement >= 0.97
    assert found.agreement == pytest.approx(pair_agreement(less, more, found.weights))
    assert found.weights[1] > 3 * max(found.weights[[0, 2, 3, 5]])  # severe_toxic leads
    assert np.all(np.isin(np.round(found.weights, 6), np.round(np.arange(0, 2.05, 0.1), 6)))


@pytest.mark.parametrize(
    "step, top, message",
    [
        (1e-5, 1e6, "100,000,000,001 weights per label; at most 1,001"),  # was 745 GiB asked
        (1, 1e300, "weights per label; at most 1,001"),  # was "Maximum allowed size exceeded"
        (0.1, float("inf"), "expected 0 < step <= top, both finite"),
        (0.5, 0.1, "expected 0 < step <= top"),
        (0.0, 2.0, "expected 0 < step <= top"),
    ],
)
def test_a_grid_too_fine_or_not_a_grid_is_one_line(step, top, message):
    """Issue 58: `severity-weights --top 1e6 --step 1e-5` asked for 745 GiB."""
    with pytest.raises(UserError, match=re.escape(message)):
        search_weights(np.zeros((2, 6)), np.ones((2, 6)), step=step, top=top)
    assert check_grid(0.1, 2.0) == 21 and check_grid(0.002, 2.0) == MAX_GRID


def test_the_search_keeps_weights_that_already_agree():
    """Only a strict gain moves a weight: pairs the built-in weights rank perfectly keep them."""
    less, more = _pairs(SEVERITY_WEIGHTS)
    found = search_weights(less, more)
    assert found.start_agreement == found.agreement == 1.0
    np.testing.assert_array_equal(found.weights, np.asarray(SEVERITY_WEIGHTS, np.float64))
    assert found.passes == 1


@pytest.mark.model
def test_the_commands_on_a_multilabel_run(tmp_path, capsys):
    from jaxtpu import evaluate, predict, severity, train
    from jaxtpu.core.data.demo import demo_comments
    from jaxtpu.core.flags.presets import tiny

    demo = demo_comments(160, seed=3)
    labelled = tmp_path / "train.csv"
    with open(labelled, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "comment_text", "toxic", *SUBLABELS])
        for i, (t, y, sub) in enumerate(zip(demo.texts, demo.labels, demo.sublabels, strict=True)):
            w.writerow([f"c{i}", t, y, *sub])
    run = tmp_path / "run"
    cfg = tiny().replace(task="multilabel", train_csv=str(labelled), max_steps=4, workdir=str(run))
    train.train_and_evaluate(cfg)
    sev = demo.labels * 0.32 + np.nan_to_num(demo.sublabels) @ np.asarray(SEVERITY_WEIGHTS[1:])
    rng = np.random.default_rng(0)
    pairs = tmp_path / "pairs.csv"
    with open(pairs, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["worker", "less_toxic", "more_toxic"])
        for _ in range(80):
            i, j = rng.choice(160, 2, replace=False)
            if sev[i] != sev[j]:
                lo, hi = (i, j) if sev[i] < sev[j] else (j, i)
                w.writerow([0, demo.texts[lo], demo.texts[hi]])
    common = ["--input", str(pairs), "--num-devices", "1"]
    out = tmp_path / "weights.json"
    capsys.readouterr()
    assert severity.main(["--workdir", str(run), *common, "--out", str(out)]) == 0
    found = json.loads(out.read_text())
    assert found["agreement"] >= found["start_agreement"]
    assert f"--label-weights {found['label_weights']}" in capsys.readouterr().out
    ev = tmp_path / "ev.json"
    flags = ["--workdir", str(run), *common, "--label-weights", found["label_weights"]]
    assert evaluate.main([*flags, "--out", str(ev)]) == 0
    assert json.loads(ev.read_text())["value"] == pytest.approx(found["agreement"])

    # predict on a Rate Severity file: the score is the weighted sum of the probabilities
    score_file, probs_file = tmp_path / "to_score.csv", tmp_path / "comments.csv"
    with open(score_file, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(
            [["comment_id", "text"], *[[f"s{i}", demo.texts[i]] for i in range(20)]]
        )
    with open(probs_file, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(
            [["id", "comment_text"], *[[f"s{i}", demo.texts[i]] for i in range(20)]]
        )
    base = ["--workdir", str(run), "--num-devices", "1"]
    weighted = tmp_path / "weighted.csv"
    argv = [*base, "--input", str(score_file), "--output", str(weighted)]
    assert predict.main([*argv, "--label-weights", found["label_weights"]]) == 0
    assert (
        predict.main([*base, "--input", str(probs_file), "--output", str(tmp_path / "p.csv")]) == 0
    )
    with open(tmp_path / "p.csv", newline="") as f:
        probs = np.array([[float(v) for v in list(r.values())[1:]] for r in csv.DictReader(f)])
    with open(weighted, newline="") as f:
        scores = np.array([float(r["score"]) for r in csv.DictReader(f)])
    expected = probs @ parse_label_weights(found["label_weights"])
    np.testing.assert_allclose(scores, expected, atol=1e-5)
