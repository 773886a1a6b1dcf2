"""The shared loop (`jaxtpu.core.run.loop.run`) driven by a numpy `FakeBackend`: NaN, early
stopping, SIGTERM, the order of checkpoints and resume, in milliseconds and without a
framework. The end-to-end tests keep one real run of each (tests/test_signals.py,
tests/test_rundir.py, tests/test_loop.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import (
    FakeBackend,
    fake_job,
    fake_losses,
    run_fake,
)

from jaxtpu.core.errors import TrainingError
from jaxtpu.core.flags.presets import tiny
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.run import loop
from jaxtpu.core.run.protocol import ResumeState
from jaxtpu.core.run.rundir import RunLog


def test_checkpoints_come_in_order_best_before_latest_at_each_evaluation(tmp_path):
    backend = FakeBackend({})
    summary = run_fake(tmp_path, backend, eval_every=3, checkpoint_every=2)
    assert summary["steps"] == 21 and summary["stopped_by"] is None
    evals = [3, 6, 7, 9, 12, 14, 15, 18, 21]  # every 3 steps, and at each epoch end
    latest = sorted({*evals, *range(2, 21, 2)})  # and every 2 steps: each state saved once
    assert [s for kind, s in backend.events if kind == "latest"] == latest
    for step in evals:  # a better model is saved before the latest state of the same step
        pos = backend.events.index(("latest", step))
        assert backend.events[pos - 1] == ("best", step) or ("best", step) not in backend.events
    assert ("best", 3) in backend.events  # the first evaluation is always the best so far


def test_a_nan_loss_stops_at_its_logging_step_and_saves_nothing_after_it(tmp_path):
    backend = FakeBackend({}, nan_at=9)
    with pytest.raises(TrainingError, match=r"loss became nan at step 9; .*\(latest at step 8"):
        run_fake(tmp_path, backend, eval_every=3, checkpoint_every=2)
    assert max(step for _, step in backend.events) == 8  # nothing of the diverged state
    assert backend.disk["latest"]["step"] == 8


def test_a_nan_loss_before_any_save_says_that_nothing_was_saved(tmp_path):
    """Said 'the last good checkpoints are kept ... (best at step None)' when there was none."""
    with pytest.raises(TrainingError, match="No model was saved before it: .* config and metr"):
        run_fake(tmp_path, FakeBackend({}, nan_at=2), eval_every=7, log_every=1)


def test_a_run_that_ends_on_an_error_lets_its_saves_finish_and_closes_its_log(tmp_path):
    """Saves still being written (--async-checkpoint) finish before the error leaves the loop,
    and the run log's file and trackers close while their threads can still run (a CI run
    ended on a bucket error with orbax and TensorBoard tracebacks from interpreter shutdown)."""
    backend = FakeBackend({}, nan_at=9)
    job = fake_job(tmp_path, False, eval_every=3, checkpoint_every=2)
    runlog = RunLog(tmp_path, tensorboard=False)
    closed = []
    runlog._trackers = [SimpleNamespace(log=lambda *a: None, close=closed.append)]
    with pytest.raises(TrainingError):
        loop.run(job, backend, ResumeState(), runlog)
    assert backend.waits_for_checkpoints == 1
    assert closed == [None] and runlog._file is None


def test_patience_stops_after_that_many_evaluations_without_improvement(tmp_path):
    backend = FakeBackend({}, drift=0.05)  # scores get noisier: AUC falls after the first
    summary = run_fake(tmp_path, backend, eval_every=2, patience=2)
    assert summary["stopped_by"] == "early stopping"
    assert summary["best"]["step"] == 2 and summary["steps"] == 6  # evaluations at 2, 4, 6
    assert [kind for kind, _ in backend.events].count("best") == 1


def test_monitor_val_loss_is_minimised(tmp_path):
    """--monitor val_loss (the Lightning notebook's ModelCheckpoint/EarlyStopping): the fake
    validation loss is `w`, which grows at every step, so the first evaluation stays the best
    and patience stops the run (a maximised val_loss would improve at every evaluation)."""
    backend = FakeBackend({})
    summary = run_fake(tmp_path, backend, eval_every=2, patience=2, monitor="val_loss")
    assert summary["monitor"] == "val_loss" and summary["stopped_by"] == "early stopping"
    assert summary["best"]["step"] == 2 and summary["steps"] == 6
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [x for x in lines if x["event"] == "eval"]
    assert evals[0]["val_loss"] < evals[1]["val_loss"] < evals[2]["val_loss"]
    assert summary["best"]["value"] == evals[0]["val_loss"]


def test_sigterm_saves_the_latest_state_and_resume_continues_exactly(tmp_path):
    full = FakeBackend({})
    run_fake(tmp_path / "full", full, eval_every=7)
    disk: dict[str, Any] = {}
    cut = FakeBackend(disk, sigterm_at=10)
    summary = run_fake(tmp_path / "cut", cut, eval_every=7)
    assert summary["stopped_by"] == "SIGTERM" and summary["steps"] == 10
    assert cut.events[-1] == ("latest", 10)
    resumed = FakeBackend(disk)
    summary = run_fake(tmp_path / "cut", resumed, resume=True, eval_every=7)
    assert summary["steps"] == 21 and resumed.step == 21
    assert resumed.w == pytest.approx(full.w, abs=0)
    assert fake_losses(tmp_path / "cut") == fake_losses(tmp_path / "full")  # the log has no repeats


def test_resuming_a_finished_run_only_evaluates(tmp_path):
    disk: dict[str, Any] = {}
    run_fake(tmp_path, FakeBackend(disk), eval_every=7)
    again = FakeBackend(disk)
    summary = run_fake(tmp_path, again, resume=True, eval_every=7)
    assert summary["steps"] == 21 and again.calls == 0
    assert again.events == [("latest", 21)]


class ProfilingBackend(FakeBackend):
    """Records where the profiler starts and stops among the training steps."""

    def profile_start(self, directory) -> None:
        self.events.append(("profile_start", self.step))
        self.directory = directory

    def profile_stop(self) -> None:
        self.events.append(("profile_stop", self.step))


@pytest.mark.parametrize(
    "k, spec, want", [(1, "3:5", (2, 5)), (2, "3:5", (2, 6)), (1, "20:40", (19, 21))]
)
def test_profile_steps_trace_the_calls_that_hold_them(tmp_path, k, spec, want):
    """--profile-steps A:B starts before the call holding step A and stops after the one
    holding B (whole calls: with K steps per call a little more), and at the run's end when it
    ends inside the range; no losses are lost to the trace's sync."""
    backend = ProfilingBackend({})
    run_fake(tmp_path, backend, profile_steps=spec, steps_per_call=k, log_every=k, eval_every=0)
    trace = [(kind, s) for kind, s in backend.events if kind.startswith("profile")]
    assert trace == [("profile_start", want[0]), ("profile_stop", want[1])]
    assert backend.directory == tmp_path / "profile"
    plain = tmp_path / "plain"
    run_fake(plain, FakeBackend({}), steps_per_call=k, log_every=k, eval_every=0)
    assert fake_losses(tmp_path) == fake_losses(plain)  # every loss logged, as without the profile


def test_profile_steps_are_logged_with_their_path_or_said_to_miss_the_run(tmp_path, caplog):
    """The fake run takes 21 steps: a range inside it is logged with its directory (also when
    the run ends inside it), a range after its end is said at once and traces nothing."""
    for name, spec, said in [
        ("a", "3:5", f"profile of steps 3-5 written to {tmp_path / 'a' / 'profile'}"),
        ("b", "20:40", f"profile of steps 20-21 written to {tmp_path / 'b' / 'profile'}"),
        ("c", "30:40", "--profile-steps 30:40: this run takes steps 1 to 21, none of them in"),
    ]:
        backend = ProfilingBackend({})
        caplog.clear()
        with caplog.at_level("INFO", logger="jaxtpu"):
            run_fake(tmp_path / name, backend, profile_steps=spec, eval_every=0)
        assert said in caplog.text
    assert not [e for e in backend.events if e[0].startswith("profile")]


@pytest.mark.parametrize("spec", ["5", "0:3", "4:2", "a:b", "3:"])
def test_bad_profile_steps_are_one_line(spec):
    from jaxtpu.core.errors import ConfigError

    if spec in ("5", "3:"):  # a single step is A:A
        assert tiny().replace(profile_steps=spec).output.profile_steps == spec
        return
    with pytest.raises(ConfigError, match=r"--profile-steps .*: expected A:B"):
        tiny().replace(profile_steps=spec)


def test_each_metrics_line_and_the_summary_say_where_the_time_went(tmp_path):
    """Every train line splits its interval into training, compiling, evaluating,
    checkpointing and waiting for input, with tokens/s and, on a device whose peak is known
    (the fake says TPU v3), the MFU; the summary says the same of the whole loop."""
    summary = run_fake(tmp_path, FakeBackend({}), eval_every=3, checkpoint_every=2)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if x["event"] == "train"]
    for x in [*train, summary["loop"]]:
        assert set(x["time_share"]) == {"train", "compile", "eval", "checkpoint", "data_wait"}
        assert sum(x["time_share"].values()) == pytest.approx(1.0)
        assert x["computed_tokens_per_s"] >= x["tokens_per_s"] > 0 and x["mfu"] > 0
    assert any(x["time_share"]["eval"] > 0 for x in train)  # evaluations fall in intervals
    assert summary["loop"]["time_share"]["checkpoint"] > 0
    # 21 steps of 8 examples of 16 tokens (tiny: 2 x 64, FFN 128) over the loop's step time
    flops = RunSpec.resolve(fake_job(tmp_path / "j").cfg).encoder.train_flops(8, 16)[0] * 21
    loop_ = summary["loop"]
    steps_s = loop_["wall_s"] * (loop_["time_share"]["train"] + loop_["time_share"]["data_wait"])
    assert loop_["mfu"] == pytest.approx(flops / (steps_s * 61.5e12), rel=1e-6)


def test_a_time_interval_saves_at_the_first_logging_step_after_it(tmp_path, monkeypatch):
    """--checkpoint-every 1m on a clock that moves 25 s per training call: the latest state is
    saved at the first logging call at least a minute after the previous save (evaluations
    save too and restart the count), never later."""
    import time as real_time

    from jaxtpu.core.run import loop

    class Clock:
        now = 1000.0

        def time(self) -> float:
            return self.now

        def __getattr__(self, name: str) -> Any:
            return getattr(real_time, name)

    clock = Clock()
    monkeypatch.setattr(loop, "time", clock)
    saves: list[tuple[float, int]] = []

    class Timed(FakeBackend):
        def train_steps(self, batches):
            clock.now += 25.0
            return super().train_steps(batches)

        def save_latest(self, step, meta):
            saves.append((clock.now, step))
            super().save_latest(step, meta)

    summary = run_fake(tmp_path, Timed({}), checkpoint_every="1m")
    assert summary["steps"] == 21
    evals = {7, 14, 21}
    gaps = [(b[0] - a[0], b[1]) for a, b in zip(saves, saves[1:], strict=False)]
    assert all(gap >= 60 for gap, step in gaps if step not in evals), saves
    assert all(gap <= 75 for gap, _ in gaps), saves  # the first logging call after a minute
    assert [s for _, s in saves] == [3, 6, 7, 10, 13, 14, 17, 20, 21]
