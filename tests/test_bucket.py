"""Runs in a bucket, against a Google Cloud Storage emulator on loopback (the `gcs` fixture:
fake-gcs-server, started once per session): a run killed by SIGKILL mid-step and mid-save
resumes on a "fresh machine" (new HOME, cache and working directory) to the uninterrupted
losses; two processes write one bucket run and stop together on a SIGTERM to one of them; a
second run on a held directory is refused; a bucket that stops answering is one line and
loses nothing saved; scoring reads and writes the bucket; `jaxtpu launch` re-creates a
preempted VM (a stand-in `gcloud`) and resumes."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import TINY, cli, one_line, resumable_args, strict_json_lines

from parity_tests.harness import ROOT, clean_env

pytestmark = pytest.mark.e2e


def _fresh_machine(
    tmp_path: Path, name: str, gcs, compiled: bool = True, impatient: bool = False
) -> tuple[dict[str, str], Path]:
    """The environment and working directory of a machine with nothing on it: its own HOME,
    no token cache, an empty directory to run in, and (`compiled=False`) no compilation cache
    either (else the test session's, to save the time). `impatient`: bucket calls give up in
    seconds (`GcsEmulator.impatient_env`)."""
    home = tmp_path / name
    (home / "cwd").mkdir(parents=True)
    base = gcs.impatient_env if impatient else gcs.env
    env = clean_env({**base, "HOME": str(home), "JAXTPU_CACHE": str(home / "cache")})
    if not compiled:
        env.pop("JAX_COMPILATION_CACHE_DIR", None)  # jaxtpu's own, under the empty cache
    return env, home / "cwd"


def _run(
    args: list[str], env: dict[str, str], cwd: Path, fault: str = ""
) -> subprocess.CompletedProcess:
    head = [str(ROOT / "tests" / "fault_run.py"), fault] if fault else ["-m", "jaxtpu.train"]
    env = {**env, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *head, *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip


def _why(proc: subprocess.CompletedProcess) -> str:
    """A failed run's own error lines, then the end of its stderr (a traceback printed at
    interpreter shutdown would otherwise hide the line that says why it ended)."""
    said = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    return "\n".join([*said, "...", proc.stderr[-2000:]])


def _train_lines(gcs, url: str) -> list[dict]:
    lines = gcs.objects(url)["metrics.jsonl"].decode().splitlines()
    return [json.loads(x) for x in lines if x.strip()]


def _assert_losses_match(gcs, url: str, uninterrupted: Path, rtol: float) -> None:
    """Every training loss the bucket run logged equals the uninterrupted local run's."""
    ours = [x["loss"] for x in _train_lines(gcs, url) if x.get("event") == "train"]
    theirs = [
        x["loss"]
        for x in strict_json_lines(uninterrupted / "metrics.jsonl")
        if x.get("event") == "train"
    ]
    assert len(ours) == 21
    np.testing.assert_allclose(ours, theirs, rtol=rtol)


def test_a_bucket_run_killed_after_a_commit_and_mid_save_resumes_on_a_fresh_machine(
    gcs, uninterrupted, tmp_path
):
    """Killed the moment a checkpoint's commit marker is written, then (with
    --async-checkpoint) while a save's objects are in the bucket but not its commit marker,
    each time resumed on a new "machine" after taking over the lease: the bucket's metrics
    hold every step its checkpoint covers (issue 58), every loss equals the uninterrupted local
    run's; then scored and exported from and to the bucket. (Killed mid-step: test_signals.)"""
    url = gcs.bucket() + "/runs/a"
    args = resumable_args(url)  # the same run as `uninterrupted`, in the bucket
    env, cwd = _fresh_machine(tmp_path, "first", gcs)
    killed = _run(args, env, cwd, "committed:2")  # SIGKILL as checkpoint 6 is committed
    assert killed.returncode == -signal.SIGKILL, _why(killed)
    assert "checkpoints/latest/6/commit_success.txt" in gcs.objects(url)
    steps = [x["step"] for x in _train_lines(gcs, url) if x.get("event") == "train"]
    assert steps[:6] == [1, 2, 3, 4, 5, 6]  # the metrics of every step it covers, there
    time.sleep(4.5)  # the killed run's lease (4 s here) expires
    env, cwd = _fresh_machine(tmp_path, "second", gcs)
    args += ["--async-checkpoint"]  # from here on: saves in the background, same guarantees
    killed = _run([*args, "--resume"], env, cwd, "commit:2")  # in its 2nd save of the latest
    assert killed.returncode == -signal.SIGKILL, _why(killed)
    objects = gcs.objects(url)
    assert "checkpoints/latest/7/commit_success.txt" in objects  # the evaluation's, whole
    half = [k for k in objects if k.startswith("checkpoints/latest/9/")]
    assert half and "checkpoints/latest/9/commit_success.txt" not in objects  # never read
    time.sleep(4.5)
    env, cwd = _fresh_machine(tmp_path, "third", gcs, compiled=False)
    done = _run([*args, "--resume"], env, cwd)
    assert done.returncode == 0, _why(done)
    assert "took over the lease of process" in done.stdout + done.stderr
    assert "resumed at step 7: data and tokens rebuilt (none cached here)" in done.stdout
    assert "programs compiled (compilation cache empty here)" in done.stdout
    assert not list(cwd.iterdir())  # nothing written where it ran: all of it went up

    _assert_losses_match(gcs, url, uninterrupted, rtol=1e-6)
    resumed = [x for x in _train_lines(gcs, url) if x.get("event") == "resume"]
    assert resumed[-1]["tokens_rebuilt"] and resumed[-1]["compile_cache_empty"]
    summary = json.loads(gcs.objects(url)["summary.json"])
    final = json.loads((uninterrupted / "summary.json").read_text())["final"]
    assert summary["final"]["val_loss"] == pytest.approx(final["val_loss"], rel=1e-6)

    # the bucket run scores and exports like a local one, to and from the bucket
    bucket = url.rsplit("/runs/", 1)[0]
    env, cwd = _fresh_machine(tmp_path, "scorer", gcs)
    (cwd / "c.csv").write_text("comment_text\nyou are an idiot\nthanks for the edit\n")
    put = subprocess.run(
        [sys.executable, "-c", "import sys; from jaxtpu.core import storage; "
         "storage.put(sys.argv[1], sys.argv[2])", str(cwd / "c.csv"), f"{bucket}/in/c.csv"],
        env=env, cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert put.returncode == 0, put.stderr[-2000:]
    (cwd / "c.csv").unlink()
    score = cli("jaxtpu.predict", "--workdir", url, "--input", f"{bucket}/in/c.csv", "--output",
                f"{bucket}/out/scores.csv", "--num-devices", "2", env=env)  # fmt: skip
    assert score.returncode == 0, score.stderr[-2000:]
    rows = gcs.objects(f"{bucket}/out")["scores.csv"].decode().splitlines()
    assert rows[0] == "id,toxic" and len(rows) == 3
    again = cli("jaxtpu.predict", "--workdir", url, "--input", f"{bucket}/in/c.csv", "--output",
                f"{bucket}/out/scores.csv", env=env)  # fmt: skip
    one_line(again, f"--output {bucket}/out/scores.csv exists; pass --overwrite")
    exported = cli("jaxtpu.export", "--workdir", url, "--out", f"{bucket}/export", env=env)
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert {"config.json", "model.safetensors", "head.safetensors"} <= set(
        gcs.objects(f"{bucket}/export")
    )


def test_a_second_run_on_a_held_bucket_directory_is_refused(gcs, tmp_path):
    url = gcs.bucket() + "/runs/held"
    env, cwd = _fresh_machine(tmp_path, "a", gcs)
    first = subprocess.Popen(
        [sys.executable, "-m", "jaxtpu.train", *TINY, "--epochs", "50", "--workdir", url],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while ".lease" not in gcs.names(url) and time.time() < deadline:
            assert first.poll() is None, first.communicate()[1][-2000:]
            time.sleep(0.1)
        env2, cwd2 = _fresh_machine(tmp_path, "b", gcs)
        second = _run([*TINY, "--workdir", url], env2, cwd2)
        one_line(second, f"--workdir {url} is in use by another run (process {first.pid} on ")
        assert "lease renewed" in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
    lease = json.loads(gcs.objects(url)[".lease"])
    assert lease["released"]  # a run that ended gives its lease back


def test_two_processes_write_one_bucket_run_and_stop_together_on_sigterm(
    gcs, uninterrupted, tmp_path
):
    """2 processes x 4 devices, the run directory in the bucket: a SIGTERM to process 1 only
    reaches JAX's preemption sync point on both, process 0 saves that step, both exit 0;
    resumed (again 2 processes) the run ends where the 1-process `uninterrupted` does."""
    url = gcs.bucket() + "/runs/pod"
    args = resumable_args(url)

    def start(resume: bool) -> list[subprocess.Popen]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for i in range(2):
            env, cwd = _fresh_machine(tmp_path, f"host{i}-{int(resume)}", gcs)
            flags = [*args, *(["--resume"] if resume else []), "--num-devices", "4",
                     "--num-processes", "2", "--process-id", str(i),
                     "--coordinator-address", f"127.0.0.1:{port}"]  # fmt: skip
            # each training call waits 0.2 s: the SIGTERM below comes mid-run, never after it
            head = (
                [str(ROOT / "tests" / "fault_run.py"), "slow:0.2"]
                if not resume
                else ["-m", "jaxtpu.train"]
            )
            procs.append(subprocess.Popen(
                [sys.executable, *head, *flags], cwd=cwd, env={**env, "PYTHONPATH": str(ROOT)},
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            ))  # fmt: skip
        return procs

    procs = start(resume=False)
    deadline = time.time() + 300
    while "checkpoints/latest/3/commit_success.txt" not in gcs.names(url):
        assert all(p.poll() is None for p in procs), procs[0].communicate()[1][-3000:]
        assert time.time() < deadline
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    summary = json.loads(gcs.objects(url)["summary.json"])
    assert summary["stopped_by"] == "SIGTERM" and 3 < summary["steps"] < 21
    assert f"checkpoints/latest/{summary['steps']}/commit_success.txt" in gcs.objects(url)
    # process 0 never got a signal, yet stopped and saved: the notice reached it from process 1,
    # which exited 0 although no handler of jaxtpu's takes SIGTERM in a multi-process run (JAX's
    # preemption notifier has it; its own log line is not asserted: it does not always appear)
    assert "SIGTERM: saved the latest state at step" in outs[0][0]

    time.sleep(4.5)  # (a SIGTERM-stopped run releases its lease; this is for safety)
    procs = start(resume=True)
    for p in procs:
        _, err = p.communicate(timeout=400)
        assert p.returncode == 0, err[-3000:]
    _assert_losses_match(gcs, url, uninterrupted, rtol=1e-5)  # the all-reduce order differs


def test_a_bucket_that_stops_answering_is_one_line_and_loses_nothing(gcs, tmp_path):
    url = gcs.bucket() + "/runs/down"
    args = [*TINY, "--epochs", "3", "--checkpoint-every", "2", "--log-every", "1",
            "--workdir", url]  # fmt: skip
    env, cwd = _fresh_machine(tmp_path, "down", gcs, impatient=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxtpu.train", *args], cwd=cwd, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 200
        while "checkpoints/latest/4/commit_success.txt" not in gcs.names(url):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        gcs.stop()  # the bucket stops answering
        out, err = proc.communicate(timeout=400)
    finally:
        if gcs.proc is None:
            gcs.start()  # the same objects, answering again
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    # the next save's checkpoint, or the upload of the metrics after the last one, fails
    one_line(done, "continue with --resume when it answers")
    assert (
        f"error: {url}/checkpoints/latest: the bucket did not answer while checkpoint " in err
        or (f"error: {url}/metrics.jsonl: the bucket did not answer uploading" in err)
    ), err
    kept = max(int(k.split("/")[2]) for k in gcs.objects(url) if k.endswith("commit_success.txt")
               and k.startswith("checkpoints/latest/"))  # fmt: skip
    assert kept >= 4
    time.sleep(4.5)  # the failed run could not release its lease
    env, cwd = _fresh_machine(tmp_path, "after", gcs)
    resumed = _run([*args, "--resume"], env, cwd)
    assert resumed.returncode == 0, _why(resumed)
    assert f"resumed from {url}/checkpoints/latest at step {kept}" in resumed.stdout
    assert json.loads(gcs.objects(url)["summary.json"])["steps"] == 21


FAKE_GCLOUD = r'''#!{python}
"""A stand-in for `gcloud compute tpus tpu-vm`: records each call, keeps the VM's state in a
file, preempts the VM during the first training, and runs later `ssh --command`s here."""
import json, os, subprocess, sys
home = os.path.dirname(os.path.abspath(__file__))
state_file, calls = os.path.join(home, "state"), os.path.join(home, "calls.jsonl")
verb, rest = sys.argv[4], sys.argv[6:]
with open(calls, "a") as f:
    f.write(json.dumps([verb, *rest]) + "\n")
state = open(state_file).read() if os.path.exists(state_file) else ""
if verb == "describe":
    if not state:
        sys.exit("ERROR: (gcloud.compute.tpus.tpu-vm.describe) NOT_FOUND: no such node")
    print(json.dumps({{"state": state, "networkEndpoints": [{{"ipAddress": "10.0.0.2"}}]}}))
elif verb == "create":
    open(state_file, "w").write("READY")
elif verb == "delete":
    os.remove(state_file)
elif verb == "ssh":
    command = [a for a in rest if a.startswith("--command=")][0].split("=", 1)[1]
    trainings = sum(1 for line in open(calls) if '"ssh"' in line and "jaxtpu.train" in line)
    if "jaxtpu.train" in command and trainings == 1:
        open(state_file, "w").write("PREEMPTED")  # reclaimed before the run got anywhere
        sys.exit(255)
    sys.exit(subprocess.run(["bash", "-c", command]).returncode)
'''


def test_launch_recreates_a_preempted_vm_and_resumes_to_the_end(gcs, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gcloud = bin_dir / "gcloud"
    gcloud.write_text(FAKE_GCLOUD.format(python=sys.executable))
    gcloud.chmod(0o755)
    url = gcs.bucket() + "/runs/launched"
    env, cwd = _fresh_machine(tmp_path, "laptop", gcs)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "jaxtpu", "launch", "--tpu", "t1", "--zone", "us-west4-a",
         "--accelerator-type", "v5litepod-8", "--spot", "--setup", "true", "--retry-wait", "0",
         "--python", sys.executable, "--", *TINY, "--max-steps", "7", "--workdir", url],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert f"launch: the run in {url} finished" in proc.stdout
    calls = [json.loads(x) for x in (bin_dir / "calls.jsonl").read_text().splitlines()]
    verbs = [c[0] for c in calls]
    assert verbs == ["describe", "create", "describe", "ssh", "ssh", "describe", "describe",
                     "delete", "create", "describe", "ssh", "ssh"], verbs  # fmt: skip
    create = calls[1]
    assert "--accelerator-type=v5litepod-8" in create and "--spot" in create
    trains = [c for c in calls if c[0] == "ssh" and any("jaxtpu.train" in a for a in c)]
    assert all("--worker=all" in c for c in trains)
    assert all("--resume" in c[-1] for c in trains)
    assert json.loads(gcs.objects(url)["summary.json"])["steps"] == 7
