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
# Each task once and each precision once: the parity file's 8-device trajectories
# (`test_loss_trajectories_8_devices`) run torch_xla SPMD on every task x precision and hold
# each loss to jaxtpu's step for step; what this adds (compiles stay put, the metric) is
# not a matter of the combination.
@pytest.mark.parametrize("task, precision", [("toxicity", "bf16"), ("ranking", "fp32")])
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
    from parity_tests.competitions import write_bias_file

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
    assert "(choose from 'spmd', 'spawn', 'eager', 'ddp')" in run.stderr


@pytest.mark.e2e
@pytest.mark.torch
def test_eager_cpu_baseline_runs_and_needs_one_device(tmp_path):
    """Plain PyTorch on one device; torch_xla is never imported (a stand-in that stops the
    process if anything imports it: transformers and accelerate would, unless told not to)."""
    trap = tmp_path / "trap" / "torch_xla"
    trap.mkdir(parents=True)
    (trap / "__init__.py").write_text("raise SystemExit('torch_xla was imported')\n")
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
        env={"PYTHONPATH": str(trap.parent)},
    ).check()
    assert len(run.losses) == 7 and all(np.isfinite(run.losses))
    # micro-steps without an optimizer update report no gradient norm; updates do
    assert all(np.isfinite(r["grad_norm"]) for r in run.events("train") if r["step"] % 2 == 0)
    assert run.summary["parallel"] == "eager" and run.summary["train_compiles"] == 0
    refused = run_side("torch", tmp_path / "run8", *TINY, "--parallel", "eager")
    assert refused.returncode == 2 and "use --num-devices 1" in refused.stderr


@pytest.mark.e2e
@pytest.mark.torch
def test_ddp_trains_what_eager_trains_on_the_same_global_batch(tmp_path):
    """`--parallel ddp`: two CPU processes over gloo, 8 rows each, against one eager process
    with 16: the same losses, gradient norms and validation scores, with gradient accumulation
    (dropout off: each process draws its own masks). About 20 s."""
    same = [*TINY, "--max-steps", "6", "--accumulate", "2", "--precision", "fp32"]
    same += ["--dropout", "0", "--encoder-dropout", "0"]
    ddp = run_side(
        "torch", tmp_path / "ddp", *same, "--parallel", "ddp", "--num-devices", "2",
        "--batch-size", "8",
    ).check()  # fmt: skip
    eager = run_side(
        "torch", tmp_path / "eager", *same, "--parallel", "eager", "--num-devices", "1",
        "--batch-size", "16",
    ).check()  # fmt: skip
    assert len(ddp.losses) == 6 and ddp.summary["parallel"] == "ddp"
    np.testing.assert_allclose(ddp.losses, eager.losses, rtol=0, atol=1e-3)
    norms = [
        [r["grad_norm"] for r in run.events("train") if r["step"] % 2 == 0] for run in (ddp, eager)
    ]
    np.testing.assert_allclose(*norms, rtol=2e-3)
    scores = [
        np.loadtxt(run.workdir / "valid_scores.csv", delimiter=",", skiprows=1, usecols=-1)
        for run in (ddp, eager)
    ]
    np.testing.assert_allclose(*scores, rtol=0, atol=1e-3)
    assert not list((tmp_path / "ddp").glob(".ddp_*"))  # the rendezvous file is gone


@pytest.mark.e2e
@pytest.mark.torch
def test_a_user_error_in_the_ddp_processes_is_one_line(tmp_path):
    csv = tmp_path / "train.csv"
    csv.write_text("id,text\n1,hello\n")
    run = run_side(
        "torch", tmp_path / "run", *TINY, "--parallel", "ddp", "--num-devices", "2",
        "--train-csv", str(csv),
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "comment_text" in last, run.stderr
    assert "Traceback" not in run.stderr and "ProcessExitedException" not in run.stderr


def test_ddp_wants_no_more_processes_than_gpus(monkeypatch):
    import torch

    from jaxtpu.core.errors import DeviceError
    from torchxla_ref import parallel

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert parallel.ddp_devices(8) == "cpu"  # CPU processes: as many as asked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert parallel.ddp_devices(2) == "cuda"
    with pytest.raises(DeviceError, match="this host has 2 CUDA GPUs; use --num-devices 2"):
        parallel.ddp_devices(4)
