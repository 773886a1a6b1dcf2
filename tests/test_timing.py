"""`jaxtpu.core.run.timing`: where a run's wall time goes and what its steps achieve, on a fake
clock (exact) and through the shared loop with a fake backend."""

from __future__ import annotations

import numpy as np
import pytest

from jaxtpu.core import hardware
from jaxtpu.core.run import timing
from jaxtpu.core.run.timing import Clock, Work


def test_the_clock_splits_wall_time_and_counts_throughput_over_the_steps(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(timing.time, "perf_counter", lambda: now[0])
    clock = Clock(peak_flops=1e12, devices=2)
    with clock.timing("compile"):
        now[0] += 3.0
    now[0] += 1.5  # steps: 1.0 s of training and 0.5 s waiting for input
    clock.waited(0.5)
    with clock.timing("eval"):
        now[0] += 2.0
    with clock.timing("checkpoint"):
        now[0] += 0.5
    clock.did(Work(examples=12, real_tokens=90, computed_tokens=150, model_flops=1.5e12))
    first = clock.interval()
    assert first["wall_s"] == 7.0
    assert first["time_share"] == pytest.approx(
        {
            "train": 1 / 7,
            "compile": 3 / 7,
            "eval": 2 / 7,
            "checkpoint": 0.5 / 7,
            "data_wait": 0.5 / 7,
        }
    )
    assert (
        first["examples_per_s"],
        first["tokens_per_s"],
        first["computed_tokens_per_s"],
    ) == pytest.approx((12 / 1.5, 90 / 1.5, 150 / 1.5))
    assert first["mfu"] == pytest.approx(1.5e12 / (1.5 * 2e12))  # 2 devices of 1 TFLOP/s
    now[0] += 3.0  # only steps in the second interval
    clock.waited(0.5)
    clock.did(Work(examples=6, real_tokens=30, computed_tokens=30, model_flops=0.0))
    second = clock.interval()
    assert second["wall_s"] == 3.0 and second["time_share"]["train"] == 1.0
    assert second["examples_per_s"] == 2.0
    total = clock.totals()
    assert total["wall_s"] == 10.0 and total["examples_per_s"] == pytest.approx(18 / 4.5)
    assert sum(total["time_share"].values()) == pytest.approx(1.0)
    assert Clock(peak_flops=None, devices=8).interval()["mfu"] is None


def test_a_batch_counts_real_and_computed_tokens_and_the_model_flops():
    lengths = np.array([3, 20, 7, 1])
    seen = []
    work = timing.batch_work(
        idx=np.array([0, 1, 2, 0]),
        weight=np.array([1, 1, 1, 0], np.float32),
        length=8,
        lengths=lengths,
        comments_per_example=2,
        flops=lambda comments, seq: seen.append((comments, seq)) or 1e9,
    )
    # a filler row (weight 0) is computed but not an example; a row longer than the cut
    # counts the cut; a pair counts its longer comment twice
    assert work == Work(
        examples=3, real_tokens=(3 + 8 + 7) * 2, computed_tokens=4 * 2 * 8, model_flops=1e9
    )
    assert seen == [(8, 8)]  # 4 rows x 2 comments, at 8 tokens


def test_every_tpu_generation_has_a_peak_per_device_and_a_cpu_none():
    assert hardware.peak_flops_per_device("TPU v3") == 61.5e12  # 123 per chip, 2 cores
    assert hardware.peak_flops_per_device("TPU v5 lite") == 197e12
    assert hardware.peak_flops_per_device("cpu") is None
    assert len({c.device_kind for c in hardware.TPU_CHIPS.values()}) == len(hardware.TPU_CHIPS)


def test_one_formula_for_a_devices_share_of_its_chips():
    """The loop's MFU peak (a TPU VM's device) and preflight's targets (a topology's devices)
    divide one chip table the same way: a v3 core is half a chip on a VM and in a v3-8."""
    from jaxtpu.preflight.targets import TPU_TARGETS

    v3 = TPU_TARGETS["v3-8"]
    assert hardware.peak_flops_per_device("TPU v3") == v3.peak_flops_per_device() == 61.5e12
    assert v3.memory_per_device() == 16 * 2**30 and v3.bandwidth_per_device() == 450e9
    v5e = TPU_TARGETS["v5e-8"]  # one device per chip
    assert v5e.peak_flops_per_device() == hardware.peak_flops_per_device("TPU v5 lite")
    assert v5e.memory_per_device() == 16 * 2**30
