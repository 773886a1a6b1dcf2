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


def test_the_ranges_hold_both_locked_ends():
    """Every exact version of requirements/newest.txt and oldest.txt is inside the ranges of
    pyproject.toml (what a user's pip is allowed to pick)."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ranges = [Requirement(r) for r in project["dependencies"]]
    for extra in ("torch", "wandb"):
        ranges += [Requirement(r) for r in project["optional-dependencies"][extra]]
    for lock, python in (("newest", "3.12"), ("oldest", "3.11")):
        pins = {}
        for line in (ROOT / "requirements" / f"{lock}.txt").read_text().splitlines():
            if line and not line.startswith("#"):
                name, _, pinned = line.partition("==")
                pins[name.lower().replace("_", "-")] = pinned
        for r in ranges:
            if r.marker is not None and not r.marker.evaluate({"python_version": python}):
                continue
            name = r.name.lower().replace("_", "-")
            assert name in pins, f"{lock}.txt has no {name}"
            assert r.specifier.contains(pins[name]), f"{lock}.txt: {name}=={pins[name]} not {r}"


def test_the_ranges_leave_out_flax_and_jax_that_do_not_work_together():
    """Issue 67, item 13: flax 0.12.8 with jax 0.11.1 or newer (a removed jax API) is not a
    pair a user's pip may pick: on the Pythons where jax passes 0.10.2, flax is 0.12.9 on."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    flax = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "flax"]
    for python, allows_0128 in (("3.11", True), ("3.12", False), ("3.13", False)):
        held = [
            r for r in flax if r.marker is None or r.marker.evaluate({"python_version": python})
        ]
        assert len(held) == 1, python
        assert held[0].specifier.contains("0.12.8") == allows_0128, python
        assert held[0].specifier.contains("0.12.12"), python
