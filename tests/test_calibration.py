"""Calibration (`jaxtpu.core.calibration`): per-output Platt scaling fitted on validation rows,
checked on numbers whose answer is known (a logistic model of known slope and offset), and its
record's refusals. Where it is applied (predict, the API, serve, exports) is in the tests of
those commands."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from jaxtpu.core import calibration
from jaxtpu.core.calibration import Calibration, sigmoid
from jaxtpu.core.errors import UserError


def _overconfident(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Logits of a model twice as sure as it should be, with a shifted base rate: the truth
    is sigmoid(0.5 z - 1)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0, 3, n)
    y = (rng.random(n) < sigmoid(0.5 * z - 1.0)).astype(np.float64)
    return z, y


def test_platt_finds_the_slope_and_offset_sklearn_finds():
    z, y = _overconfident(20000)
    a, b = calibration.platt(z, y)
    ref = LogisticRegression(C=1e6).fit(z[:, None], y)  # unpenalised logistic regression
    assert abs(a - ref.coef_[0, 0]) < 2e-3 and abs(b - ref.intercept_[0]) < 2e-3
    assert abs(a - 0.5) < 0.05 and abs(b + 1.0) < 0.1


def test_a_fit_lowers_the_calibration_error_and_keeps_every_auc():
    z1, y1 = _overconfident(3000, 1)
    z2, y2 = _overconfident(3000, 2)
    logits, labels = np.stack([z1, 2 * z2 + 1], 1), np.stack([y1, y2], 1)
    labels[::7, 1] = np.nan  # unlabelled rows of an auxiliary target: left out
    cal = calibration.fit(logits, labels, ("toxic", "insult"))
    assert cal.rows == 3000 and cal.columns == ("toxic", "insult")
    for j in range(2):
        assert cal.after["ece"][j] < cal.before["ece"][j] / 3, (j, cal.before, cal.after)
        assert cal.after["brier"][j] < cal.before["brier"][j]
        known = np.isfinite(labels[:, j])
        calibrated = cal.apply(logits)[known, j]
        assert roc_auc_score(labels[known, j], calibrated) == roc_auc_score(
            labels[known, j], logits[known, j]
        )
    assert "toxic" in cal.describe() and "->" in cal.describe()


def test_soft_targets_are_fitted_as_they_are():
    """The bias task's rater fractions: the fit finds the map that makes the mean right."""
    rng = np.random.default_rng(3)
    z = rng.normal(0, 2, 5000)
    fractions = sigmoid(0.7 * z + 0.5)
    a, b = calibration.platt(z, fractions)
    assert abs(a - 0.7) < 1e-3 and abs(b - 0.5) < 1e-3


def test_too_few_rows_one_class_or_no_signal_leave_a_column_as_it_is():
    rng = np.random.default_rng(4)
    z = rng.normal(size=(200, 3))
    y = np.stack(
        [
            np.where(np.arange(200) < 50, (z[:, 0] > 0) * 1.0, np.nan),  # under 30 each way
            np.zeros(200),  # one class
            (z[:, 2] < 0) * 1.0,  # a model that ranks backwards: no increasing map
        ],
        1,
    )
    cal = calibration.fit(z, y, ("a", "b", "c"))
    assert cal.scale == (1.0, 1.0, 1.0) and cal.shift == (0.0, 0.0, 0.0)
    np.testing.assert_array_equal(cal.apply(z), z)


def test_the_record_round_trips_and_a_wrong_one_is_one_line(tmp_path):
    z, y = _overconfident(500)
    cal = calibration.fit(z, y, ("toxicity",))
    calibration.write(tmp_path, cal)
    assert calibration.read(tmp_path) == cal
    assert calibration.read(tmp_path / "none") is None
    np.testing.assert_allclose(cal.apply(z), cal.scale[0] * z + cal.shift[0])
    with pytest.raises(UserError, match="another model"):
        cal.apply(np.zeros((4, 6)))
    assert cal.subset(["toxicity"]) == cal
    d = cal.to_dict()
    (tmp_path / calibration.FILE).write_text(json.dumps({**d, "scale": [float("nan")]}))
    with pytest.raises(UserError, match="non-finite"):
        calibration.read(tmp_path)
    (tmp_path / calibration.FILE).write_text(json.dumps({**d, "method": "isotonic"}))
    with pytest.raises(UserError, match="not a calibration record"):
        calibration.read(tmp_path)
    (tmp_path / calibration.FILE).write_text("{")
    with pytest.raises(UserError, match="unreadable"):
        calibration.read(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({calibration.CONFIG_KEY: d}))
    assert calibration.of_export(tmp_path) == Calibration.from_dict(d, "x")


def test_ece_of_a_perfectly_calibrated_forecast_is_small_and_of_a_constant_is_its_gap():
    rng = np.random.default_rng(5)
    p = rng.random(100000)
    y = (rng.random(100000) < p) * 1.0
    assert calibration.ece(p, y) < 0.01
    assert abs(calibration.ece(np.full(1000, 0.9), np.r_[np.ones(500), np.zeros(500)]) - 0.4) < 1e-9


@pytest.mark.e2e
@pytest.mark.model
def test_predict_the_api_evaluate_and_exports_apply_one_calibration(finished_run, tmp_path):
    """A run's calibration.json (here a known one, so the numbers are checkable) is what
    `jaxtpu predict`, `jaxtpu.load().predict` and an export scored by `predict --model-dir`
    apply; --no-calibration and `calibrated=False` score without it; `evaluate` reports the
    calibration error before and after with the same AUC."""
    import csv
    import shutil

    import jaxtpu
    from jaxtpu import export, predict
    from jaxtpu.core.data.demo import SAMPLE_CSV
    from jaxtpu.core.flags.schema import SCORING
    from jaxtpu.engine import evaluation
    from jaxtpu.engine.hosts import scoring_devices

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    cal = Calibration(("toxic",), (0.5,), (-1.0,), 100)
    calibration.write(run, cal)
    texts = ["you are an idiot", "thanks for the edit", "?", "stop vandalising the page now"]
    model = jaxtpu.load(run, num_devices=1)
    logits = np.asarray(model.logits(texts), np.float64)
    np.testing.assert_allclose(model.predict(texts), sigmoid(0.5 * logits - 1.0), atol=1e-6)
    raw = jaxtpu.load(run, num_devices=1, calibrated=False).predict(texts)
    np.testing.assert_allclose(raw, sigmoid(logits), atol=1e-6)

    source = tmp_path / "in.csv"
    with open(source, "w", newline="") as f:
        csv.writer(f).writerows([["id", "comment_text"], *[[i, t] for i, t in enumerate(texts)]])

    def written(*flags: str) -> np.ndarray:
        out = tmp_path / f"out{len(list(tmp_path.glob('out*.csv')))}.csv"
        argv = [*flags, "--input", str(source), "--output", str(out), "--num-devices", "1"]
        assert predict.main(argv) == 0
        with open(out, newline="") as f:
            return np.array([float(r["toxic"]) for r in csv.DictReader(f)])

    np.testing.assert_allclose(written("--workdir", str(run)), sigmoid(0.5 * logits - 1), atol=1e-6)
    no_cal = written("--workdir", str(run), "--no-calibration")
    np.testing.assert_allclose(no_cal, sigmoid(logits), atol=1e-6)
    hf = tmp_path / "hf"
    assert export.main(["--workdir", str(run), "--out", str(hf)]) == 0
    assert calibration.of_export(hf) == cal
    by_export = written("--model-dir", str(hf))
    z = np.log(no_export := written("--model-dir", str(hf), "--no-calibration"))
    z -= np.log1p(-no_export)  # the export's own fp32 logits (the run's are bf16)
    np.testing.assert_allclose(by_export, sigmoid(0.5 * z - 1), atol=1e-6)

    report = evaluation.evaluate(str(run), str(SAMPLE_CSV), scoring_devices(1))
    r = report["calibration"]["toxic"]
    assert r["ece_before"] != r["ece_after"] and 0 <= r["ece_after"] <= 1
    # evaluate scores each row as the API (and so predict and serve) does: bitwise, in the
    # run's precision (issue 65, item 4: they used to differ in bf16)
    batch = SCORING.batch_size  # jaxtpu.load()'s default
    examples, _, outputs = evaluation.score_file(
        model.trained, str(SAMPLE_CSV), scoring_devices(1), batch
    )
    rows = evaluation.read_labelled(str(SAMPLE_CSV), model.task)
    np.testing.assert_array_equal(outputs, model.logits(rows.texts))
    assert model.trained.cfg.train.precision == "bf16"
