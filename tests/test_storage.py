"""Paths in a bucket (`jaxtpu.core.storage`), the lease that keeps one run per bucket
directory (`jaxtpu.core.run.lease`) and a run directory's working copy (`jaxtpu.core.run.store`),
on fsspec's in-memory file system and an in-memory object store: pure functions, in
milliseconds. The same code against a GCS emulator is `tests/test_bucket.py`."""

from __future__ import annotations

import json
import re
import time
import uuid

import pytest
from helpers import FakeBackend, fake_job

from jaxtpu.core import storage
from jaxtpu.core.errors import DataError, TrainingError, UserError
from jaxtpu.core.run import loop
from jaxtpu.core.run.lease import Conflict, Holder, Lease, MemoryObject
from jaxtpu.core.run.protocol import ResumeState
from jaxtpu.core.run.rundir import RunLog, claim_workdir
from jaxtpu.core.run.store import RunStore, working_copy


@pytest.fixture
def bucket() -> str:
    """A fresh directory of the in-memory file system (shared by the process)."""
    url = f"memory://bucket-{uuid.uuid4().hex[:8]}"
    yield url
    storage.remove(url, recursive=True)


def test_paths_and_urls():
    assert storage.is_remote("gs://b/x") and storage.is_remote("memory://b")
    assert not storage.is_remote("runs/a") and not storage.is_remote("file:///tmp/a")
    assert not storage.is_remote(None)
    assert storage.join("gs://b/runs/", "a", "/config.json") == "gs://b/runs/a/config.json"
    assert storage.join("runs", "a") == "runs/a"
    assert storage.name_of("gs://b/runs/a/") == "a"


def test_an_input_in_a_bucket_is_copied_once_per_version(bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("JAXTPU_CACHE", str(tmp_path / "cache"))
    url = storage.join(bucket, "data", "train.csv")
    storage.write_bytes(url, b"comment_text,toxic\nhello,0\n")
    first = storage.fetch(url, "--train-csv")
    assert first.read_bytes() == b"comment_text,toxic\nhello,0\n"
    assert first.is_relative_to(tmp_path / "cache" / "remote")
    assert storage.fetch(url) == first  # the same version: not copied again
    time.sleep(0.01)
    storage.write_bytes(url, b"comment_text,toxic\nbye,1\n")
    second = storage.fetch(url)
    assert second != first and second.read_bytes().endswith(b"bye,1\n")
    # a directory comes whole; a missing object is one line naming the flag and the URL
    storage.write_bytes(storage.join(bucket, "model", "config.json"), b"{}")
    storage.write_bytes(storage.join(bucket, "model", "sub", "vocab.txt"), b"a")
    copy = storage.fetch(storage.join(bucket, "model"))
    assert (copy / "config.json").exists() and (copy / "sub" / "vocab.txt").read_text() == "a"
    with pytest.raises(storage.BucketError, match=r"--model-dir memory://.*/nothing: no such"):
        storage.fetch(storage.join(bucket, "nothing"), "--model-dir")
    assert storage.local_input("runs/x.csv") == "runs/x.csv"  # a local path is left alone


def test_messages_about_a_local_copy_name_the_url(tmp_path):
    local = tmp_path / "copy.csv"
    with pytest.raises(DataError, match=r"^gs://b/train.csv: row 3 is bad$"):
        with storage.named(local, "gs://b/train.csv"):
            raise DataError(f"{local}: row 3 is bad")


def test_a_staged_output_directory_appears_only_when_complete(bucket, tmp_path):
    out = tmp_path / "export"
    with pytest.raises(RuntimeError), storage.staged_dir(out) as staging:
        (staging / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("killed")
    assert not out.exists() and list(tmp_path.iterdir()) == []
    out.mkdir()  # an empty directory is taken
    with storage.staged_dir(out) as staging:
        (staging / "config.json").write_text("{}")
    assert (out / "config.json").read_text() == "{}" and len(list(tmp_path.iterdir())) == 1
    url = storage.join(bucket, "export")
    storage.check_output_dir(url, "--out")  # empty, writable
    with storage.staged_dir(url) as staging:
        (staging / "a" / "b.txt").parent.mkdir()
        (staging / "a" / "b.txt").write_text("x")
    assert storage.read_bytes(storage.join(url, "a", "b.txt")) == b"x"
    with pytest.raises(storage.BucketError, match="exists and is not an empty directory"):
        storage.check_output_dir(url, "--out")


def test_two_writes_of_one_output_directory_and_a_killed_ones_leftovers(tmp_path):
    """Issue 58: two `export`s into one --out both did the whole export, then the second
    failed with 'Directory not empty'; a SIGKILLed export left its 8 MB staging directory
    beside --out for good."""
    from jaxtpu.core.files import release_lock, take_lock

    out = tmp_path / "export"
    killed = tmp_path / ".export.staging-k1ll3d_x"  # what a killed write leaves
    (killed / "sub").mkdir(parents=True)
    others = [tmp_path / ".export.v2.staging-abcdefgh", tmp_path / ".exported"]
    for other in others:  # another output's staging, and a file of the user's: kept
        other.mkdir()
    fd, _ = take_lock(tmp_path / ".export.lock")  # another process, writing `out` now
    with pytest.raises(UserError, match=r"export is being written by another process \(proc"):
        with storage.staged_dir(out):
            raise AssertionError("the block must not run")
    release_lock(fd)
    assert killed.exists()  # not touched while the other write held the lock
    with storage.staged_dir(out) as staging:
        assert not killed.exists() and all(o.exists() for o in others)
        (staging / "a.txt").write_text("a")
    assert (out / "a.txt").read_text() == "a"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["export", *(o.name for o in others)]  # no lock file left either
    )
    other = tmp_path / "again"
    with pytest.raises(UserError, match="again was written by another process meanwhile"):
        with storage.staged_dir(other) as staging:
            (staging / "b.txt").write_text("b")
            (other / "theirs.txt").parent.mkdir()
            (other / "theirs.txt").write_text("theirs")
    assert [p.name for p in other.iterdir()] == ["theirs.txt"]


def test_a_failing_bucket_is_one_line():
    with pytest.raises(storage.BucketError) as e:
        with storage.bucket_errors("gs://b/x", "writing it", "try again"):
            raise ConnectionRefusedError("Cannot connect to host\nmore detail")
    assert str(e.value) == (
        "gs://b/x: the bucket did not answer writing it (ConnectionRefusedError: Cannot "
        "connect to host); try again"
    )


def test_output_files_in_a_bucket(bucket):
    url = storage.join(bucket, "metrics.json")
    storage.check_output_file(url, "--out")
    storage.write_output_text(url, "{}\n")
    with pytest.raises(UserError, match="exists; pass --overwrite"):
        storage.check_output_file(url, "--out")
    storage.check_output_file(url, "--out", overwrite=True)


# --------------------------------------------------------------------------- the lease


def _lease(url: str, seconds: float = 60) -> Lease:
    return Lease(url, seconds=seconds)


def test_a_lease_refuses_a_second_run_until_it_is_released():
    url = f"memory://leases/{uuid.uuid4().hex}"
    first = _lease(url).acquire(renew=False)
    with pytest.raises(UserError, match=r"is in use by another run \(process \d+ on .*renewed 0s"):
        _lease(url).acquire(renew=False)
    first.release()
    second = _lease(url).acquire(renew=False)
    assert second.took_over is None  # a released lease is free, not taken over


def test_a_stale_lease_is_taken_over_and_its_holder_stops(caplog):
    url = f"memory://leases/{uuid.uuid4().hex}"
    old = _lease(url, seconds=0.05).acquire(renew=False)
    time.sleep(0.1)  # it stopped renewing (a preempted VM)
    new = _lease(url).acquire(renew=False)
    assert new.took_over is not None and new.took_over.holder == old.me.holder
    assert "took over the lease of" in caplog.text
    old.renew()  # the old run wakes up: its precondition fails
    with pytest.raises(TrainingError, match="took over this run directory"):
        old.check()
    old.release()  # leaves the new holder's lease alone
    assert Holder.parse(MemoryObject(new.url).read()[0]).run == new.me.run
    new.check()


def test_of_two_runs_taking_a_stale_lease_at_once_one_wins():
    url = f"memory://leases/{uuid.uuid4().hex}"
    _lease(url, seconds=0.01).acquire(renew=False)
    time.sleep(0.05)
    seen = MemoryObject(url + "/.lease").read()

    class Racing(MemoryObject):
        def read(self):  # both read the stale lease before either writes
            return seen

    first = Lease(url, Racing(url + "/.lease")).acquire(renew=False)
    with pytest.raises(UserError, match="was just taken by another run"):
        Lease(url, Racing(url + "/.lease")).acquire(renew=False)
    assert Holder.parse(MemoryObject(url + "/.lease").read()[0]).run == first.me.run


def test_a_lease_renews_itself_from_a_thread():
    url = f"memory://leases/{uuid.uuid4().hex}"
    lease = _lease(url, seconds=0.08).acquire()
    try:
        first = MemoryObject(url + "/.lease").read()[1]
        time.sleep(0.15)
        assert MemoryObject(url + "/.lease").read()[1] != first
        with pytest.raises(UserError, match="in use by another run"):
            _lease(url).acquire(renew=False)  # renewed: never stale
    finally:
        lease.release()


def test_conditional_writes_and_unreadable_leases():
    obj = MemoryObject(f"memory://leases/{uuid.uuid4().hex}/.lease")
    gen = obj.write(b"x", 0)
    with pytest.raises(Conflict):
        obj.write(b"y", 0)
    assert obj.write(b"y", gen) != gen
    assert Holder.parse(b"not json") is None  # treated as stale: taken over


# --------------------------------------------------------------------------- the run store


def test_publish_uploads_what_changed_and_pull_brings_it_back(bucket, tmp_path):
    assert RunStore(tmp_path / "empty", bucket).pull() == []  # --resume of a run not begun
    store = RunStore(tmp_path / "copy", bucket)
    (store.local / "checkpoints" / "latest").mkdir(parents=True)
    (store.local / "checkpoints" / "latest" / "x").write_text("orbax's")
    (store.local / "metrics.jsonl").write_text('{"step": 1}\n')
    (store.local / ".lock").write_text("")
    (store.local / ".metrics.jsonl.1.abcdef12.tmp").write_text("half")
    (store.local / "tokenizer").mkdir()
    (store.local / "tokenizer" / "vocab.txt").write_text("a")
    assert store.publish() == ["metrics.jsonl", "tokenizer/vocab.txt"]
    assert store.publish() == []  # nothing changed since
    with (store.local / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2}\n')
    assert store.publish() == ["metrics.jsonl"]
    assert store.holds_a_run()  # its metrics are there

    fresh = RunStore(tmp_path / "elsewhere", bucket)  # a new machine's working copy
    assert fresh.pull() == ["metrics.jsonl", "tokenizer/vocab.txt"]
    assert (fresh.local / "metrics.jsonl").read_text().count("step") == 2
    assert fresh.publish() == []  # what it pulled is not uploaded again


def _train_steps(bucket: str) -> list[int]:
    """The steps of the train lines of the bucket run's metrics.jsonl, in order."""
    lines = storage.read_bytes(storage.join(bucket, "metrics.jsonl")).decode().splitlines()
    return [r["step"] for r in map(json.loads, lines) if r["event"] == "train"]


def _resume_in(bucket: str, cfg, disk: dict, tmp_path, **flags) -> int:
    """Resumes the fake run of `disk` in the bucket run directory on a fresh working copy
    (pulled: its metrics must be there) and runs it to the end; returns its last step."""
    with claim_workdir(bucket, cfg.replace(resume=True)) as store:
        assert (store.local / "metrics.jsonl").exists()
        job = fake_job(tmp_path / "unused2", resume=True, **flags)
        job.workdir, job.store = store.local, store
        backend = FakeBackend(disk)
        state = backend.restore_latest(job.spec.model_key)
        runlog = RunLog(store.local, resume_step=state.step, tensorboard=False)
        return loop.run(job, backend, state, runlog)["steps"]


def test_a_run_in_a_bucket_publishes_at_each_checkpoint_and_resumes(bucket, tmp_path, monkeypatch):
    """The loop with a numpy backend and a memory:// run directory: the bucket holds the
    metrics of every step its latest checkpoint covers, a second run there is refused while
    the first holds it, and a resumed run on a fresh working copy continues the metrics."""
    monkeypatch.setenv("JAXTPU_CACHE", str(tmp_path / "cache"))
    disk: dict = {}
    job = fake_job(tmp_path / "unused", eval_every=3, checkpoint_every="2")
    cfg = job.cfg.replace(workdir=bucket)
    with claim_workdir(bucket, cfg) as store:
        with pytest.raises(UserError, match="in use by another run"):
            with claim_workdir(bucket, cfg):
                pass
        job.workdir, job.store = store.local, store
        backend = FakeBackend(disk, sigterm_at=8)
        runlog = RunLog(store.local, tensorboard=False)
        summary = loop.run(job, backend, ResumeState(), runlog)
    assert summary["stopped_by"] == "SIGTERM" and summary["steps"] == 8
    steps = _train_steps(bucket)
    assert steps == list(range(1, 9))  # everything up to the saved step, published
    assert json.loads(storage.read_bytes(storage.join(bucket, "summary.json")))["steps"] == 8

    with pytest.raises(UserError, match="already holds a run; continue it with --resume"):
        with claim_workdir(bucket, cfg):
            pass
    assert _resume_in(bucket, cfg, disk, tmp_path, eval_every=3, checkpoint_every="2") == 21
    steps = _train_steps(bucket)
    assert steps == list(range(1, 22))


class _Killed(BaseException):
    """The process dying (SIGKILL) at a chosen moment, as far as the loop can tell."""


class _DiesAfterACommit(FakeBackend):
    """Dies the moment its `n`-th latest checkpoint is committed (stored on `disk`)."""

    def __init__(self, disk: dict, n: int) -> None:
        super().__init__(disk)
        self.n = n

    def save_latest(self, step: int, meta: dict) -> None:
        super().save_latest(step, meta)
        if sum(kind == "latest" for kind, _ in self.events) == self.n:
            raise _Killed(step)


def test_a_bucket_run_killed_right_after_a_commit_keeps_every_metrics_line(
    bucket, tmp_path, monkeypatch
):
    """Issue 58: the checkpoint was committed before the metrics were published, so a run
    killed between the two resumed (on a fresh machine) without the train lines since the
    previous checkpoint. Killed after its 3rd commit, then resumed: lines 1..21, once each."""
    monkeypatch.setenv("JAXTPU_CACHE", str(tmp_path / "cache"))
    disk: dict = {}
    cfg = fake_job(tmp_path / "unused", eval_every=7, checkpoint_every="3").cfg
    cfg = cfg.replace(workdir=bucket)
    # the store as claim_workdir makes it, without its exit (a killed process has none)
    store = RunStore(working_copy(bucket), bucket, Lease(bucket).acquire(renew=False))
    store.local.mkdir(parents=True)
    job = fake_job(tmp_path / "unused", eval_every=7, checkpoint_every="3")
    job.workdir, job.store = store.local, store
    with pytest.raises(_Killed):
        runlog = RunLog(store.local, tensorboard=False)
        loop.run(job, _DiesAfterACommit(disk, 3), ResumeState(), runlog)
    saved = disk["latest"]["step"]
    steps = _train_steps(bucket)
    assert saved == 7 and steps[:saved] == list(range(1, saved + 1))  # 7: the evaluation's
    store.lease.release()  # (a killed run's lease expires)
    assert _resume_in(bucket, cfg, disk, tmp_path, eval_every=7, checkpoint_every="3") == 21
    steps = _train_steps(bucket)
    assert steps == list(range(1, 22))


@pytest.mark.parametrize(
    "name, value",
    [
        ("JAXTPU_LEASE_SECONDS", "abc"),
        ("JAXTPU_LEASE_SECONDS", "0"),
        ("JAXTPU_LEASE_SECONDS", "nan"),
        ("JAXTPU_BUCKET_TIMEOUT", "-1"),
        ("JAXTPU_BUCKET_TIMEOUT", "inf"),
        ("JAXTPU_BUCKET_RETRIES", "2.5"),
    ],
)
def test_a_bad_bucket_setting_in_the_environment_is_one_line(monkeypatch, name, value):
    """Issue 58: `JAXTPU_LEASE_SECONDS=abc` was a ValueError traceback and `=0` a lease that is
    stale as soon as it is written (a second run takes the directory over at once)."""
    from jaxtpu.core.run.lease import lease_seconds

    monkeypatch.setenv(name, value)
    read = {
        "JAXTPU_LEASE_SECONDS": lease_seconds,
        "JAXTPU_BUCKET_TIMEOUT": storage.timeout_seconds,
        "JAXTPU_BUCKET_RETRIES": storage.retry_attempts,
    }[name]
    with pytest.raises(UserError, match=f"^{name}='{re.escape(value)}': expected a"):
        read()
    monkeypatch.setenv(name, "")
    assert read() == {"JAXTPU_LEASE_SECONDS": 120, "JAXTPU_BUCKET_TIMEOUT": 60}.get(name, 8)
    monkeypatch.setenv(name, "7")
    assert read() == 7
