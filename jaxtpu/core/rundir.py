"""Run directories: creating them safely, config.json, metrics.jsonl, TensorBoard, summary.json,
the identity a checkpoint must match, and turning user errors into one clear line.
Framework-free: the torch side writes the same layout with this module.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jaxtpu.core.config import Config
from jaxtpu.core.errors import CheckpointError, TrainingError, UserError

__all__ = ["RunLog", "check_compatible", "prepare_workdir", "setup_logging", "user_errors"]

log = logging.getLogger("jaxtpu")


def setup_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    for noisy in ("absl", "orbax", "jax._src", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def default_workdir(task: str) -> Path:
    return Path("runs") / f"{task}-{time.strftime('%Y%m%d-%H%M%S')}"


def prepare_workdir(workdir: Path, resume: bool, task: str = "run", create: bool = True) -> Path:
    """Creates the run directory; refuses to write over an earlier run unless resuming.

    `create=False` (processes other than 0 of a multi-process run) only checks."""
    if not str(workdir) or str(workdir) == ".":
        workdir = default_workdir(task)
    if workdir.exists() and not workdir.is_dir():
        raise UserError(f"--workdir {workdir} is a file, expected a directory")
    if (
        workdir.exists()
        and not resume
        and any(
            (workdir / name).exists() for name in ("metrics.jsonl", "checkpoints", "summary.json")
        )
    ):
        raise UserError(
            f"--workdir {workdir} already holds a run; continue it with --resume, or choose "
            "another --workdir (earlier results are never overwritten)"
        )
    if not create:
        return workdir
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        probe = workdir / ".write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UserError(f"--workdir {workdir} is not writable ({e.strerror})") from None
    return workdir


def identity(meta: dict[str, Any]) -> dict[str, Any]:
    """What makes two checkpoints compatible: the task and the encoder shape."""
    return {"task": meta.get("task"), "encoder": meta.get("encoder")}


def check_compatible(found: dict[str, Any], expected: dict[str, Any], where: Path) -> None:
    """Refuses a checkpoint of another task or model (both sides' checkpoints carry an
    identity in their metadata)."""
    a, b = identity(found), identity(expected)
    if a == b:
        return
    if a["task"] != b["task"]:
        raise CheckpointError(
            f"{where}: checkpoint is for task {a['task']!r}, this run is {b['task']!r}"
        )
    diff = [
        f"{k}={a['encoder'].get(k)} (run: {b['encoder'].get(k)})"
        for k in b["encoder"]
        if a["encoder"] and a["encoder"].get(k) != b["encoder"].get(k)
    ]
    raise CheckpointError(
        f"{where}: checkpoint is from another model: {', '.join(diff) or 'different encoder'}"
    )


def peak_host_memory_mb() -> float:
    """Peak resident memory of this process (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


class RunLog:
    """metrics.jsonl (+ TensorBoard events) of one run directory."""

    def __init__(
        self,
        workdir: Path,
        resume_step: int | None = None,
        tensorboard: bool = True,
        enabled: bool = True,
    ):
        """`enabled=False` (replicas other than the first, processes other than 0) writes
        nothing."""
        self.workdir = workdir
        self.path = workdir / "metrics.jsonl"
        self.enabled = enabled
        self._file: Any = None
        self._tb: Any = None
        if not enabled:
            return
        if resume_step is not None and self.path.exists():
            # Lines after the resumed checkpoint belong to steps that will run again.
            keep = [
                line
                for line in self.path.read_text().splitlines()
                if line.strip()
                and json.loads(line).get("event") != "final"
                and json.loads(line).get("step", 0) <= resume_step
            ]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(line + "\n" for line in keep))
            os.replace(tmp, self.path)
        self._file = self.path.open("a", buffering=1)
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(str(workdir / "tensorboard"))
            except ImportError:
                pass

    def write_config(self, cfg: Config, data_info: dict[str, Any], devices: Any) -> None:
        if not self.enabled:
            return
        record = {
            "config": cfg.to_dict(),
            "data": data_info,
            "devices": [str(d) for d in devices],
            "python": platform.python_version(),
            "argv": sys.argv,
        }
        (self.workdir / "config.json").write_text(json.dumps(record, indent=2, default=str))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"time": round(time.time(), 3), **record}
        self._file.write(json.dumps(record, default=float) + "\n")
        if self._tb is not None and "step" in record:
            prefix = record.get("event", "train")
            for k, v in record.items():
                if k not in ("step", "time", "epoch", "event") and isinstance(v, int | float):
                    self._tb.add_scalar(f"{prefix}/{k}", v, record["step"])

    def finish(self, summary: dict[str, Any]) -> None:
        summary = {**summary, "peak_host_memory_mb": round(peak_host_memory_mb(), 1)}
        if not self.enabled:
            return
        self.write({"event": "final", **summary})
        tmp = self.workdir / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2, default=str))
        os.replace(tmp, self.workdir / "summary.json")
        self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._tb is not None:
            self._tb.close()


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Reports bad input as one line on stderr and exits 2; a NaN loss exits 1. Other
    exceptions are bugs and keep their traceback."""
    setup_logging()
    try:
        yield
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except TrainingError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(
            "interrupted; finished checkpoints are kept (continue with --resume)", file=sys.stderr
        )
        sys.exit(130)
