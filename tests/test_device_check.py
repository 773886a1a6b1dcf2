"""`python -m benchmarks.device_check --dry-run`: the GPU/TPU check (issue 66, item 5) runs
end to end on tiny shapes here, so it is ready when a device is lent: every part writes its
rows, the parity part compares jaxtpu with plain torch in fp32, bf16 and fp16, and the report
lands under --out (55-104 s on the 2-core machine, by how busy it is)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from parity_tests.harness import ROOT, clean_env


@pytest.mark.e2e
@pytest.mark.torch
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


def test_the_step_plan_fits_a_lease_and_a_partial_report_still_prints():
    """The H200 lease ran out in the steps part (18 processes, docs/gpu.md): the plan is 9 on a
    GPU with bf16, compile and BERT-base in the fastest precision; a report whose later parts
    never ran (or failed) still prints its table, the failure named."""
    from benchmarks.device_check import step_plan, table

    plan = step_plan(False, ["fp32", "bf16", "fp16"], 1)
    assert len(plan) == 9
    assert {p for w, p, *_ in plan if w == "minilm"} == {"fp32", "bf16", "fp16"}
    assert [(w, p) for w, p, f, s, _ in plan if s == "compile" or w == "bert-base"] == [
        ("minilm", "bf16"),
        ("bert-base", "bf16"),
        ("bert-base", "bf16"),
    ]
    t4 = step_plan(False, ["fp32", "fp16"], 2)  # no bf16: the fastest is fp16
    assert {p for w, p, *_ in t4 if w == "bert-base"} == {"fp16"} and (
        "minilm",
        "fp16",
        "jaxtpu",
        "jit",
        "2",
    ) in t4
    devices = {"jax": {"count": 1, "kind": "H", "platform": "gpu"}, "torch": {"name": "H"}}
    row = {"precision": "fp32", "logits_max_abs_diff": 1e-5, "logits_bound": 1e-4}
    row |= {"grad_worst_rel_diff": 2e-3, "grad_bound": 1e-3, "passed": False}
    partial = {"dry_run": False, "devices": devices, "parity": [row], "seconds": 9}
    partial["failed"] = {"steps": "RuntimeError: worker failed\nout of memory"}
    text = table(partial)
    assert "| fp32 | 1e-05 (0.0001) | 0.002 (0.001) | NO |" in text
    assert "**steps failed:** out of memory" in text
