"""Reliability: every flag value is accepted or refused with one line, one run per directory,
resume that cannot drift, Ctrl-C as safe as SIGTERM, undefined metrics and full disks."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import final_metrics, resumable_args, start, wait_for_step

from jaxtpu.core.errors import ConfigError, UserError
from jaxtpu.core.flags.presets import tiny
from jaxtpu.core.flags.schema import BOUNDS, FIELDS, JAX_ONLY, RESUME_MAY_CHANGE
from jaxtpu.core.run.rundir import claim_workdir
from parity_tests.harness import ROOT, clean_env

NUMERIC = sorted(name for name, (_, f) in FIELDS.items() if f.type in ("int", "float"))
PROBES = [math.nan, math.inf, -math.inf, 0, -1, 10**30]


def test_the_docs_name_the_flags_the_schema_lets_change_on_resume_and_keeps_for_jax():
    """The documentation's two lists of flags are generated from the fields' own metadata
    (docs/hooks.py): which may change on --resume, and which the torch side refuses."""
    from jaxtpu.core.flags.cli import flag_list

    assert "<!-- flags:resume -->" in (ROOT / "docs" / "run-directory.md").read_text()
    assert "<!-- flags:jax-only -->" in (ROOT / "docs" / "commands.md").read_text()

    def named(text: str) -> set[str]:
        return {m.replace("-", "_") for m in re.findall(r"`--([a-z-]+)`", text)}

    assert named(flag_list("resume")) == RESUME_MAY_CHANGE - {"resume"}
    assert named(flag_list("jax-only")) == set(JAX_ONLY)
    assert re.fullmatch(r"(`--[a-z-]+`, )+`--[a-z-]+` and `--[a-z-]+`", flag_list("jax-only"))


def test_every_numeric_flag_has_bounds():
    assert set(NUMERIC) == set(BOUNDS), set(NUMERIC) ^ set(BOUNDS)


@pytest.mark.parametrize("name", NUMERIC)
def test_every_numeric_flag_accepts_or_refuses_nan_inf_zero_negative_huge(name):
    """In-process, no training: each probe is either a valid config or a ConfigError whose
    message is one line naming the flag; never another exception."""
    for probe in PROBES:
        try:
            cfg = tiny().replace(**{name: probe})
        except ConfigError as e:
            text = str(e)
            assert "\n" not in text and text.startswith((f"--{name.replace('_', '-')} ", name))
            continue
        got = getattr(getattr(cfg, FIELDS[name][0]), name)
        assert math.isfinite(got), (name, probe, got)
        assert BOUNDS[name].problem(got) is None


# --------------------------------------------------------------------------- end to end


TINY = ["--preset", "tiny", "--no-progress"]
EAGER = [*TINY, "--parallel", "eager", "--num-devices", "1", "--batch-size", "16"]
SIDES = {"jax": ("jaxtpu.train", TINY), "torch": ("torchxla_ref.train", EAGER)}
HEADER = "id,comment_text,toxic\n"


def cli(module: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line(proc: subprocess.CompletedProcess, message: str, code: int = 2) -> None:
    assert proc.returncode == code, proc.stderr[-2000:]
    assert message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert len([x for x in proc.stderr.splitlines() if "error:" in x]) == 1, proc.stderr


def strict_json_lines(path: Path) -> list[dict]:
    def refuse(token: str):
        raise AssertionError(f"{path}: non-standard JSON token {token}")

    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(x, parse_constant=refuse) for x in text.splitlines() if x]
    return [json.loads(text, parse_constant=refuse)]


# 1. one run per directory


@pytest.mark.e2e
@pytest.mark.parametrize("side", SIDES)
def test_a_second_run_on_a_held_directory_is_refused_naming_the_holder(tmp_path, side):
    module, base = SIDES[side]
    wd = tmp_path / "run"
    with claim_workdir(wd, tiny()):  # this test process holds the run directory
        for extra in ([], ["--resume"]):
            proc = cli(module, *base, "--workdir", wd, "--max-steps", "2", *extra)
            one_line(proc, f"--workdir {wd} is in use by another run (process {os.getpid()} on")
    assert not (wd / "metrics.jsonl").exists()


@pytest.mark.e2e
def test_a_killed_holder_leaves_no_lock_behind(tmp_path):
    wd = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from jaxtpu.core.flags.presets import tiny\n"
            "from jaxtpu.core.run.rundir import claim_workdir\n"
            "with claim_workdir(Path(sys.argv[1]), tiny()):\n print('held', flush=True); "
            "time.sleep(600)",
            str(wd),
        ],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(UserError, match="is in use by another run"):
        with claim_workdir(wd, tiny()):
            pass
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with claim_workdir(wd, tiny().replace(resume=True, workdir=str(wd))):
        pass  # the kernel dropped the dead process's lock


# 2. resume that cannot drift


@pytest.mark.e2e
@pytest.mark.parametrize("side", SIDES)
def test_resume_refuses_changed_flags_and_records_what_ran(tmp_path, side):
    module, base = SIDES[side]
    wd = tmp_path / "run"
    assert cli(module, *base, "--workdir", wd, "--max-steps", "2").returncode == 0
    recorded = (wd / "config.json").read_text()
    proc = cli(
        module,
        *base,
        "--workdir",
        wd,
        "--resume",
        "--max-steps",
        "2",
        "--lr",
        "1e-3",
        "--seed",
        "3",
    )
    one_line(proc, "flags differ from the run's")
    assert "--lr 0.003 -> 0.001" in proc.stderr and "--seed 0 -> 3" in proc.stderr
    proc = cli(module, *base, "--workdir", wd, "--resume", "--max-steps", "2", "--task", "ranking")
    one_line(proc, "--task toxicity -> ranking")
    assert (wd / "config.json").read_text() == recorded
    proc = cli(module, *base, "--workdir", wd, "--resume", "--max-steps", "4")  # may change
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((wd / "config.json").read_text())["config"]["train"]["max_steps"] == 4
    assert json.loads((wd / "summary.json").read_text())["steps"] == 4


# 3. Ctrl-C is as safe as SIGTERM


@pytest.mark.e2e
def test_ctrl_c_saves_exits_130_with_the_resume_command_and_resumes(uninterrupted, tmp_path):
    wd = tmp_path / "run"
    proc = start("jaxtpu.train", *resumable_args(wd))
    wait_for_step(wd, proc, 4)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    assert "SIGINT: saved the latest state at step" in out and "Traceback" not in err
    command = err.split("Continue with: ")[1].strip().split()
    assert command[:3] == ["python", "-m", "jaxtpu.train"] and "--resume" in command
    summary = strict_json_lines(wd / "summary.json")[0]  # no -Infinity for 'no best yet'
    assert summary["stopped_by"] == "SIGINT" and summary["best"]["value"] is None
    steps = int(summary["steps"])
    assert (wd / "checkpoints" / "latest" / str(steps)).is_dir()
    resumed = cli(*command[2:])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert final_metrics(wd)["val_loss"] == pytest.approx(
        final_metrics(uninterrupted)["val_loss"], rel=1e-6
    )
    strict_json_lines(wd / "metrics.jsonl")


@pytest.mark.e2e
def test_a_second_ctrl_c_stops_at_once(tmp_path):
    wd = tmp_path / "run"
    proc = start("jaxtpu.train", *resumable_args(wd))
    wait_for_step(wd, proc, 2)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err


@pytest.mark.e2e
@pytest.mark.torch
def test_ctrl_c_on_the_torch_side_saves_and_resumes(tmp_path):
    wd = tmp_path / "run"
    args = [*EAGER, "--workdir", str(wd), "--epochs", "40", "--log-every", "1", "--dropout", "0"]
    proc = start("torchxla_ref.train", *args)
    wait_for_step(wd, proc, 3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "Continue with: python -m torchxla_ref.train" in err, err
    steps = json.loads((wd / "summary.json").read_text())["steps"]
    assert list((wd / "checkpoints" / "latest").glob(f"step_{steps}.pt"))
    resumed = cli("torchxla_ref.train", *args, "--resume", "--max-steps", str(steps + 2))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout
    assert json.loads((wd / "summary.json").read_text())["steps"] == steps + 2


# 4. an undefined metric is refused before training


@pytest.mark.e2e
@pytest.mark.parametrize("side", SIDES)
def test_a_validation_set_with_one_class_is_refused_at_the_start(tmp_path, side):
    module, base = SIDES[side]
    train_csv = tmp_path / "train.csv"
    train_csv.write_text(HEADER + "".join(f"{i},comment {i},{i % 2}\n" for i in range(64)))
    valid_csv = tmp_path / "valid.csv"
    valid_csv.write_text(HEADER + "".join(f"{i},fine comment {i},0\n" for i in range(20)))
    proc = cli(
        module,
        *base,
        "--workdir",
        tmp_path / "run",
        "--train-csv",
        train_csv,
        "--valid-csv",
        valid_csv,
    )
    one_line(proc, "all 20 labels are non-toxic, so val_auc is undefined")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# 5. a full disk


def _mount_tmpfs(path: Path, size_bytes: int) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    ok = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
        capture_output=True,
    )
    return ok.returncode == 0


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@pytest.mark.e2e
@pytest.mark.parametrize("side", SIDES)
def test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, side):
    module, base = SIDES[side]
    args = [*base, "--epochs", "2", "--log-every", "1", "--precision", "fp32"]
    probe = tmp_path / "probe"
    assert cli(module, *args, "--workdir", probe, "--max-steps", "7").returncode == 0
    disk = tmp_path / "disk"
    # room for everything a run writes up to its first evaluation, not for a second checkpoint
    if not _mount_tmpfs(disk, _du(probe) + 2 * 2**20):
        pytest.skip("mounting a small tmpfs (the full disk) needs root")
    try:
        wd = disk / "run"
        proc = cli(module, *args, "--workdir", wd)
        one_line(proc, "no space left on device writing checkpoint")
        assert "MiB free" in proc.stderr and "continue with --resume" in proc.stderr
        failed = int(proc.stderr.split("writing checkpoint ")[1].split()[0])
        (kept,) = (wd / "checkpoints" / "latest").iterdir()  # no temporary files left
        assert int(kept.name.removeprefix("step_").removesuffix(".pt")) < failed
        assert not [p for p in (wd / "checkpoints").rglob("*") if "tmp" in p.name]
        copy = tmp_path / "freed"  # the user frees space: the kept checkpoint resumes
        shutil.copytree(wd, copy)
        resumed = cli(module, *args, "--workdir", copy, "--resume")
        assert resumed.returncode == 0, resumed.stderr[-2000:]
        assert f"at step {kept.name.removeprefix('step_').removesuffix('.pt')}" in resumed.stdout
    finally:
        subprocess.run(["umount", str(disk)], check=False)


# 6. flag values and paths through the commands


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--num-heads", "0"], "--num-heads must be >= 1, got 0"),
        (["--hidden-size", "0"], "--hidden-size must be >= 1, got 0"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--pairs-per-comment", "0"], "--pairs-per-comment must be > 0, got 0.0"),
        (["--lr", "nan"], "--lr must be a finite number > 0, got nan"),
        (["--lr", "inf"], "--lr must be a finite number > 0, got inf"),
        (["--dropout", "nan"], "--dropout must be a finite number in [0, 1) or -1, got nan"),
    ],
)
@pytest.mark.e2e
@pytest.mark.parametrize("side", SIDES)
def test_bad_flag_values_are_refused_identically_on_both_sides(tmp_path, side, flags, message):
    module, base = SIDES[side]
    proc = cli(module, *base, "--workdir", tmp_path / "run", *flags)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.e2e
def test_eager_is_not_a_jax_strategy(tmp_path):
    proc = cli("jaxtpu.train", *TINY, "--workdir", tmp_path / "run", "--parallel", "eager")
    assert proc.returncode == 2 and "invalid choice: 'eager'" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("side", SIDES)
def test_a_csv_with_a_repeated_column_is_refused(tmp_path, side):
    module, base = SIDES[side]
    csv = tmp_path / "dup.csv"
    csv.write_text("comment_text,toxic,toxic\nhello,1,0\n")
    proc = cli(module, *base, "--workdir", tmp_path / "run", "--train-csv", csv)
    one_line(proc, "column toxic appears 2 times")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    wd = tmp_path_factory.mktemp("done") / "run"
    assert cli("jaxtpu.train", *TINY, "--workdir", wd, "--max-steps", "7").returncode == 0
    return wd


@pytest.mark.e2e
def test_output_paths_are_checked_before_scoring(finished, tmp_path):
    to_score = tmp_path / "score.csv"
    to_score.write_text("comment_id,text\n1,hello\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("keep")
    for output, message in [
        (a_file / "out.csv", "is not a directory"),
        (tmp_path, "is a directory"),
    ]:
        proc = cli("jaxtpu.predict", "--workdir", finished, "--input", to_score, "--output", output)
        one_line(proc, f"--output {output}")
        assert message in proc.stderr
    proc = cli("jaxtpu.export", "--workdir", finished, "--out", a_file / "model")
    one_line(proc, "is not a directory")
    proc = cli("jaxtpu.export", "--workdir", finished, "--out", a_file)
    one_line(proc, "is not an empty directory")
    assert a_file.read_text() == "keep"


# fault injection: SIGKILL anywhere, then resume


@pytest.mark.e2e
def test_sigkill_at_random_moments_then_resume_matches_the_uninterrupted_run(
    uninterrupted, tmp_path
):
    """Five seeded kills at random moments: as a training call starts, inside an evaluation
    batch, inside a checkpoint write (temporary directory written, not yet renamed), in a
    seeded order with each kind at least once; each time the run is resumed, and it ends
    exactly where the uninterrupted one does. Every moment is one the resumed process is sure
    to reach: a resumed run has at least 3 steps, an evaluation and a checkpoint ahead."""
    rng = np.random.default_rng(1234)
    kinds = ["call", "eval", "save", *rng.choice(["call", "eval", "save"], 2)]
    rng.shuffle(kinds)
    faults = [f"call:{rng.integers(1, 4)}" if k == "call" else f"{k}:1" for k in kinds]
    wd = tmp_path / "run"
    for i, fault in enumerate(faults):
        args = resumable_args(wd) + (["--resume"] if i else [])
        proc = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "fault_run.py"), fault, *args],
            cwd=ROOT,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == -signal.SIGKILL, (fault, proc.stderr[-2000:])
        assert not (wd / "summary.json").exists()
    proc = cli("jaxtpu.train", *resumable_args(wd), "--resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = final_metrics(uninterrupted), final_metrics(wd)
    assert a["step"] == b["step"] == 21
    assert b["val_loss"] == pytest.approx(a["val_loss"], rel=1e-6, abs=0)
    assert b["val_auc"] == pytest.approx(a["val_auc"], abs=1e-9)
    losses = {}
    for run in (uninterrupted, wd):
        lines = strict_json_lines(run / "metrics.jsonl")
        losses[run] = [x["loss"] for x in lines if x.get("event") == "train"]
    assert len(losses[wd]) == 21
    np.testing.assert_allclose(losses[wd], losses[uninterrupted], rtol=1e-6)
