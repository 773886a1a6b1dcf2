"""The `jaxtpu` command (`jaxtpu.__main__`), its console script, and training from a Python
session whose JAX has already started."""

from __future__ import annotations

import subprocess
import sys

import pytest

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
