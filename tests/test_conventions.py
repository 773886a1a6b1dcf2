"""The ecosystem's conventions (issue 31): one `jaxtpu` command and `--config` files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.cli import parse_args
from jaxtpu.core.flags.configfile import read_config_file
from parity_tests.harness import ROOT, clean_env


def test_the_jaxtpu_command_lists_its_subcommands_and_runs_them(capsys):
    from jaxtpu.__main__ import COMMANDS, main

    assert main(["--help"]) == 0
    listing = capsys.readouterr().out
    for name in ("train", "predict", "evaluate", "export", "preflight", "bisect"):
        assert f"  {name} " in listing
    assert main(["--version"]) == 0 and capsys.readouterr().out.startswith("jaxtpu ")
    assert main(["no-such-command"]) == 2
    assert "unknown command 'no-such-command'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # a subcommand is its module: the same parser
        main(["train", "--help"])
    assert e.value.code == 0 and "--adam-eps" in capsys.readouterr().out
    for module, _ in COMMANDS.values():
        __import__(module)  # every subcommand's module exists


@pytest.mark.e2e
def test_the_console_script_is_installed():
    script = ROOT / ".venv" / "bin" / "jaxtpu"
    if not script.exists():
        pytest.skip(f"{script} not installed (make setup installs the package's console script)")
    proc = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, env=clean_env(), timeout=120
    )
    assert proc.returncode == 0 and "evaluate" in proc.stdout


def _parse(*argv: str):
    return parse_args(list(argv), prog="t", description="t")


def test_a_config_file_sets_flags_and_the_command_line_overrides_it(tmp_path):
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("task: ranking\noptim:\n  lr: 1e-4\n  adam-eps: 1.0e-6\nbatch_size: 8\n")
    cfg = _parse("--preset", "tiny", "--config", str(yaml_file), "--batch-size", "2")
    assert (cfg.train.task, cfg.optim.lr, cfg.optim.adam_eps) == ("ranking", 1e-4, 1e-6)
    assert cfg.train.batch_size == 2  # the command line wins
    as_json = tmp_path / "run.json"
    as_json.write_text(json.dumps({"lr": 2e-4}))
    assert _parse("--preset", "tiny", "--config", str(as_json)).optim.lr == 2e-4


@pytest.mark.parametrize(
    "text, message",
    [
        ("lrr: 1e-4\n", "unknown key 'lrr'"),
        ("batch_size: many\n", "batch_size='many' is not a valid int"),
        ("epochs: 1.5\n", "epochs=1.5 is not a valid int"),
        ("- a\n- b\n", "expected a mapping of flag names to values"),
        ("task: [\n", "not valid YAML"),
    ],
)
def test_bad_config_files_are_one_line_naming_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")) as e:
        read_config_file(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.e2e
def test_a_runs_config_json_reruns_it_exactly(tmp_path):
    """A run directory's config.json is a --config: the rerun's losses are the run's."""
    first, second = tmp_path / "first", tmp_path / "second"
    args = [
        "--preset",
        "tiny",
        "--max-steps",
        "4",
        "--log-every",
        "1",
        "--lr",
        "7e-4",
        "--num-devices",
        "8",
        "--no-progress",
    ]

    def run(*argv):
        command = [sys.executable, "-m", "jaxtpu", "train", *argv]
        proc = subprocess.run(
            command, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-2000:]

    run(*args, "--workdir", str(first))
    run("--config", str(first / "config.json"), "--workdir", str(second))

    def losses(wd):
        lines = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
        return [x["loss"] for x in lines if x["event"] == "train"]

    recorded = json.loads((second / "config.json").read_text())["config"]
    assert recorded["optim"]["lr"] == 7e-4 and recorded["train"]["max_steps"] == 4
    assert losses(first) == losses(second) and len(losses(first)) == 4


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


def test_print_config_writes_a_file_that_gives_back_the_same_config(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        _parse(
            "--preset", "lightning-severity", "--model-dir", "m", "--lr", "2e-5", "--print-config"
        )
    assert e.value.code == 0
    path = tmp_path / "lightning.yaml"
    path.write_text(capsys.readouterr().out)
    assert _parse("--config", str(path)) == _parse(
        "--preset", "lightning-severity", "--model-dir", "m", "--lr", "2e-5"
    )
    # a preset's required model directory is a placeholder, never a silent random init
    with pytest.raises(SystemExit):
        _parse("--preset", "xla-notebook", "--print-config")
    text = capsys.readouterr().out
    assert "model_dir: 'SET-ME: the pretrained model directory'" in text


@pytest.mark.e2e
def test_training_from_a_python_session_whose_jax_has_started(tmp_path):
    """A notebook that already used JAX (one CPU device) trains in-process: nothing is
    re-executed, and asking for more devices than it has is one line saying how many."""
    script = f"""
import jax.numpy as jnp
jnp.ones(1).block_until_ready()  # the backend starts with its default device count
from jaxtpu.core.flags import presets
from jaxtpu.core.errors import DeviceError
from jaxtpu.train import train_and_evaluate
s = train_and_evaluate(presets.tiny().replace(num_devices=1, max_steps=3,
                                              workdir=r"{tmp_path / "run"}"))
print("steps", s["steps"])
try:
    train_and_evaluate(presets.tiny().replace(num_devices=8, workdir=r"{tmp_path / "b"}"))
except DeviceError as e:
    print("refused:", e)
"""
    env = {k: v for k, v in clean_env().items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "steps 3" in proc.stdout
    assert "refused: --num-devices 8: only 1 cpu device(s) available" in proc.stdout
