"""`python -m benchmarks.device_check --dry-run`: the GPU/TPU check (issue 66, item 5) runs
end to end on tiny shapes here, so it is ready when a device is lent: every part writes its
rows, the parity part compares jaxtpu with plain torch in fp32, bf16 and fp16, and the report
lands under --out (about 55 s on the 2-core machine)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from parity_tests.harness import ROOT, clean_env

pytestmark = [pytest.mark.e2e, pytest.mark.torch]


def test_the_device_check_dry_run_writes_every_part(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.device_check", "--out", str(tmp_path), "--dry-run"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert report["dry_run"] and report["devices"]["jax"]["platform"] == "cpu"
    parity = {r["precision"]: r for r in report["parity"]}
    assert set(parity) == {"fp32", "bf16", "fp16"}
    assert all(r["passed"] for r in parity.values())
    assert parity["fp32"]["grad_worst_rel_diff"] <= parity["fp32"]["grad_bound"]
    # fp16's gradients, taken under a loss scale, are closer than bf16's (3 more bits)
    assert parity["fp16"]["grad_worst_rel_diff"] < parity["bf16"]["grad_worst_rel_diff"] < 0.05
    ways = {r["way"] for r in report["steps"]}
    assert ways == {"jaxtpu jit", "torch eager"}
    assert all(r["steps_per_s"] > 0 for r in report["steps"])
    scoring = {r["way"]: r for r in report["scoring"]}
    assert set(scoring) == {"jaxtpu.load().predict", "transformers pipeline"}
    assert all(r["comments_per_s"] > 0 and r["comments"] == 64 for r in scoring.values())
    text = (tmp_path / "device_check.md").read_text()
    assert "dry run" in text and "| fp16 |" in text and text in proc.stdout
