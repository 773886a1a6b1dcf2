"""Multi-host JAX on one machine: 2 processes x 4 virtual CPU devices, joined through
`jax.distributed.initialize` on a loopback coordinator with gloo CPU collectives, must train
exactly like 1 process x 8 devices; only process 0 writes; a SIGTERM on any process stops all of
them at the same step and `--resume` continues to the uninterrupted result."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from parity_tests.harness import ROOT, clean_env, run_jax_runs

ARGS = ["--preset", "tiny", "--no-progress", "--precision", "fp32", "--log-every", "1"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(wd: Path, *extra: str, processes: int = 1) -> list[subprocess.Popen]:
    """Starts one run as `processes` processes (each with 8 / processes devices)."""
    base = [sys.executable, "-m", "jaxtpu.train", *ARGS, *extra]
    if processes == 1:
        cmds = [[*base, "--workdir", str(wd)]]
    else:
        port = _free_port()
        cmds = [
            [
                *base,
                "--num-devices",
                str(8 // processes),
                "--num-processes",
                str(processes),
                "--process-id",
                str(i),
                "--coordinator-address",
                f"127.0.0.1:{port}",
                # every process names its own directory: only process 0's may appear
                "--workdir",
                str(wd) if i == 0 else str(wd.with_name(wd.name + f"-p{i}")),
            ]
            for i in range(processes)
        ]
    return [
        subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for cmd in cmds
    ]


def _finish(procs: list[subprocess.Popen], timeout: float = 400) -> list[tuple[str, str]]:
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    return outs


def _records(wd: Path, event: str) -> list[dict]:
    lines = (wd / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("event") == event]


def _assert_same_run(one: Path, two: Path) -> None:
    a, b = _records(one, "train"), _records(two, "train")
    assert [r["step"] for r in a] == [r["step"] for r in b] and len(a) >= 7
    for ra, rb in zip(a, b, strict=True):  # fp32; only the all-reduce order differs
        assert rb["loss"] == pytest.approx(ra["loss"], rel=1e-5), (ra["step"], ra, rb)
    fa = json.loads((one / "summary.json").read_text())["final"]
    fb = json.loads((two / "summary.json").read_text())["final"]
    assert fb["val_loss"] == pytest.approx(fa["val_loss"], rel=1e-5)
    assert fb["val_auc"] == pytest.approx(fa["val_auc"], abs=1e-6)


STRATEGIES = ("jit", "pmap", "shard_map")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    """Each strategy's run as 1 process x 8 devices (`DIR/<strategy>`): what its two-process
    run must equal; the three one after another in one process (`run_jax_runs`)."""
    root = tmp_path_factory.mktemp("one-process")
    for run in run_jax_runs([(root / s, [*ARGS, "--parallel", s]) for s in STRATEGIES]):
        run.check()
    return root


@pytest.mark.e2e
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_processes_train_like_one(tmp_path, strategy, one_process):
    one, two = one_process / strategy, tmp_path / "two"
    (out0, _), (out1, _) = _finish(_start(two, "--parallel", strategy, processes=2))
    assert "8 x cpu (cpu) over 2 processes" in out0
    _assert_same_run(one, two)
    cfg = json.loads((two / "config.json").read_text())
    assert len(cfg["devices"]) == 8
    # Only process 0 writes: the directory given to process 1 is never created, and process 1
    # does not report progress.
    assert not (tmp_path / "two-p1").exists()
    assert "eval @ step" in out0 and "eval @ step" not in out1
    assert (two / "checkpoints" / "best").is_dir() and (two / "tokenizer").is_dir()


@pytest.mark.e2e
def test_sigterm_on_one_process_stops_all_then_resume_matches(tmp_path):
    longer = ["--parallel", "jit", "--epochs", "3", "--eval-every", "7"]
    one, two = tmp_path / "one", tmp_path / "two"
    _finish(_start(one, *longer))
    procs = _start(two, *longer, processes=2)
    # wait until the run is under way (process 0 logs steps), then preempt process 1 only
    metrics = two / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (
        metrics.exists() and any('"event": "train"' in x for x in metrics.read_text().splitlines())
    ):
        assert all(p.poll() is None for p in procs), procs[0].stderr.read()[-3000:]
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)
    (out0, _), _ = _finish(procs)
    assert "SIGTERM: saved the latest state at step" in out0
    stopped = json.loads((two / "summary.json").read_text())
    assert stopped["stopped_by"] == "SIGTERM" and stopped["steps"] < stopped["total_steps"]
    (out0, _), _ = _finish(_start(two, *longer, "--resume", processes=2))
    assert f"at step {stopped['steps']}" in out0
    _assert_same_run(one, two)
