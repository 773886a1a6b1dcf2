"""Stopping a run (`jaxtpu.core.run.signals`): Ctrl-C as safe as SIGTERM on both sides,
SIGTERM while the programs compile, and SIGKILL at random moments, each resumed to the
uninterrupted run's numbers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from helpers import (
    EAGER,
    TINY,
    cli,
    final_metrics,
    resumable_args,
    start,
    strict_json_lines,
    wait_for_step,
)

from jaxtpu import train
from parity_tests.harness import ROOT, clean_env


@pytest.mark.e2e
def test_ctrl_c_saves_exits_130_with_the_resume_command_and_resumes(uninterrupted, tmp_path):
    wd = tmp_path / "run"
    proc = start("jaxtpu.train", *resumable_args(wd))
    wait_for_step(wd, proc, 4)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    assert "SIGINT: saved the latest state at step" in out and "Traceback" not in err
    command = err.split("Continue with: ")[1].strip().split()
    assert command[:3] == ["python", "-m", "jaxtpu.train"] and "--resume" in command
    summary = strict_json_lines(wd / "summary.json")[0]  # no -Infinity for 'no best yet'
    assert summary["stopped_by"] == "SIGINT" and summary["best"]["value"] is None
    steps = int(summary["steps"])
    assert (wd / "checkpoints" / "latest" / str(steps)).is_dir()
    resumed = cli(*command[2:])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert final_metrics(wd)["val_loss"] == pytest.approx(
        final_metrics(uninterrupted)["val_loss"], rel=1e-6
    )
    strict_json_lines(wd / "metrics.jsonl")


@pytest.mark.e2e
def test_a_second_ctrl_c_stops_at_once(tmp_path):
    wd = tmp_path / "run"
    proc = start("jaxtpu.train", *resumable_args(wd))
    wait_for_step(wd, proc, 2)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err


@pytest.mark.e2e
@pytest.mark.torch
def test_ctrl_c_on_the_torch_side_saves_and_resumes(tmp_path):
    wd = tmp_path / "run"
    args = [*EAGER, "--workdir", str(wd), "--epochs", "40", "--log-every", "1", "--dropout", "0"]
    proc = start("torchxla_ref.train", *args)
    wait_for_step(wd, proc, 3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "Continue with: python -m torchxla_ref.train" in err, err
    steps = json.loads((wd / "summary.json").read_text())["steps"]
    assert list((wd / "checkpoints" / "latest").glob(f"step_{steps}.pt"))
    resumed = cli("torchxla_ref.train", *args, "--resume", "--max-steps", str(steps + 2))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout
    assert json.loads((wd / "summary.json").read_text())["steps"] == steps + 2


@pytest.mark.e2e
def test_sigkill_at_random_moments_then_resume_matches_the_uninterrupted_run(
    uninterrupted, tmp_path
):
    """Five seeded kills at random moments: as a training call starts, inside an evaluation
    batch, inside a checkpoint write (temporary directory written, not yet renamed), in a
    seeded order with each kind at least once; each time the run is resumed, and it ends
    exactly where the uninterrupted one does. Every moment is one the resumed process is sure
    to reach: a resumed run has at least 3 steps, an evaluation and a checkpoint ahead."""
    rng = np.random.default_rng(1234)
    kinds = ["call", "eval", "save", *rng.choice(["call", "eval", "save"], 2)]
    rng.shuffle(kinds)
    faults = [f"call:{rng.integers(1, 4)}" if k == "call" else f"{k}:1" for k in kinds]
    wd = tmp_path / "run"
    for i, fault in enumerate(faults):
        args = resumable_args(wd) + (["--resume"] if i else [])
        proc = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "fault_run.py"), fault, *args],
            cwd=ROOT,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == -signal.SIGKILL, (fault, proc.stderr[-2000:])
        assert not (wd / "summary.json").exists()
    proc = cli("jaxtpu.train", *resumable_args(wd), "--resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = final_metrics(uninterrupted), final_metrics(wd)
    assert a["step"] == b["step"] == 21
    assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-6, abs=0)
    assert b["val_auc"] == pytest.approx(a["val_auc"], abs=1e-9)
    losses = {}
    for run in (uninterrupted, wd):
        lines = strict_json_lines(run / "metrics.jsonl")
        losses[run] = [x["loss"] for x in lines if x.get("event") == "train"]
    assert len(losses[wd]) == 21
    np.testing.assert_allclose(losses[wd], losses[uninterrupted], rtol=1e-6)


@pytest.mark.model
def test_sigterm_while_the_programs_compile_stops_with_the_documented_exit(
    tmp_path, monkeypatch, caplog
):
    from jaxtpu.engine.backend import JaxBackend

    real = JaxBackend.precompile

    def preempted(self, calls, evals):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the programs are built
        return real(self, calls, evals)

    monkeypatch.setattr(JaxBackend, "precompile", preempted)
    caplog.set_level("INFO", logger="jaxtpu")
    wd = tmp_path / "run"
    assert train.main(["--preset", "tiny", "--workdir", str(wd), "--epochs", "2"]) == 0
    assert "SIGTERM before the first step: nothing trained, nothing to save" in caplog.text
    summary = json.loads((wd / "summary.json").read_text())
    assert summary["stopped_by"] == "SIGTERM" and summary["steps"] == 0
    assert not (wd / "checkpoints").exists()


@pytest.mark.e2e
def test_sigterm_checkpoints_and_exits_cleanly_then_resumes(uninterrupted, tmp_path):
    wd = tmp_path / "run"
    cmd = [sys.executable, "-m", "jaxtpu.train", *resumable_args(wd)]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_for_step(wd, proc, 4)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert "SIGTERM: saved the latest state at step" in out
    resumed = cli("jaxtpu.train", *resumable_args(wd), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert final_metrics(wd)["val_loss"] == pytest.approx(
        final_metrics(uninterrupted)["val_loss"], rel=1e-6
    )


@pytest.mark.e2e
@pytest.mark.parametrize("module", ["jaxtpu.train", "torchxla_ref.train"])
def test_sigterm_while_the_data_and_model_are_made_stops_before_the_first_step(tmp_path, module):
    """A SIGTERM that arrives before the loop's own handler (while the data are read, the
    model is built, the state placed) stops the run before its first step as the docs say,
    instead of dying with XLA's 'RAW: Raising signal 15 with default behavior' (exit -15)."""
    wd = tmp_path / "run"
    flags = EAGER if module.startswith("torchxla") else TINY
    proc = start(module, *flags, "--workdir", str(wd), "--log-every", "1")
    for line in proc.stdout:  # the first log line: the devices, before the data are read
        if line.startswith("devices:"):
            proc.send_signal(signal.SIGTERM)
            break
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert "SIGTERM before the first step: nothing trained, nothing to save" in out + err
    assert "RAW:" not in err and "Traceback" not in err
    assert "no evaluation yet, no best model" in out + err  # not 'best -inf at step None'
    summary = json.loads((wd / "summary.json").read_text())
    assert summary["stopped_by"] == "SIGTERM" and summary["steps"] == 0
