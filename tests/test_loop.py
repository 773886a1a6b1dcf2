"""The training schedule, without any framework: which steps each device call holds, and
which calls log, evaluate and checkpoint."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import TINY, cli

from jaxtpu.core.data.buckets import Batcher, shuffled_batches
from jaxtpu.core.flags.presets import tiny
from jaxtpu.core.run.plan import Plan, schedule


def plan_for(n_train: int, global_batch: int, epochs: int, max_steps: int = 0) -> Plan:
    spe = n_train // global_batch
    total = min(spe * epochs, max_steps) if max_steps else spe * epochs
    padded = Batcher(np.zeros(n_train, np.int64), global_batch, max_len=0)
    return Plan(n_train, global_batch, spe, total, total, padded)


def calls(plan: Plan, start: int = 0, **run):
    epochs = -(-plan.total // plan.steps_per_epoch)  # the epochs the plan reaches into
    cfg = tiny().replace(**{"log_every": 1, "epochs": epochs, **run})
    return list(schedule(plan, cfg, start))


def test_one_step_per_call_logs_evaluates_at_epoch_ends_and_the_last_step():
    plan = plan_for(n_train=56, global_batch=8, epochs=2)  # 7 steps per epoch
    out = calls(plan, log_every=5)
    assert [c.end for c in out] == list(range(1, 15))
    assert all(len(c.batches) == 1 for c in out)
    assert [c.end for c in out if c.log] == [5, 10, 14]
    assert [c.end for c in out if c.evaluate] == [7, 14]
    assert [c.epoch for c in out] == [0] * 7 + [1] * 7
    assert not any(c.checkpoint for c in out)


def test_k_steps_per_call_end_on_boundaries():
    """K = 3, logging every 3, 7 steps per epoch: calls of 3, 3, 1 | 2, 3, 2 steps."""
    plan = plan_for(56, 8, 2)
    out = calls(plan, steps_per_call=3, log_every=3)
    assert [len(c.batches) for c in out] == [3, 3, 1, 2, 3, 2]
    assert [c.end for c in out] == [3, 6, 7, 9, 12, 14]
    assert [c.end for c in out if c.log] == [3, 6, 9, 12, 14]
    assert [c.end for c in out if c.evaluate] == [7, 14]


def test_eval_and_checkpoint_intervals_and_max_steps():
    plan = plan_for(56, 8, 3, max_steps=16)
    out = calls(plan, steps_per_call=2, log_every=4, eval_every=6, checkpoint_every=4)
    assert [c.end for c in out if c.evaluate] == [6, 7, 12, 14, 16]
    # --checkpoint-every steps are logging steps (losses checked before saving); the last step
    # is saved by its evaluation, not twice
    assert [c.end for c in out if c.checkpoint] == [4, 8, 12]
    assert {c.end for c in out if c.checkpoint} <= {c.end for c in out if c.log}
    assert out[-1].end == 16 and out[-1].log and not out[-1].checkpoint


def test_batches_cover_each_epoch_once_and_resume_mid_epoch_continues_the_sequence():
    plan = plan_for(60, 8, 2)  # 7 steps per epoch, 4 examples dropped each epoch
    full = calls(plan, steps_per_call=3, log_every=3)
    steps = [b.idx for c in full for b in c.batches]
    for epoch in range(2):
        seen = np.concatenate(steps[epoch * 7 : (epoch + 1) * 7])
        assert len(np.unique(seen)) == 56  # no example twice within an epoch
    resumed = calls(plan, start=9, steps_per_call=3, log_every=3)
    rest = [b.idx for c in resumed for b in c.batches]
    assert len(rest) == 5
    for a, b in zip(steps[9:], rest, strict=True):
        np.testing.assert_array_equal(a, b)
    assert [c.end for c in resumed] == [12, 14]


def test_resuming_a_finished_run_only_evaluates():
    plan = plan_for(56, 8, 2)
    (only,) = calls(plan, start=14)
    assert (only.end, only.batches, only.evaluate, only.log) == (14, (), True, False)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_every_step_is_in_exactly_one_call(k):
    plan = plan_for(8 * 11, 8, 3)
    out = calls(plan, steps_per_call=k, log_every=4 * k)
    assert sum(len(c.batches) for c in out) == plan.total == 33
    assert all(1 <= len(c.batches) <= k for c in out)
    assert [c.end for c in out] == sorted({c.end for c in out})
    seed = tiny().train.seed
    expect = [i for e in range(3) for i in shuffled_batches(88, 8, seed, e)]
    for a, b in zip([i.idx for c in out for i in c.batches], expect, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.e2e
def test_nan_loss_stops_with_step_and_keeps_the_best_checkpoint(tmp_path):
    wd = tmp_path / "run"
    # Warm-up from 0 to a huge peak: step 1 trains at lr 0 (and is evaluated and checkpointed),
    # then the learning rate explodes the weights.
    proc = cli(
        "jaxtpu.train",
        *TINY,
        "--workdir",
        str(wd),
        "--lr",
        "1e9",
        "--clip-norm",
        "0",
        "--schedule",
        "linear",
        "--warmup-frac",
        "0.5",
        "--epochs",
        "3",
        "--eval-every",
        "1",
        "--log-every",
        "1",
        "--precision",
        "fp32",
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "loss became nan at step" in proc.stderr or "became nan" in proc.stderr
    assert "Traceback" not in proc.stderr
    lines = map(json.loads, (wd / "metrics.jsonl").read_text().splitlines())
    evals = [x for x in lines if x["event"] == "eval"]
    assert evals and all(np.isfinite(e["val_loss"]) for e in evals)
    best = json.loads(next((wd / "checkpoints" / "best").glob("*/meta/metadata")).read_text())
    assert np.isfinite(best["val_loss"]) and best["step"] == evals[0]["step"] == 1
    latest = json.loads(next((wd / "checkpoints" / "latest").glob("*/meta/metadata")).read_text())
    assert latest["step"] == evals[-1]["step"]  # the last state evaluated as finite


def test_the_lr_of_a_metrics_line_is_the_rate_its_step_trained_with(tmp_path):
    """A linear schedule over 7 updates: step s trained at lr x (7 - (s - 1)) / 7."""
    from helpers import FakeBackend, run_fake

    run_fake(tmp_path, FakeBackend({}), epochs=1, schedule="linear", lr=1e-3)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lrs = {x["step"]: x["lr"] for x in lines if x["event"] == "train"}
    assert lrs[1] == pytest.approx(1e-3)
    for step, lr in lrs.items():
        assert lr == pytest.approx(1e-3 * (7 - (step - 1)) / 7, rel=1e-6), step
