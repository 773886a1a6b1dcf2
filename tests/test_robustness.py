"""Bad input end to end through the real commands, NaN losses, and preemption with real
processes and real signals."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import final_metrics, resumable_args, wait_for_step

from parity_tests.harness import ROOT, clean_env

HEADER = "id,comment_text,toxic,severe_toxic,obscene,threat,insult,identity_hate\n"
GOOD_ROWS = "".join(
    f"{i},comment number {i} {'idiot' * (i % 3 == 0)},{int(i % 3 == 0)},0,0,0,0,0\n"
    for i in range(60)
)
TINY = ["--preset", "tiny", "--no-progress"]


def cli(module: str, *args: str, timeout: float = 600, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=clean_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory, minilm_dir):
    d = tmp_path_factory.mktemp("bad")
    good = write(d / "good.csv", HEADER + GOOD_ROWS)
    other_size = d / "other-size-model"
    shutil.copytree(minilm_dir, other_size)
    cfg = json.loads((other_size / "config.json").read_text())
    (other_size / "config.json").write_text(json.dumps({**cfg, "hidden_size": 768}))
    no_tok = d / "no-tokenizer-model"
    no_tok.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(Path(minilm_dir) / name, no_tok / name)
    return {
        "dir": d,
        "good": good,
        "missing_col": write(d / "missing.csv", "id,text\n1,hello\n"),
        "empty": write(d / "empty.csv", ""),
        "header_only": write(d / "header.csv", HEADER),
        "label_2": write(d / "l2.csv", HEADER + GOOD_ROWS + "99,x,2,0,0,0,0,0\n"),
        "label_neg": write(d / "lneg.csv", HEADER + "99,x,-1,0,0,0,0,0\n" + GOOD_ROWS),
        "label_yes": write(d / "lyes.csv", HEADER + GOOD_ROWS + "99,x,yes,0,0,0,0,0\n"),
        "nan_comments": write(d / "nan.csv", HEADER + '1,,1,0,0,0,0,0\n2,"   ",0,0,0,0,0,0\n'),
        "single_row": write(d / "single.csv", HEADER + "1,hello there,1,0,0,0,0,0\n"),
        "latin1": write(d / "latin1.csv", (HEADER + "1,caf\xe9,1,0,0,0,0,0\n").encode("latin-1")),
        "other_size": other_size,
        "no_tokenizer": no_tok,
        "a_file": write(d / "a-file", "not a directory"),
    }


BAD = [
    (
        "missing column",
        lambda f: ["--train-csv", f["missing_col"]],
        "missing columns; found: id, text",
    ),
    ("empty csv", lambda f: ["--train-csv", f["empty"]], "file is empty"),
    ("header only", lambda f: ["--train-csv", f["header_only"]], "but no data rows"),
    ("label 2", lambda f: ["--train-csv", f["label_2"]], "line 62: toxic=2 is outside [0, 1]"),
    ("label -1", lambda f: ["--train-csv", f["label_neg"]], "line 2: toxic=-1 is outside [0, 1]"),
    ("label yes", lambda f: ["--train-csv", f["label_yes"]], "toxic='yes' is not a number"),
    ("nan/empty comments", lambda f: ["--train-csv", f["nan_comments"]], "all 2 rows dropped"),
    ("single row", lambda f: ["--train-csv", f["single_row"]], "too few to split"),
    ("not utf-8", lambda f: ["--train-csv", f["latin1"]], "not UTF-8 text (byte 0xe9 at line 2)"),
    ("directory as csv", lambda f: ["--train-csv", f["dir"]], "is a directory, expected a CSV"),
    (
        "model of another size",
        lambda f: ["--model-dir", f["other_size"]],
        "tensor embeddings.LayerNorm.bias has shape (384,), the model expects (768,)",
    ),
    ("missing tokenizer", lambda f: ["--model-dir", f["no_tokenizer"]], "no tokenizer found"),
    (
        "batch larger than data",
        lambda f: ["--train-csv", f["good"], "--batch-size", "64"],
        "is larger than the 54 training comments",
    ),
    (
        "more devices than exist",
        lambda f: ["--num-devices", "8"],
        "--num-devices 8: only 4 cpu device(s) available",
    ),
    ("workdir not writable", lambda f: ["--workdir", f["a_file"] / "run"], "is not writable"),
    ("unknown flag", lambda f: ["--learning-rate", "1"], "unrecognized arguments: --learning-rate"),
    ("bad value", lambda f: ["--epochs", "many"], "invalid int value: 'many'"),
    (
        "process id out of range",
        lambda f: [
            "--num-processes",
            "2",
            "--process-id",
            "2",
            "--coordinator-address",
            "127.0.0.1:1",
        ],
        "--process-id must be in 0..1, got 2",
    ),
    (
        "processes without coordinator",
        lambda f: ["--num-processes", "2"],
        "--num-processes > 1 needs --coordinator-address",
    ),
]

# The torch side reads data, model directories and flags through the same code; these go
# through `python -m torchxla_ref.train` (spmd on 8 CPU devices) too.
TORCH_BAD = [
    "missing column",
    "label 2",
    "label yes",
    "nan/empty comments",
    "not utf-8",
    "model of another size",
    "missing tokenizer",
    "batch larger than data",
    "workdir not writable",
    "unknown flag",
]
TORCH_BAD_ARGS = [
    *(b for b in BAD if b[0] in TORCH_BAD),
    (
        "multi-host flags",
        lambda f: ["--num-processes", "2", "--coordinator-address", "h:1"],
        "multi-host runs are jaxtpu only",
    ),
]


def _assert_one_clear_line(proc: subprocess.CompletedProcess, message: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    error_lines = [x for x in proc.stderr.splitlines() if "error:" in x]
    assert len(error_lines) == 1, proc.stderr


def _bad_argv(files: dict, tmp_path: Path, args) -> list[str]:
    argv = [str(a) for a in args(files)]
    return argv if "--workdir" in argv else [*argv, "--workdir", str(tmp_path / "run")]


@pytest.mark.e2e
@pytest.mark.parametrize("name,args,message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gives_one_clear_line_and_no_traceback(files, tmp_path, name, args, message):
    # For that case the machine gets 4 devices, as a host whose device count is fixed has.
    env = {"JAX_NUM_CPU_DEVICES": "4"} if name == "more devices than exist" else None
    proc = cli("jaxtpu.train", *TINY, *_bad_argv(files, tmp_path, args), env=env)
    _assert_one_clear_line(proc, message)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.e2e
@pytest.mark.torch
@pytest.mark.parametrize("name,args,message", TORCH_BAD_ARGS, ids=[b[0] for b in TORCH_BAD_ARGS])
def test_bad_input_through_the_torch_side(files, tmp_path, name, args, message):
    proc = cli("torchxla_ref.train", *TINY, *_bad_argv(files, tmp_path, args))
    _assert_one_clear_line(proc, message)


@pytest.mark.e2e
def test_texts_far_longer_than_max_len_are_truncated_and_train(files, tmp_path):
    long = HEADER + "".join(f"{i},{'word ' * 3000},{i % 2},0,0,0,0,0\n" for i in range(64))
    proc = cli(
        "jaxtpu.train",
        *TINY,
        "--train-csv",
        str(write(tmp_path / "long.csv", long)),
        "--workdir",
        str(tmp_path / "run"),
        "--batch-size",
        "2",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    wd = tmp_path_factory.mktemp("done") / "run"
    proc = cli("jaxtpu.train", *TINY, "--workdir", str(wd), "--max-steps", "7")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return wd


@pytest.mark.e2e
def test_corrupted_checkpoint_is_reported_and_kept(finished_run, tmp_path):
    wd = tmp_path / "run"
    shutil.copytree(finished_run, wd)
    step_dir = next((wd / "checkpoints" / "latest").iterdir())
    for f in step_dir.rglob("*"):
        if f.is_file() and f.stat().st_size > 1000:
            f.write_bytes(b"garbage")
    proc = cli("jaxtpu.train", *TINY, "--workdir", str(wd), "--resume", "--max-steps", "7")
    assert proc.returncode == 2
    assert re.search(r"checkpoints/latest/7: unreadable (or incomplete )?checkpoint", proc.stderr)
    assert "Traceback" not in proc.stderr
    assert step_dir.exists()  # nothing deleted


@pytest.mark.e2e
@pytest.mark.torch
def test_torch_side_refuses_corrupted_and_foreign_checkpoints(tmp_path):
    wd = tmp_path / "run"
    eager = [*TINY, "--parallel", "eager", "--num-devices", "1", "--max-steps", "3"]
    proc = cli("torchxla_ref.train", *eager, "--workdir", str(wd))
    assert proc.returncode == 0, proc.stderr[-2000:]
    other = tmp_path / "other"
    shutil.copytree(wd, other)
    (other / "config.json").unlink()  # no recorded flags: the checkpoint's identity decides
    proc = cli(
        "torchxla_ref.train", *eager, "--workdir", str(other), "--resume", "--task", "ranking"
    )
    _assert_one_clear_line(proc, "checkpoint is for task 'toxicity', this run is 'ranking'")
    (ckpt,) = (wd / "checkpoints" / "latest").glob("step_*.pt")
    ckpt.write_bytes(b"garbage")
    proc = cli("torchxla_ref.train", *eager, "--workdir", str(wd), "--resume")
    _assert_one_clear_line(proc, f"{ckpt}: unreadable checkpoint")
    assert ckpt.read_bytes() == b"garbage"  # kept for the user to inspect


@pytest.mark.e2e
def test_checkpoint_of_another_task_is_refused(finished_run, tmp_path):
    wd = tmp_path / "run"
    shutil.copytree(finished_run, wd)
    (wd / "config.json").unlink()  # no recorded flags: the checkpoint's identity decides
    proc = cli("jaxtpu.train", *TINY, "--workdir", str(wd), "--resume", "--task", "ranking")
    assert proc.returncode == 2
    assert "checkpoint is for task 'toxicity', this run is 'ranking'" in proc.stderr


@pytest.mark.e2e
def test_predict_and_export_refuse_bad_input_and_keep_results(finished_run, tmp_path):
    out = write(tmp_path / "out.csv", "keep me\n")
    to_score = write(tmp_path / "score.csv", "comment_id,text\n1,hello\n")
    proc = cli(
        "jaxtpu.predict",
        "--workdir",
        str(finished_run),
        "--input",
        str(to_score),
        "--output",
        str(out),
    )
    assert proc.returncode == 2 and "exists; pass --overwrite" in proc.stderr
    assert out.read_text() == "keep me\n"
    proc = cli(
        "jaxtpu.predict",
        "--workdir",
        str(tmp_path),
        "--input",
        str(to_score),
        "--output",
        str(tmp_path / "new.csv"),
    )
    assert proc.returncode == 2 and "not a jaxtpu run directory" in proc.stderr
    proc = cli("jaxtpu.export", "--workdir", str(finished_run), "--out", str(tmp_path))
    assert proc.returncode == 2 and "is not an empty directory" in proc.stderr


@pytest.mark.e2e
def test_nan_loss_stops_with_step_and_keeps_the_best_checkpoint(tmp_path):
    wd = tmp_path / "run"
    # Warm-up from 0 to a huge peak: step 1 trains at lr 0 (and is evaluated and checkpointed),
    # then the learning rate explodes the weights.
    proc = cli(
        "jaxtpu.train",
        *TINY,
        "--workdir",
        str(wd),
        "--lr",
        "1e9",
        "--clip-norm",
        "0",
        "--schedule",
        "linear",
        "--warmup-frac",
        "0.5",
        "--epochs",
        "3",
        "--eval-every",
        "1",
        "--log-every",
        "1",
        "--precision",
        "fp32",
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "loss became nan at step" in proc.stderr or "became nan" in proc.stderr
    assert "Traceback" not in proc.stderr
    lines = map(json.loads, (wd / "metrics.jsonl").read_text().splitlines())
    evals = [x for x in lines if x["event"] == "eval"]
    assert evals and all(np.isfinite(e["val_loss"]) for e in evals)
    best = json.loads(next((wd / "checkpoints" / "best").glob("*/meta/metadata")).read_text())
    assert np.isfinite(best["val_loss"]) and best["step"] == evals[0]["step"] == 1
    latest = json.loads(next((wd / "checkpoints" / "latest").glob("*/meta/metadata")).read_text())
    assert latest["step"] == evals[-1]["step"]  # the last state evaluated as finite


@pytest.mark.e2e
def test_sigterm_checkpoints_and_exits_cleanly_then_resumes(uninterrupted, tmp_path):
    wd = tmp_path / "run"
    cmd = [sys.executable, "-m", "jaxtpu.train", *resumable_args(wd)]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_for_step(wd, proc, 4)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    assert "SIGTERM: saved the latest state at step" in out
    resumed = cli("jaxtpu.train", *resumable_args(wd), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert final_metrics(wd)["val_loss"] == pytest.approx(
        final_metrics(uninterrupted)["val_loss"], rel=1e-6
    )


@pytest.mark.e2e
def test_leftover_partial_checkpoint_does_not_break_resume(uninterrupted, tmp_path):
    """A run killed while orbax writes leaves a temporary directory; resume ignores it."""
    wd = tmp_path / "run"
    shutil.copytree(uninterrupted, wd)
    (wd / "summary.json").unlink()
    latest = wd / "checkpoints" / "latest"
    partial = latest / "99.orbax-checkpoint-tmp-1234567890"
    partial.mkdir()
    (partial / "garbage").write_bytes(os.urandom(100))
    proc = cli("jaxtpu.train", *resumable_args(wd), "--resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "resumed from" in proc.stdout
