"""The torch_xla reference on its own: SPMD on 8 CPU devices, spawn on 1, compile once.

Each run is a real `python -m torchxla_ref.train` process (torch_xla must not share a process
with JAX)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch_xla", reason="the torch_xla reference needs torch_xla")

from parity_tests.harness import run_side  # noqa: E402

TINY = ["--preset", "tiny", "--log-every", "1"]


@pytest.mark.e2e
@pytest.mark.torch
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("task", ["toxicity", "ranking"])
def test_spmd_8_devices_loss_goes_down_and_compiles_stay_put(tmp_path, task, precision):
    run = run_side(
        "torch",
        tmp_path / "run",
        *TINY,
        "--task",
        task,
        "--precision",
        precision,
        "--epochs",
        "2",
        "--parallel",
        "spmd",
        "--num-devices",
        "8",
    ).check()
    losses = run.losses
    assert len(losses) == 14
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4]), losses
    compiles = {r["step"]: r["compiles"] for r in run.events("train")}
    # Steps 1-2 compile the step (the optimizer state appears after the first update), the
    # first evaluation (after step 7) its own graph; after that nothing compiles again.
    assert compiles[3] == compiles[7], compiles
    assert compiles[8] == compiles[14], compiles
    summary = run.summary
    assert (summary["devices"], summary["parallel"]) == (8, "spmd")
    monitor = "val_auc" if task == "toxicity" else "val_agreement"
    assert summary["final"][monitor] > 0.8


@pytest.mark.e2e
@pytest.mark.torch
def test_spawn_runs_on_one_cpu_device_on_unintended_bias_files(tmp_path, real_csv):
    """Spawn on one device, trained on files of the Unintended Bias layout: the reference reads
    them as jaxtpu does (`target` as a soft target) and reports and monitors the same bias
    metric (the shared `jaxtpu.core` code)."""
    from benchmarks.competitions import write_bias_file

    train = write_bias_file(real_csv, tmp_path / "train.csv", 320, 0, 0)
    valid = write_bias_file(real_csv, tmp_path / "valid.csv", 160, 2000, 1)
    run = run_side(
        "torch",
        tmp_path / "run",
        *TINY,
        "--parallel",
        "spawn",
        "--num-devices",
        "1",
        "--batch-size",
        "32",
        "--max-steps",
        "7",
        "--precision",
        "fp32",
        "--train-csv",
        str(train),
        "--valid-csv",
        str(valid),
    ).check()
    assert len(run.losses) == 7 and all(np.isfinite(run.losses))
    summary = run.summary
    assert summary["parallel"] == "spawn" and summary["monitor"] == "val_jigsaw_bias"
    for key in ("val_jigsaw_bias", "val_overall_auc", "val_subgroup_auc_female"):
        assert np.isfinite(summary["final"][key]), key


@pytest.mark.e2e
@pytest.mark.torch
def test_spawn_refuses_more_cpu_devices_than_it_can_run(tmp_path):
    run = run_side(
        "torch",
        tmp_path / "run",
        *TINY,
        "--parallel",
        "spawn",
        "--num-devices",
        "2",
        env={"PJRT_DEVICE": "CPU"},
    )
    assert run.returncode == 2
    assert "--parallel spawn --num-devices 2: on CPU torch_xla 2.9" in run.stderr
    assert "SPAWN_ON_CPU.md" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.e2e
@pytest.mark.torch
def test_jax_strategy_names_are_refused_on_the_torch_side(tmp_path):
    run = run_side("torch", tmp_path / "run", *TINY, "--parallel", "pmap")
    assert run.returncode == 2 and "invalid choice: 'pmap'" in run.stderr
    assert "(choose from 'spmd', 'spawn', 'eager')" in run.stderr


@pytest.mark.e2e
@pytest.mark.torch
def test_eager_cpu_baseline_runs_and_needs_one_device(tmp_path):
    run = run_side(
        "torch",
        tmp_path / "run",
        *TINY,
        "--parallel",
        "eager",
        "--num-devices",
        "1",
        "--batch-size",
        "32",
        "--max-steps",
        "7",
        "--precision",
        "fp32",
        "--accumulate",
        "2",
    ).check()
    assert len(run.losses) == 7 and all(np.isfinite(run.losses))
    # micro-steps without an optimizer update report no gradient norm; updates do
    assert all(np.isfinite(r["grad_norm"]) for r in run.events("train") if r["step"] % 2 == 0)
    assert run.summary["parallel"] == "eager" and run.summary["train_compiles"] == 0
    refused = run_side("torch", tmp_path / "run8", *TINY, "--parallel", "eager")
    assert refused.returncode == 2 and "use --num-devices 1" in refused.stderr
