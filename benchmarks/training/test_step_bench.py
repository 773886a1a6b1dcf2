"""pytest-benchmark: one training step of each side and strategy, compilation excluded.

Run with `pytest benchmarks/ --benchmark-only` (the default test run skips benchmarks).
BENCH_WORKLOAD (tiny | minilm | bert-base, default minilm) and BENCH_PRECISION (bf16 | fp32,
default bf16) pick the workload; global batch 32 x 128 tokens; 8 devices for the XLA sides.
torch_xla runs in its own process (`benchmarks.training.worker`) because it must not share one with
JAX: its row reports the worker's measured steps through `extra_info` and times a replay of
them, so the table lines up with the in-process rows.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import pytest

from benchmarks.training import worker
from parity_tests.harness import ROOT, clean_env

WORKLOAD = os.environ.get("BENCH_WORKLOAD", "minilm")
PRECISION = os.environ.get("BENCH_PRECISION", "bf16")


def args_for(framework: str, strategy: str, devices: int, k: int = 1) -> argparse.Namespace:
    return argparse.Namespace(
        framework=framework,
        parallel=strategy,
        workload=WORKLOAD,
        precision=PRECISION,
        devices=devices,
        batch=32,
        seq=128,
        steps_per_call=k,
    )


@pytest.mark.parametrize(
    "framework,strategy,devices,k",
    [
        ("jaxtpu", "pmap", 8, 1),
        ("jaxtpu", "jit", 8, 1),
        ("jaxtpu", "jit", 1, 1),
        ("jaxtpu", "jit", 2, 8),
        ("torch", "eager", 1, 1),
        ("torch", "compile", 1, 1),
    ],
)
def test_train_step(benchmark, framework, strategy, devices, k):
    """One round is one device call: k steps (--steps-per-call k; extra_info says k)."""
    args = args_for(framework, strategy, devices, k)
    make = {"jaxtpu": worker.jax_step, "torch": worker.torch_cpu_step}[framework]
    step, wait = make(args, worker.config_for(args))
    wait(step())  # compile (and torch.compile's tracing) excluded from the timing
    wait(step())
    benchmark.extra_info.update(
        workload=WORKLOAD, precision=PRECISION, devices=devices, steps_per_call=k
    )
    benchmark.pedantic(lambda: wait(step()), rounds=5, warmup_rounds=1)


@pytest.mark.e2e
@pytest.mark.torch
def test_torch_xla_spmd_step(benchmark):
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.training.worker",
        "--framework",
        "torch_xla",
        "--parallel",
        "spmd",
        "--workload",
        WORKLOAD,
        "--precision",
        PRECISION,
        "--devices",
        "8",
        "--min-steps",
        "3",
        "--max-steps",
        "5",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    benchmark.extra_info.update(record)
    steps = iter(record["step_s"])
    benchmark.pedantic(lambda: time.sleep(next(steps)), rounds=len(record["step_s"]))
