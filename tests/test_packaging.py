"""Packaging (`pyproject.toml`, `requirements/`): jaxtpu's dependencies are ranges, so it
installs beside the JAX a TPU image already has (Kaggle, Colab, a Cloud TPU VM) instead of
replacing it; each end of the ranges is locked and tested (`make test`, `make test-oldest`)."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

import pytest

from parity_tests.harness import ROOT


@pytest.mark.e2e
def test_installing_beside_an_existing_jax_keeps_it(tmp_path):
    """pip resolves jaxtpu's requirements against this environment's own JAX and Flax (jax
    0.12.0.1 and flax 0.12.12 on the newest stack, 0.10.2 and 0.12.8 on the oldest) and would
    install nothing but jaxtpu itself: no download (--no-index), no other version."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--no-index",
            "--no-build-isolation",
            "--report",
            str(report),
            "-e",
            f"{ROOT}[tpu,torch,wandb]",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    wanted = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    have = {name: version(name) for name in ("jax", "jaxlib", "flax", "libtpu")}
    assert wanted == ["jaxtpu"], (wanted, have)


def pins(text: str) -> dict[str, str]:
    """name -> version of a lock's `name==version` lines (names normalised)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, pinned = line.partition("==")
            out[name.strip().lower().replace("_", "-")] = pinned.strip()
    return out


def test_the_ranges_hold_both_locked_ends():
    """Every exact version of requirements/newest.txt, oldest.txt, cuda.txt and archive.txt
    (Beam's environment: the `archive` extra's and onnxruntime's too) is inside the ranges of
    pyproject.toml (what a user's pip is allowed to pick)."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ranges = [Requirement(r) for r in project["dependencies"]]
    for extra in ("jax", "torch", "wandb"):
        ranges += [Requirement(r) for r in project["optional-dependencies"][extra]]
    beam = [Requirement(r) for e in ("archive", "serve-onnx") for r in
            project["optional-dependencies"][e] if not r.startswith("jaxtpu")]  # fmt: skip
    for lock, python in (("newest", "3.12"), ("oldest", "3.11"), ("cuda", "3.12"),
                         ("archive", "3.12")):  # fmt: skip
        pinned = pins((ROOT / "requirements" / f"{lock}.txt").read_text())
        torch_free = [r for r in ranges if r.name not in ("torch", "torch_xla", "peft", "wandb")]
        for r in ranges if lock != "archive" else torch_free + beam:
            if r.marker is not None and not r.marker.evaluate({"python_version": python}):
                continue
            name = r.name.lower().replace("_", "-")
            assert name in pinned, f"{lock}.txt has no {name}"
            assert r.specifier.contains(pinned[name]), f"{lock}.txt: {name}=={pinned[name]} not {r}"


def test_the_ranges_leave_out_flax_and_jax_that_do_not_work_together():
    """Issue 67, item 13: flax 0.12.8 with jax 0.11.1 or newer (a removed jax API) is not a
    pair a user's pip may pick: on the Pythons where jax passes 0.10.2, flax is 0.12.9 on."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    jax = project["optional-dependencies"]["jax"]
    flax = [Requirement(r) for r in jax if Requirement(r).name == "flax"]
    for python, allows_0128 in (("3.11", True), ("3.12", False), ("3.13", False)):
        held = [
            r for r in flax if r.marker is None or r.marker.evaluate({"python_version": python})
        ]
        assert len(held) == 1, python
        assert held[0].specifier.contains("0.12.8") == allows_0128, python
        assert held[0].specifier.contains("0.12.12"), python


@pytest.mark.e2e
def test_the_cuda_lock_is_a_resolution_of_the_ranges_and_keeps_the_newest_versions():
    """Issue 66, item 3: uv resolves pyproject.toml's ranges with the cuda extra (jax's CUDA 12
    plugin beside torch's CUDA 12.8 wheel) for Linux x86-64 and Python 3.12, held to
    requirements/cuda.txt, to exactly its versions (package metadata from PyPI; no GPU);
    and every version it shares with newest.txt, which `make test` runs, is newest.txt's."""
    from pathlib import Path

    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        pytest.skip(f"{uv}: make setup installs uv into the virtual environment")
    lock = ROOT / "requirements" / "cuda.txt"
    extras = ["torch", "pretrained", "cuda", "dev", "onnx", "gcs", "serve", "wandb"]
    proc = subprocess.run(
        [
            str(uv),
            *("pip", "compile", "pyproject.toml", "--python-version", "3.12"),
            *("--python-platform", "x86_64-manylinux_2_28", "-c", str(lock)),
            *(a for e in extras for a in ("--extra", e)),
            *("--no-header", "--no-annotate", "-q"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    locked = pins(lock.read_text())
    assert pins(proc.stdout) == locked
    assert {"jax-cuda12-plugin", "jax-cuda12-pjrt", "torch"} <= set(locked)
    assert "libtpu" not in locked
    newest = pins((ROOT / "requirements" / "newest.txt").read_text())
    differ = {n: (v, newest[n]) for n, v in locked.items() if n in newest and newest[n] != v}
    assert not differ, differ


def test_a_command_that_needs_jax_says_so_in_one_line_on_a_slim_install(monkeypatch, capsys):
    """Issue 87, item 1: with the `jax` extra missing (`jaxtpu[serve-onnx]` alone), a command
    that needs it is one line naming the extra, not an ImportError; serve --onnx, feedback and
    --help go on."""
    import jaxtpu.__main__ as cli
    from jaxtpu.core import versions

    monkeypatch.setattr(versions, "missing_jax", lambda: "jax")
    monkeypatch.setattr(cli, "jax_needed", versions.jax_needed)
    assert cli.main(["train", "--preset", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "jaxtpu train needs JAX (jax is not installed): pip install 'jaxtpu[jax]'" in err
    assert "jaxtpu[serve-onnx]" in err
    assert cli.main(["feedback"]) == 0  # its usage: no JAX needed
    with pytest.raises(SystemExit) as e:
        cli.main(["predict", "--help"])
    assert e.value.code == 0
