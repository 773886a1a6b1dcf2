"""Experiment trackers (`jaxtpu.core.run.trackers`): every metric reaches them, and a
missing client is one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jaxtpu.core.errors import ConfigError


@pytest.mark.e2e
def test_trackers_get_every_metric_and_wandb_reads_back_offline(tmp_path, monkeypatch):
    """--tracker tensorboard,wandb on the shared loop (a numpy fake backend): W&B, offline,
    holds the run config and every train loss of metrics.jsonl, read back with wandb's own
    reader of the run's log; TensorBoard writes its events."""
    pytest.importorskip("wandb", reason="the wandb extra is not installed")
    from helpers import FakeBackend, fake_job

    from jaxtpu.core.run.rundir import RunLog

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    from jaxtpu.core.run import loop
    from jaxtpu.core.run.protocol import ResumeState

    job = fake_job(tmp_path, epochs=1, lr=1e-3)
    runlog = RunLog(tmp_path, trackers=("tensorboard", "wandb"), config=job.cfg.to_dict())
    loop.run(job, FakeBackend({}), ResumeState(), runlog)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = {x["step"]: x["loss"] for x in lines if x["event"] == "train"}
    assert any((tmp_path / "tensorboard").iterdir())

    log = next((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    wandb_cli = Path(sys.executable).parent / "wandb"
    proc = subprocess.run(
        [str(wandb_cli), "leet", "inspect", "--json", str(log)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    history = {
        r["history"]["step"]["num"]: r["history"]["item"]
        for r in records
        if r.get("type") == "history"
    }
    assert {s: h["train/loss"] for s, h in history.items() if "train/loss" in h} == losses
    assert any("eval/val_auc" in h for h in history.values())
    run = next(r["run"] for r in records if r.get("type") == "run")
    config = run["config"]["update"]
    assert config["optim"]["lr"] == 1e-3 and config["train"]["task"] == "toxicity"


def test_a_tracker_whose_client_is_missing_is_one_line(monkeypatch):
    import importlib.util

    from jaxtpu.core.flags import presets

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "wandb" else real(n, *a)
    )
    with pytest.raises(
        ConfigError,
        match=r"--tracker wandb: its client wandb is not installed: "
        r"pip install 'jaxtpu\[wandb\]'",
    ):
        presets.tiny().replace(tracker="tensorboard,wandb")
    with pytest.raises(ConfigError, match="--tracker 'mlflow': choose from tensorboard, wandb"):
        presets.tiny().replace(tracker="mlflow")


def test_wandb_online_without_credentials_is_one_line_before_anything_is_made(
    tmp_path, monkeypatch
):
    from jaxtpu.core.flags import presets
    from jaxtpu.core.run.rundir import claim_workdir
    from jaxtpu.core.run.trackers import check_ready

    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    netrc = tmp_path / "netrc"
    monkeypatch.setenv("NETRC", str(netrc))  # none yet: `wandb login` was never run
    cfg = presets.tiny().replace(tracker="wandb")
    run = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"--tracker wandb: no W&B credentials for api.wandb.ai"):
        with claim_workdir(run, cfg):
            pass
    assert not run.exists()  # no lock, no metrics.jsonl, no tokenizer: the next run is not refused
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_ready(("wandb",))
    monkeypatch.delenv("WANDB_MODE")
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    netrc.chmod(0o600)
    check_ready(("wandb",))  # what `wandb login` writes
    netrc.unlink()
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    check_ready(("wandb",))
