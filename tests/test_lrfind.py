"""`jaxtpu lr-find`: the sweep's rates, the smoothing and the suggestion rule on curves whose
answer is known, bad flags in one line, and a sweep of the tiny preset whose suggestion lands
where its loss falls, with nothing written but the CSV and the plot."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from helpers import one_line_exit_2

from jaxtpu import lrfind
from jaxtpu.core import lrsweep


def test_the_rate_grows_exponentially_from_start_to_end():
    rates = [float(lrsweep.sweep_rate(i, 1e-6, 1e-1, 11)) for i in range(11)]
    np.testing.assert_allclose(rates, np.logspace(-6, -1, 11), rtol=1e-5)


def test_the_smoothing_is_a_bias_corrected_moving_average():
    np.testing.assert_allclose(lrsweep.smooth([2.0] * 5), [2.0] * 5)  # no lag toward 0
    beta, x = 0.5, [1.0, 3.0]
    assert lrsweep.smooth(x, beta)[1] == pytest.approx((0.25 * 1 + 0.5 * 3) / (1 - 0.25))


def test_the_suggestion_is_the_steepest_fall_before_the_minimum():
    lrs = np.logspace(-7, 0, 71)
    # flat, then falling fastest around 1e-3, a minimum at 1e-2, then rising
    loss = 1.0 - 0.5 / (1 + np.exp(-3 * (np.log10(lrs) + 3))) + np.maximum(np.log10(lrs) + 2, 0)
    lr, why = lrsweep.suggest(lrs, loss)
    assert lr == pytest.approx(1e-3, rel=0.3) and "steepest descent" in why
    assert lrsweep.suggest(lrs, np.linspace(1, 2, 71))[0] is None  # never falls
    lr, why = lrsweep.suggest(lrs, np.linspace(2, 1, 71) * 0 + np.r_[0.5, np.ones(70)])
    assert lr is None and "first steps" in why


def test_an_out_that_is_a_file_is_refused_before_the_sweep(capsys, tmp_path):
    """Issue 58: a FileExistsError after the whole sweep. (The sweep would need a model run:
    this test is in the fast tier, so the refusal must come first.)"""
    (tmp_path / "taken").write_text("x")
    err = one_line_exit_2(
        capsys, lambda: lrfind.main(["--preset", "tiny", "--out", str(tmp_path / "taken")])
    )
    assert "a file is there; lr-find writes a directory" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--start-lr", "1", "--end-lr", "0.1"], "expected 0 < start < end"),
        (["--lr-find-steps", "2"], "--lr-find-steps must be >= 5"),
        (["--accumulate", "2"], "drop --accumulate"),
    ],
)
def test_bad_flags_are_one_line(flags, message, capsys, tmp_path):
    err = one_line_exit_2(
        capsys, lambda: lrfind.main(["--preset", "tiny", "--out", str(tmp_path), *flags])
    )
    assert message in err


@pytest.mark.model
def test_the_tiny_presets_suggestion_is_where_its_loss_falls(tmp_path, capsys):
    out = tmp_path / "find"
    assert lrfind.main(["--preset", "tiny", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["lr_find.csv", "lr_find.png"]
    with open(out / "lr_find.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    lrs = np.array([float(r["lr"]) for r in rows])
    smoothed = np.array([float(r["smoothed_loss"]) for r in rows])
    assert len(rows) >= 50 and lrs[0] == pytest.approx(1e-7) and np.all(np.diff(lrs) > 0)
    suggested = float(printed.split("suggested --lr ")[1].split()[0])
    i = int(np.argmin(np.abs(np.log(lrs / suggested))))
    low = int(np.argmin(smoothed))
    # inside the falling stretch: below the rate of the minimum, the smoothed loss falling
    # there and lower than where the sweep started
    assert 0 < i < low
    assert smoothed[i + 1] < smoothed[i - 1] and smoothed[i] < smoothed[0]
