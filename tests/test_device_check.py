"""`python -m benchmarks.training.device_check --dry-run`: the GPU/TPU check (issue 66, item 5) is
ready when a device is lent. Its parity part runs end to end on tiny shapes here (jaxtpu against
plain torch in fp32, bf16 and fp16, the report under --out: about 40 s); the steps and scoring
parts, which start the benchmark worker, a training, an export and two scoring scripts, run in
process with those processes faked, each command checked against the parser of what it starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from parity_tests.harness import ROOT, clean_env


@pytest.mark.e2e
@pytest.mark.torch
def test_the_device_check_dry_run_compares_every_precision_and_writes_the_report(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.training.device_check", "--out", str(tmp_path),
         "--dry-run", "--parts", "parity"],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert report["dry_run"] and report["devices"]["jax"]["platform"] == "cpu"
    parity = {r["precision"]: r for r in report["parity"]}
    assert set(parity) == {"fp32", "bf16", "fp16"}
    assert all(r["passed"] for r in parity.values())
    assert parity["fp32"]["grad_worst_rel_diff"] <= parity["fp32"]["grad_bound"]
    # fp16's gradients, taken under a loss scale, are closer than bf16's (3 more bits)
    assert parity["fp16"]["grad_worst_rel_diff"] < parity["bf16"]["grad_worst_rel_diff"] < 0.05
    assert report["steps"] == report["scoring"] == [] and "failed" not in report
    text = (tmp_path / "device_check.md").read_text()
    assert "dry run" in text and "| fp16 |" in text and text in proc.stdout


def test_the_steps_and_scoring_parts_start_what_they_name_and_read_its_answers(
    tmp_path, monkeypatch
):
    """Each process the two parts start is checked against the parser of what it runs (the
    worker's, training's, export's), and its answer read into the report's rows."""
    from benchmarks.training import device_check, worker
    from jaxtpu.core.flags.cli import parse_args
    from jaxtpu.core.flags.commands import command_parser

    started = []

    def fake_call(cmd, timeout=600):
        started.append(cmd)
        module = cmd[2] if cmd[1] == "-m" else "script"
        if module == "benchmarks.training.worker":
            worker.parser().parse_args(cmd[3:])
            out = json.dumps({"median_s": 0.5, "compile_s": 2.0})
        elif module == "jaxtpu.train":
            parse_args(cmd[3:], "jaxtpu.train", "")
            (tmp_path / "run").mkdir(exist_ok=True)
            out = ""
        elif module == "jaxtpu.export":
            command_parser("export", "").parse_args(cmd[3:])
            out = ""
        else:  # a scoring script: python -c CODE MODEL COMMENTS MAX_LEN
            assert cmd[1] == "-c" and len(json.loads(open(cmd[4]).read())) == 64
            out = json.dumps({"per_s": 100.0})
        return subprocess.CompletedProcess(cmd, 0, out + "\n", "")

    monkeypatch.setattr(device_check, "call", fake_call)
    monkeypatch.setattr(
        device_check,
        "devices",
        lambda: {
            "jax": {"count": 1, "kind": "cpu", "platform": "cpu", "compute_capability": None},
            "torch": {"name": "cpu", "cuda": False},
        },
    )
    argv = ["--out", str(tmp_path), "--dry-run", "--parts", "steps,scoring"]
    assert device_check.main(argv) == 0
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert {r["way"] for r in report["steps"]} == {"jaxtpu jit", "torch eager"}
    assert all(r["steps_per_s"] == 2.0 and r["compile_s"] == 2.0 for r in report["steps"])
    scoring = {r["way"]: r for r in report["scoring"]}
    assert set(scoring) == {"jaxtpu.load().predict", "transformers pipeline"}
    assert all(r["comments_per_s"] == 100.0 and r["comments"] == 64 for r in scoring.values())
    modules = [c[2] if c[1] == "-m" else "script" for c in started]
    assert modules == [
        "benchmarks.training.worker", "benchmarks.training.worker", "jaxtpu.train",
        "jaxtpu.export", "script", "script",
    ]  # fmt: skip


def test_the_step_plan_fits_a_lease_and_a_partial_report_still_prints():
    """The H200 lease ran out in the steps part (18 processes, docs/gpu.md): the plan is 9 on a
    GPU with bf16, compile and BERT-base in the fastest precision; a report whose later parts
    never ran (or failed) still prints its table, the failure named."""
    from benchmarks.training.device_check import step_plan, table

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
