"""Run directories: creating them safely, config.json, metrics.jsonl, TensorBoard, summary.json,
the model key (task and encoder) a checkpoint must match, and turning user errors into one
clear line. Framework-free: the torch side writes the same layout with this module.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import platform
import resource
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jaxtpu.core import files, storage
from jaxtpu.core.errors import CheckpointError, UserError
from jaxtpu.core.flags.runspec import RunSpec, model_key
from jaxtpu.core.flags.schema import (
    JAX_STRATEGIES,
    RESUME_MAY_CHANGE,
    TORCH_STRATEGIES,
    Config,
    changed_flags,
    flat_record,
)
from jaxtpu.core.flags.values import parse_trackers
from jaxtpu.core.run.lease import Lease
from jaxtpu.core.run.store import RunStore, working_copy
from jaxtpu.core.run.trackers import check_ready, open_trackers

__all__ = [
    "RunLog",
    "check_compatible",
    "claim_workdir",
]

log = logging.getLogger("jaxtpu")


def default_workdir(task: str) -> Path:
    return Path("runs") / f"{task}-{time.strftime('%Y%m%d-%H%M%S')}"


LOCK_FILE = ".lock"


@contextlib.contextmanager
def claim_workdir(workdir: str | Path, cfg: Config, create: bool = True) -> Iterator[RunStore]:
    """The run directory, held by this run for as long as the context lasts.

    Creates it (refusing to write over an earlier run unless resuming), takes its lock (a
    second run on the same directory gets one line naming the process that holds it; the
    kernel drops the lock when a process dies, even by SIGKILL), and on --resume refuses flags
    that differ from the run's recorded ones (`RESUME_MAY_CHANGE` may). `create=False`
    (processes other than 0 of a multi-process run, which write nothing) only checks the path.
    A `gs://` run directory is held by a lease instead and written through a working copy
    here (`_claim_bucket`). Yields the `RunStore`.
    """
    if not str(workdir) or str(workdir) == ".":
        workdir = default_workdir(cfg.train.task)
    if storage.is_remote(workdir):
        with _claim_bucket(str(workdir), cfg, create) as store:
            yield store
        return
    workdir = Path(workdir)
    if workdir.exists() and not workdir.is_dir():
        raise UserError(f"--workdir {workdir} is a file, expected a directory")
    if not create:
        yield RunStore(workdir)
        return
    check_ready(parse_trackers(cfg.output.tracker))  # before anything is created
    fresh = not workdir.exists()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        probe = workdir / ".write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UserError(f"--workdir {workdir} is not writable ({e.strerror})") from None
    before = {p.name for p in workdir.iterdir()}  # (the lock file is this run's too)
    lock = _lock(workdir)
    store = RunStore(workdir)
    try:
        if not cfg.output.resume and store.holds_a_run():
            raise UserError(_HOLDS_A_RUN.format(workdir=workdir))
        if cfg.output.resume:
            check_resume(cfg, workdir)
        yield store
    except UserError:
        _remove_new(workdir, before, fresh)
        raise
    finally:
        files.release_lock(lock)


_HOLDS_A_RUN = (
    "--workdir {workdir} already holds a run; continue it with --resume, or choose another "
    "--workdir (earlier results are never overwritten)"
)


@contextlib.contextmanager
def _claim_bucket(url: str, cfg: Config, create: bool) -> Iterator[RunStore]:
    """A bucket run directory (`jaxtpu.core.run.store`): its lease taken (`Lease`), the
    working copy started empty or, on --resume, from the bucket, and on the way out what
    changed published and the lease released. A run refused (bad input, the bucket failing)
    publishes nothing more: what it wrote after its latest checkpoint is not needed to resume,
    and the checkpoints in the bucket are untouched."""
    local = working_copy(url)
    if not create:
        yield RunStore(local, url)
        return
    check_ready(parse_trackers(cfg.output.tracker))
    lease = Lease(url).acquire()
    store = RunStore(local, url, lease)
    try:
        if not cfg.output.resume and store.holds_a_run():
            raise UserError(_HOLDS_A_RUN.format(workdir=url))
        if cfg.output.resume:
            store.pull()
            with storage.named(local, url):
                check_resume(cfg, local)
        else:
            shutil.rmtree(local, ignore_errors=True)
            local.mkdir(parents=True)
        yield store
    except (UserError, KeyboardInterrupt):  # refused, the bucket failed, or quit now
        raise
    except BaseException:
        _publish_after_failure(store)
        raise
    else:
        store.publish()
    finally:
        lease.release()


def _publish_after_failure(store: RunStore) -> None:
    """What a run that failed (a NaN loss, a bug) wrote is still published, so the bucket
    shows why it stopped; a failure to publish it is only logged."""
    try:
        store.publish()
    except Exception as e:
        log.warning("%s: could not publish the run's last files (%s)", store.url, e)


def _remove_new(workdir: Path, before: set[str], fresh: bool) -> None:
    """After a run refused (bad input) before it saved a checkpoint: removes what it added to
    its directory (the tokenizer copy, config.json, an empty metrics.jsonl, the directory
    itself when the run created it), so the next run there starts clean."""
    new = [p for p in workdir.iterdir() if p.name not in before]
    if any(p.name == "checkpoints" for p in new):
        return  # it trained: keep what it has
    for p in new:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    if fresh:  # its lock file was among the new entries
        with contextlib.suppress(OSError):
            workdir.rmdir()


def _lock(workdir: Path) -> int:
    fd, holder = files.take_lock(workdir / LOCK_FILE)
    if fd is None:
        raise UserError(
            f"--workdir {workdir} is in use by another run ({holder}); wait for it to end, "
            "or choose another --workdir"
        )
    return fd


def check_resume(cfg: Config, workdir: Path) -> None:
    """Refuses --resume with flags that differ from the ones the run recorded in config.json
    (a run killed before it wrote one has nothing to compare with)."""
    record = workdir / "config.json"
    if not record.exists():
        return
    try:
        old = json.loads(record.read_text())["config"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(
            f"{record}: unreadable, so --resume cannot check the run's flags; restore it or "
            "start a new --workdir"
        ) from None
    changed = [
        f"--{name.replace('_', '-')} {before} -> {value}"
        for name, before, value in changed_flags(old, cfg)
        if name not in RESUME_MAY_CHANGE
    ]
    recorded = flat_record(old)
    k_before = recorded.get("steps_per_call", cfg.placement.steps_per_call)
    if cfg.data.buckets != "none" and k_before != cfg.placement.steps_per_call:
        changed.append(
            f"--steps-per-call {k_before} -> {cfg.placement.steps_per_call} (with --buckets the "
            "epoch's batch order groups K batches of a bucket per call)"
        )
    before, now = recorded.get("parallel"), cfg.placement.parallel
    if before and not any({before, now} <= set(s) for s in (JAX_STRATEGIES, TORCH_STRATEGIES)):
        changed.append(f"--parallel {before} -> {now} (the other framework's checkpoints)")
    if changed:
        raise UserError(
            f"--resume {workdir}: flags differ from the run's ({record}): {'; '.join(changed)}. "
            "Resume with the run's values; only "
            f"{', '.join('--' + n.replace('_', '-') for n in sorted(RESUME_MAY_CHANGE))} may change"
        )


def check_compatible(found: dict[str, Any], expected: dict[str, Any], where: Path) -> None:
    """Refuses a checkpoint of another task or model (both sides' checkpoints carry a
    `model_key` in their metadata)."""
    a, b = (model_key(m.get("task"), m.get("encoder"), m.get("head")) for m in (found, expected))
    if a == b:
        return
    if a["task"] != b["task"]:
        raise CheckpointError(
            f"{where}: checkpoint is for task {a['task']!r}, this run is {b['task']!r}"
        )
    head_a, head_b = a.get("head", "jaxtpu"), b.get("head", "jaxtpu")
    if head_a != head_b:
        raise CheckpointError(
            f"{where}: checkpoint has the {head_a} head (--head {head_a}), this run --head {head_b}"
        )
    diff = [
        f"{k}={a['encoder'].get(k)} (run: {b['encoder'].get(k)})"
        for k in b["encoder"]
        if a["encoder"] and a["encoder"].get(k) != b["encoder"].get(k)
    ]
    raise CheckpointError(
        f"{where}: checkpoint is from another model: {', '.join(diff) or 'different encoder'}"
    )


def _finite(value: Any) -> Any:
    """JSON-safe: NaN and infinities (an undefined metric, no best value yet) become null."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):  # numpy scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def strict_json(record: Any, indent: int | None = None) -> str:
    """Standard JSON (no NaN/Infinity tokens, which strict parsers reject)."""
    return json.dumps(_finite(record), indent=indent, default=str, allow_nan=False)


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
        trackers: tuple[str, ...] | None = None,
        config: dict[str, Any] | None = None,
    ):
        """`enabled=False` (replicas other than the first, processes other than 0) writes
        nothing. `trackers` (`jaxtpu.core.run.trackers`; default: TensorBoard when `tensorboard`)
        get every scalar of every line, `config` as their run config."""
        self.workdir = workdir
        self.path = workdir / "metrics.jsonl"
        self.enabled = enabled
        self._file: Any = None
        self._trackers: list[Any] = []
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
            files.write_text(self.path, "".join(line + "\n" for line in keep))
        self._file = self.path.open("a", buffering=1)
        if trackers is None:
            trackers = ("tensorboard",) if tensorboard else ()
        self._trackers = open_trackers(trackers, workdir, config or {})

    def write_config(
        self, cfg: Config, spec: RunSpec, data_info: dict[str, Any], devices: Any
    ) -> None:
        """config.json: the flags (a valid input of `from_dict`), what they resolved to
        (`RunSpec.to_dict`), the data, the devices and how the run was started."""
        if not self.enabled:
            return
        record = {
            "config": cfg.to_dict(),
            "resolved": spec.to_dict(),
            "data": data_info,
            "devices": [str(d) for d in devices],
            "python": platform.python_version(),
            "argv": sys.argv,
        }
        files.write_text(self.workdir / "config.json", strict_json(record, indent=2))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"time": round(time.time(), 3), **record}
        self._file.write(strict_json(record) + "\n")
        if self._trackers and "step" in record:
            values = {
                k: v
                for k, v in record.items()
                if k not in ("step", "time", "epoch", "event")
                and isinstance(v, int | float)
                and not isinstance(v, bool)
                and math.isfinite(v)
            }
            for tracker in self._trackers:
                tracker.log(record.get("event", "train"), values, record["step"])

    def finish(self, summary: dict[str, Any]) -> None:
        summary = {**summary, "peak_host_memory_mb": round(peak_host_memory_mb(), 1)}
        if not self.enabled:
            return
        self.write({"event": "final", **summary})
        files.write_text(self.workdir / "summary.json", strict_json(summary, indent=2))
        self.close(summary)

    def close(self, summary: dict[str, Any] | None = None) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        trackers, self._trackers = self._trackers, []
        for tracker in trackers:
            tracker.close(summary)
