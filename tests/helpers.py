"""The tests' shared helpers, in one module (tests import them as `from helpers import ...`;
never from another test file): the numpy `FakeBackend` and its runs, the interruptible tiny
run and the background trainers the interruption tests signal, and the PyTorch/XLA
notebook's module built with transformers (torch is imported only by that one)."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core.data import taskdata, tokenized
from jaxtpu.core.flags.presets import tiny
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.run import loop, plan
from jaxtpu.core.run.protocol import ResumeState
from jaxtpu.core.run.rundir import RunLog
from parity_tests.harness import ROOT, clean_env

N_TRAIN, N_VALID, GLOBAL_BATCH = 56, 16, 8  # the fake runs: 7 steps per epoch

# --------------------------------------------------------------------------- the fake backend


class FakeBackend:
    """A one-number "model": each step moves `w` by the batch's mean label and reports a loss
    that depends on `w` and the batch (so a resumed run must restore both exactly); scores
    of an evaluation are the labels' order made noisier as `w` grows (so the monitored metric
    can fall). Checkpoints go to `disk`, a dict shared by the runs of one test."""

    name = "fake"
    num_devices, num_processes, primary = 1, 1, True
    device_kind = "TPU v3"  # a known peak: the loop reports an MFU

    def __init__(self, disk: dict[str, Any], nan_at: int = 0, sigterm_at: int = 0, drift=0.0):
        self.disk, self.nan_at, self.sigterm_at, self.drift = disk, nan_at, sigterm_at, drift
        self.w, self.step, self.calls = 0.0, 0, 0
        self.events: list[tuple[str, int]] = []
        self.waits_for_checkpoints = 0

    def local_rows(self, n: int) -> slice:
        return slice(None)

    def any_process(self, flag: bool) -> bool:
        return flag

    def preemption_point(self, index: int) -> bool:
        return False  # one process: the stop flag has the signal itself

    def compile_count(self) -> int:
        return 1

    def device_memory_mb(self) -> None:
        return None

    def prepare(self, batches: list[dict[str, np.ndarray]]) -> Any:
        return batches

    def start(self) -> None:
        """Nothing to place: the one number lives on the host."""

    def precompile(self, calls: Any, evals: Any) -> int:
        return 0

    def train_steps(self, batches: list[dict[str, np.ndarray]]) -> list[Any]:
        self.calls += 1
        if self.calls == self.sigterm_at:
            os.kill(os.getpid(), signal.SIGTERM)  # arrives while this call runs
        out = []
        for b in batches:
            self.step += 1
            loss = float(np.mean(b["label"]) + self.w)
            if self.step == self.nan_at:
                loss = float("nan")
            self.w += 0.01 * float(np.mean(b["label"])) + 0.001
            out.append({"loss": loss, "grad_norm": 1.0})
        return out

    def fetch(self, handles: list[Any]) -> list[dict[str, float]]:
        return list(handles)

    def eval_batch(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        noise = np.sin(np.arange(len(batch["label"])) * 7.0) * self.drift * self.step
        return {"score": batch["label"] + noise, "loss": np.full(len(batch["label"]), self.w)}

    def restore_latest(self, model_key: dict[str, Any]) -> ResumeState:
        if "latest" not in self.disk:
            return ResumeState()
        saved = copy.deepcopy(self.disk["latest"])
        self.w, self.step = saved["w"], saved["step"]
        return ResumeState(saved["step"], saved["meta"]["best"])

    def save_latest(self, step: int, meta: dict[str, Any]) -> None:
        self.events.append(("latest", step))
        self.disk["latest"] = copy.deepcopy({"w": self.w, "step": step, "meta": meta})

    def save_best(self, step: int, meta: dict[str, Any]) -> None:
        self.events.append(("best", step))
        self.disk["best"] = copy.deepcopy({"w": self.w, "step": step})

    def wait_for_checkpoints(self) -> None:
        self.waits_for_checkpoints += 1


def fake_examples(n: int) -> tokenized.Examples:
    ids = np.ones((n, 16), np.int32)
    return tokenized.Examples(ids, ids.copy(), (np.arange(n) % 2).astype(np.float32))


def fake_job(tmp_path, resume: bool = False, **flags) -> plan.Job:
    cfg = tiny().replace(
        **{
            "epochs": 3,
            "log_every": 1,
            "batch_size": 8,
            "num_devices": 1,
            "workdir": str(tmp_path),
            "resume": resume,
            **flags,
        }
    )
    spec = RunSpec.resolve(cfg)
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = taskdata.TaskData(fake_examples(N_TRAIN), fake_examples(N_VALID), {})
    return plan.Job(cfg, spec, data, plan.Plan.make(cfg, data.train, 1), tmp_path, 0.0)


def run_fake(tmp_path, backend: FakeBackend, resume: bool = False, **flags) -> dict[str, Any]:
    job = fake_job(tmp_path, resume, **flags)
    spec = job.spec
    state = backend.restore_latest(spec.model_key) if resume else ResumeState()
    runlog = RunLog(tmp_path, resume_step=state.step if resume else None, tensorboard=False)
    return loop.run(job, backend, state, runlog)


def fake_losses(tmp_path) -> list[float]:
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in lines if x["event"] == "train"]


# --------------------------------------------------------------------------- real runs


def resumable_args(workdir: Path) -> list[str]:
    """A tiny fp32 run of 21 steps that checkpoints every 3 and evaluates every 7: the run the
    interruption tests stop (SIGTERM, Ctrl-C, SIGKILL) and resume."""
    return [
        "--preset",
        "tiny",
        "--no-progress",
        "--workdir",
        str(workdir),
        "--precision",
        "fp32",
        "--epochs",
        "3",
        "--checkpoint-every",
        "3",
        "--log-every",
        "1",
        "--eval-every",
        "7",
    ]


def start(module: str, *flags: str) -> subprocess.Popen:
    """One trainer in the background (output captured), e.g. to signal it mid-run."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *flags],
        cwd=ROOT,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_step(workdir: Path, proc: subprocess.Popen, step: int, timeout: float = 300) -> None:
    """Returns once the run has logged `step` (metrics.jsonl); fails if it ends or stalls."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        path = workdir / "metrics.jsonl"
        if path.exists() and any(
            json.loads(x).get("step", 0) >= step for x in path.read_text().splitlines() if x
        ):
            return
        time.sleep(0.05)
    raise AssertionError(f"run did not reach step {step}")


def final_metrics(workdir: Path) -> dict[str, Any]:
    """The last evaluation of a finished run (summary.json)."""
    return json.loads((workdir / "summary.json").read_text())["final"]


# --------------------------------------------------------------------------- the notebook's module


@cache
def notebook_class() -> type:
    """`NotebookModel`, defined on first use so that only its tests import torch."""
    import torch
    from torch import nn
    from transformers import BertConfig, BertModel

    class NotebookModel(nn.Module):
        """Like the PyTorch/XLA Jigsaw notebook's BERTBaseUncased: pooled output -> dropout
        -> fc1."""

        def __init__(self, config: BertConfig, encoder: str = "bert", head: str = "fc1") -> None:
            super().__init__()
            self.names = (encoder, head)
            setattr(self, encoder, BertModel(config))
            self.bert_drop = nn.Dropout(0.3)
            setattr(self, head, nn.Linear(config.hidden_size, 1))

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            encoder, head = (getattr(self, n) for n in self.names)
            pooled = encoder(input_ids=ids, attention_mask=mask).pooler_output
            return getattr(self, self.names[1])(self.bert_drop(pooled))[:, 0]

    return NotebookModel


def notebook_model(model_dir: Path, seed: int = 7, **names: str) -> Any:
    """Weights that differ from `model_dir`'s: whatever a run scores comes from the file."""
    import torch
    from transformers import BertConfig

    config = json.loads((model_dir / "config.json").read_text())
    torch.manual_seed(seed)
    return notebook_class()(BertConfig(**config, attn_implementation="eager"), **names).eval()


# ------------------------------------------------------------ the commands, driven as a user would

TINY = ["--preset", "tiny", "--no-progress"]
EAGER = [*TINY, "--parallel", "eager", "--num-devices", "1", "--batch-size", "16"]
SIDE_COMMANDS = {"jax": ("jaxtpu.train", TINY), "torch": ("torchxla_ref.train", EAGER)}
TOXIC_HEADER = "id,comment_text,toxic\n"
JIGSAW_HEADER = "id,comment_text,toxic,severe_toxic,obscene,threat,insult,identity_hate\n"


def cli(module: str, *args: Any, timeout: float = 600, env=None) -> subprocess.CompletedProcess:
    """`python -m module args` from the repository, in a clean environment, output captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        cwd=ROOT,
        env=clean_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_line(proc: subprocess.CompletedProcess, message: str, code: int = 2) -> None:
    """The command exited with `code` and one `error:` line holding `message`, no traceback."""
    assert proc.returncode == code, proc.stderr[-2000:]
    assert message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert len([x for x in proc.stderr.splitlines() if "error:" in x]) == 1, proc.stderr


def one_line_in_process(capsys, call, message: str, code: int = 2) -> str:
    """`one_line` for a command's main run in this process (`call()`): it exits with `code`,
    stderr holds `message`, no traceback, and one `error:` line. For a refusal the process
    boundary adds nothing to, at a fraction of a fresh interpreter's cost."""
    import pytest

    with pytest.raises(SystemExit) as e:
        call()
    err = capsys.readouterr().err
    assert e.value.code == code, err[-2000:]
    assert message in err, err[-2000:]
    assert "Traceback" not in err
    assert len([x for x in err.splitlines() if "error:" in x]) == 1, err
    return err


def one_line_exit_2(capsys, call) -> str:
    """`call()` (a command's main, in-process) exits 2 with one line on stderr; returns it."""
    import pytest

    with pytest.raises(SystemExit) as e:
        call()
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def torch_main(argv):
    """The torch side's command, in-process, on one device in eager mode."""
    from torchxla_ref import train as torch_train

    return torch_train.main(["--parallel", "eager", "--num-devices", "1", *argv])


def jax_main(argv):
    from jaxtpu import train

    return train.main(argv)


SIDE_MAINS = {"jaxtpu": jax_main, "torchxla_ref": torch_main}


def side_main(side: str):
    """`SIDE_COMMANDS[side]`'s command as a function of its flags, run in this process with
    the same base flags (the torch side eager on one device: nothing of torch_xla starts)."""
    module, base = SIDE_COMMANDS[side]

    def main(*argv: Any) -> Any:
        import importlib

        return importlib.import_module(module).main([*base, *map(str, argv)])

    return main


def exit_in_process(capsys, call) -> tuple[int, str]:
    """(exit code, stderr) of `call()`, a command's main run in this process that exits (a
    refusal, an argparse error); a traceback on stderr fails the test."""
    import pytest

    with pytest.raises(SystemExit) as e:
        call()
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return e.value.code, err


def strict_json_lines(path: Path) -> list[dict]:
    """A .jsonl file's records (or a .json file's one), refusing NaN and Infinity tokens."""

    def refuse(token: str):
        raise AssertionError(f"{path}: non-standard JSON token {token}")

    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(x, parse_constant=refuse) for x in text.splitlines() if x]
    return [json.loads(text, parse_constant=refuse)]


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def exercise_feedback_store(store: Any) -> None:
    """What any feedback store must do (`jaxtpu.core.serving.feedback.Store`, on SQLite or
    PostgreSQL): keep, replace by clientToken, keep every suggestion without one, filter by
    community and time, delete one, purge the old; `store` is empty when called."""
    from jaxtpu.core.serving.feedback import Record

    def record(token, text="t", community="Coral:a", when=1000.0, decision="DELETED", **more):
        scores = {decision: {"summaryScore": 1.0}}
        session = more.pop("session", None)
        return Record(text, scores, community, token, session, ("en",), "jaxtpu-v1", when, **more)

    store.put(record("comment:1", "first"))
    store.put(record(None, "no token"))
    store.put(record(None, "no token again"))
    store.put(record("comment:2", "other", community="Coral:b", when=5000.0))
    store.put(record("comment:1", "changed mind", when=2000.0, decision="APPROVED"))
    got = store.records()
    assert [r.text for r in got] == ["no token", "no token again", "changed mind", "other"]
    assert got[2].attribute_scores == {"APPROVED": {"summaryScore": 1.0}}
    assert got[2].languages == ("en",) and got[2].model_version == "jaxtpu-v1"
    assert [r.text for r in store.records(community="Coral:b")] == ["other"]
    assert [r.text for r in store.records(since=1500)] == ["changed mind", "other"]
    assert store.communities() == ["Coral:a", "Coral:b"]
    assert store.delete("comment:1") == 1 and store.delete("comment:1") == 0
    assert store.purge(1, now=5000.0 + 86400 - 1) == 2  # the two at 1000 s; 5000 s stays
    assert [r.text for r in store.records()] == ["other"]
    # issue 95, item 5: a token is one owner's; another key's decision on it is kept apart
    store.put(record("comment:9", "news", when=6000.0, owner="news", moderator=True))
    store.put(record("comment:9", "page", community="Coral:b", when=6001.0, owner="page"))
    got = {r.owner: r for r in store.records() if r.client_token == "comment:9"}
    assert (got["news"].text, got["news"].community_id, got["news"].moderator) == (
        "news",
        "Coral:a",
        True,
    )
    assert got["page"].moderator is False
    assert store.delete("comment:9", owner="page") == 1 and store.delete("comment:9") == 1
    # item 6: suggestions without a token are erased by their session or their text
    store.put(record(None, "mine", when=6002.0, session="s-1"))
    store.put(record(None, "mine too", when=6003.0, session="s-1"))
    store.put(record(None, "my text", when=6004.0))
    assert store.delete(session_id="s-1") == 2 and store.delete(text="my text") == 1
    assert [r.text for r in store.records()] == ["other"]


def nested_batch(depth: int, request: bytes) -> tuple[str, bytes]:
    """(Content-Type, body) of a batch whose one part nests multipart/mixed `depth` levels deep
    around `request` (an application/http part's request line and more): issue 95's 66 KB
    batch that made the email parser recurse past Python's limit."""
    inner = b"Content-Type: application/http\r\n\r\n" + request
    for i in range(depth):
        b = f"n{i}".encode()
        inner = b"Content-Type: multipart/mixed; boundary=%s\r\n\r\n--%s\r\n%s\r\n--%s--\r\n" % (
            b, b, inner, b
        )  # fmt: skip
    kind, _, body = inner.partition(b"\r\n\r\n")
    return kind.decode()[len("Content-Type: ") :], body


def make_store_of_before_owners(execute: Any, postgres: bool) -> None:
    """A feedback table as jaxtpu wrote it before suggestions had owners (issue 95; its
    clientToken unique across the store) holding two suggestions, through `execute(sql)`."""
    ident = (
        "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
        if postgres
        else "INTEGER PRIMARY KEY AUTOINCREMENT"
    )
    real = "DOUBLE PRECISION" if postgres else "REAL"
    execute(
        f"CREATE TABLE jaxtpu_feedback (id {ident}, client_token TEXT UNIQUE, community_id TEXT, "
        "session_id TEXT, text TEXT NOT NULL, attribute_scores TEXT NOT NULL, languages TEXT "
        f"NOT NULL, model_version TEXT NOT NULL, received {real} NOT NULL)"
    )
    execute("CREATE INDEX jaxtpu_feedback_received ON jaxtpu_feedback (received)")
    for token, text, when in (("comment:1", "old one", 10.0), (None, "old two", 20.0)):
        token_sql = "NULL" if token is None else f"'{token}'"
        execute(
            "INSERT INTO jaxtpu_feedback (client_token, community_id, session_id, text, "
            f"attribute_scores, languages, model_version, received) VALUES ({token_sql}, "
            f"'Coral:a', NULL, '{text}', '{{\"DELETED\": {{\"summaryScore\": 1.0}}}}', "
            f"'[\"en\"]', 'v0', {when})"
        )


def check_store_of_before_owners(store: Any) -> None:
    """`make_store_of_before_owners`' table opened by today's Store: migrated, its two
    suggestions kept (owned by ''), a token now one owner's; leaves the store empty."""
    from jaxtpu.core.serving.feedback import Record

    kept = store.records()
    assert [(r.text, r.owner, r.moderator) for r in kept] == [
        ("old one", "", False),
        ("old two", "", False),
    ]
    scores = {"APPROVED": {"summaryScore": 1.0}}
    store.put(Record("by a key", scores, "Coral:a", "comment:1", None, (), "v", 30.0, "k", True))
    store.put(Record("changed", scores, "Coral:a", "comment:1", None, (), "v", 40.0))
    assert [r.text for r in store.records()] == ["old two", "by a key", "changed"]
    assert store.delete("comment:1") == 2 and store.delete(text="old two") == 1


def postgres_binaries() -> Path | None:
    """The directory of a PostgreSQL server's initdb and pg_ctl (Debian's package
    `postgresql`, which .ci/run installs), or None."""
    import shutil

    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    return None


class Postgres:
    """A PostgreSQL server of its own on a free port of 127.0.0.1 (trust authentication, user
    postgres), its data in a new directory of the system's temporary one (pytest's are closed
    to other users); as root, it runs as the `postgres` user (initdb refuses root). `url` is
    its database's address; `stop()` ends it and removes its data."""

    def __init__(self) -> None:
        import socket
        import tempfile

        bin_dir = postgres_binaries()
        assert bin_dir is not None
        root = Path(tempfile.mkdtemp(prefix="jaxtpu-pg-"))
        self.root, self.data, self.bin = root, root / "pgdata", bin_dir
        self.data.mkdir()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.prefix: list[str] = []
        if os.geteuid() == 0:
            import pwd

            user = pwd.getpwnam("postgres")
            for path in (root, self.data):
                os.chown(path, user.pw_uid, user.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        options = f"-p {self.port} -h 127.0.0.1 -k {root} -c fsync=off"
        log = str(root / "server.log")  # the server keeps no pipe of ours open
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "-t", "60", "start"
        )
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        proc = subprocess.run(
            [*self.prefix, str(self.bin / tool), *args], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, f"{tool}: {proc.stdout}{proc.stderr}"

    def stop(self) -> None:
        import shutil

        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
