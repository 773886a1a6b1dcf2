"""Orbax checkpoints of a run: the latest state (for --resume) and the best model.

Layout under the run directory:
  checkpoints/latest/<step>/  {state: step, params, opt_state; meta: json}  (kept: 1)
  checkpoints/best/<step>/    {state: params; meta: json incl. the metric}     (kept: 1)
Orbax writes each checkpoint into a temporary directory and renames it when complete, so a
run killed mid-write leaves the previous checkpoint intact. In a bucket (`--workdir gs://...`,
through etils' epath and tensorstore) it writes the step's objects, then a `commit_success.txt`
marker, and reads only steps that have one: the same promise without a rename.
With `--async-checkpoint` a save returns once the state is copied to the host and orbax writes
it in the background; the next save, and the end of the run, wait for it (`wait`).

With several processes (multi-host) only process 0 reads and writes checkpoints; a restored
state reaches the other processes by broadcast, so no shared file system is needed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from jaxtpu.core import storage
from jaxtpu.core.errors import CheckpointError
from jaxtpu.core.files import disk_full, disk_full_message
from jaxtpu.core.run.rundir import check_compatible
from jaxtpu.core.run.store import RESUME_ADVICE

log = logging.getLogger(__name__)

Where = Path | epath.Path


def _path(workdir: str | Path) -> Where:
    """A run directory as orbax takes it: a local path, or an epath for a URL (its retries
    configured once, `bucket_retries`)."""
    if not storage.is_remote(workdir):
        return Path(workdir)
    storage.configure_emulator()
    bucket_retries()
    return epath.Path(str(workdir))


def bucket_retries() -> None:
    """How long tensorstore keeps retrying a bucket that does not answer before orbax's save
    fails: `JAXTPU_BUCKET_RETRIES` attempts (default 8), waits doubling from 1 s to 16 s (about
    a minute and a half; tensorstore's own default, 32 attempts up to 32 s apart, is a quarter
    of an hour). Orbax builds every tensorstore context from these module defaults; with an
    orbax that has none, tensorstore keeps its own."""
    from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils

    retries = {
        "max_retries": storage.retry_attempts(),
        "initial_delay": "1s",
        "max_delay": "16s",
    }
    for name in ("_BASE_TS_CONTEXT", "_DEFAULT_OCDBT_TS_CONTEXT"):
        context = getattr(ts_utils, name, None)
        if isinstance(context, dict):
            context["gcs_request_retries"] = retries


def _manager(path: Where, async_save: bool = False) -> ocp.CheckpointManager:
    multi: dict[str, Any] = {}
    if jax.process_count() > 1:  # only process 0 calls into orbax: no cross-process barriers
        path.mkdir(parents=True, exist_ok=True)
        multi = dict(
            create=False,
            multiprocessing_options=ocp.options.MultiprocessingOptions(
                primary_host=0, active_processes={0}
            ),
        )
    options = {"max_to_keep": 1, "create": True, "enable_async_checkpointing": async_save}
    return ocp.CheckpointManager(
        path.absolute() if isinstance(path, Path) else path,
        options=ocp.CheckpointManagerOptions(**{**options, **multi}),
    )


def _closed_loop(exc: BaseException | None) -> bool:
    return isinstance(exc, RuntimeError) and "Event loop is closed" in str(exc)


_SILENCED = False


def _silence_closed_loop_noise() -> None:
    """After a failed write the run ends, but orbax's pool threads can still finish later and
    try to hand their results to its closed asyncio loop, which logs (or raises in the thread)
    `RuntimeError: Event loop is closed` with a traceback, possibly after the one-line error
    (an intermittent race: tests/test_rundir.py full-disk case). Those reports, and only
    those, are dropped. Installed before the first save, not after a failure: a thread can
    report while the failure is still unwinding, and the run's log handler writes to the
    real stderr, which the save's `redirect_stderr` does not catch."""
    global _SILENCED
    if _SILENCED:
        return
    _SILENCED = True

    def keep(record: logging.LogRecord) -> bool:
        return not (record.exc_info and _closed_loop(record.exc_info[1]))

    for name in ("concurrent.futures", "asyncio"):
        logging.getLogger(name).addFilter(keep)
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if not _closed_loop(args.exc_value):
            previous(args)

    threading.excepthook = hook


def _drop_closed_loop_tracebacks() -> None:
    """Puts `_DropClosedLoopTracebacks` on sys.stderr, once."""
    if not isinstance(sys.stderr, _DropClosedLoopTracebacks):
        sys.stderr = _DropClosedLoopTracebacks(sys.stderr)


class _DropClosedLoopTracebacks(io.TextIOBase):
    """stderr, less the bare tracebacks ending in `RuntimeError: Event loop is closed` that
    tensorstore's threads print straight to it (no logger, no thread hook) when they finish
    after a failed save closed orbax's loop (as many as fifty after the one-line error, in
    about one run in five on a full disk), or after a read of a checkpoint that was being
    replaced was cut short. Every other line passes through unchanged.

    What each thread writes is read on its own: the threads print their tracebacks while
    the main thread prints the run's one-line error, so the lines of both arrive mixed
    (tests/test_rundir.py's full-disk case failed a CI run that way)."""

    END = "RuntimeError: Event loop is closed"

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.threads: dict[int, _Written] = {}  # thread id -> what it wrote not yet decided

    def write(self, text: str) -> int:
        mine = self.threads.setdefault(threading.get_ident(), _Written())
        mine.pending += text
        *lines, mine.pending = mine.pending.split("\n")
        for line in lines:
            self._line(mine, line + "\n")
        return len(text)

    def _line(self, mine: _Written, line: str) -> None:
        if line.startswith("Traceback (most recent call last):"):
            mine.open += 1
        elif not mine.block:
            self.stream.write(line)
            return
        mine.block.append(line)
        if line.startswith((" ", "\t", "Traceback")):
            return  # a traceback goes on
        if line.startswith(self.END):
            mine.open -= 1
            if mine.open <= 0:  # every traceback of the block was a closed loop's: dropped
                mine.block, mine.open = [], 0
            return
        self.stream.write("".join(mine.block))  # another error's: shown whole
        mine.block, mine.open = [], 0

    def flush(self) -> None:
        mine = self.threads.get(threading.get_ident())
        if mine is not None and mine.pending and not mine.block:
            self.stream.write(mine.pending)
            mine.pending = ""
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()


@dataclasses.dataclass
class _Written:
    """One thread's writes to `_DropClosedLoopTracebacks`: the line it has begun, and the
    traceback lines held until their last line says whether they are dropped."""

    pending: str = ""
    block: list[str] = dataclasses.field(default_factory=list)
    open: int = 0  # tracebacks begun in `block` and not ended


class _Replaced(Exception):
    """The checkpoint being read went away meanwhile: the run that owns the directory is still
    training and replaced it with a newer one (orbax writes the new step, then deletes the
    old). Read again, from the directory as it is now."""


READS = 20  # attempts at reading a checkpoint that keeps being replaced


class Checkpoints:
    """The latest and the best checkpoint of one run directory."""

    def __init__(self, workdir: str | Path, procs: Any = None, async_save: bool = False) -> None:
        """`workdir`: the run directory (a path, or a bucket URL); `procs`: a
        `jaxtpu.engine.hosts.Processes` in multi-process runs (None: one process); `async_save`:
        saves return once the state is on the host (`--async-checkpoint`)."""
        self.procs = procs
        self.primary = procs is None or procs.primary
        self.remote = storage.is_remote(workdir)
        self.root = _path(workdir) / "checkpoints"
        self.latest_dir = self.root / "latest"
        self.best_dir = self.root / "best"
        self.async_save = async_save
        self._latest: ocp.CheckpointManager | None = None
        self._best: ocp.CheckpointManager | None = None
        self._pending: dict[str, int] = {}  # manager name -> the step it may still be writing

    @property
    def latest(self) -> ocp.CheckpointManager:
        if self._latest is None:
            self._latest = _manager(self.latest_dir, self.async_save)
        return self._latest

    @property
    def best(self) -> ocp.CheckpointManager:
        if self._best is None:
            self._best = _manager(self.best_dir, self.async_save)
        return self._best

    def _save(self, name: str, step: int, tree: Any, meta: dict[str, Any]) -> None:
        """Writes one checkpoint (with --async-checkpoint: starts writing it); a full disk or a
        bucket that fails is one `CheckpointError` line (`_failed`)."""
        mgr = getattr(self, name)
        if step in mgr.all_steps():  # e.g. resuming a finished run: that state is saved already
            return
        _silence_closed_loop_noise()
        # orbax's worker threads print asyncio tracebacks while a failed write unwinds: keep
        # what they print, and show it unless the failure is one the one line explains.
        printed = io.StringIO()
        try:
            with contextlib.redirect_stderr(printed):
                mgr.save(  # waits for this manager's previous asynchronous save first
                    step,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta)
                    ),
                    force=True,
                )
                if not self.async_save:
                    mgr.wait_until_finished()
        except Exception as e:
            # an asynchronous save fails when the next one starts (orbax waits for it first)
            failed = self._pending.get(name, step) if self.async_save else step
            self._failed(mgr, failed, e, printed)
        self._pending[name] = step
        sys.stderr.write(printed.getvalue())

    def wait(self) -> None:
        """Waits for the asynchronous saves still being written (none without
        --async-checkpoint); a failed one is one `CheckpointError` line."""
        for name in ("_latest", "_best"):
            mgr = getattr(self, name)
            if mgr is None:
                continue
            printed = io.StringIO()
            try:
                with contextlib.redirect_stderr(printed):
                    mgr.wait_until_finished()
            except Exception as e:
                self._failed(mgr, self._pending.get(name.lstrip("_"), -1), e, printed)
            sys.stderr.write(printed.getvalue())

    def _failed(
        self, mgr: ocp.CheckpointManager, step: int, error: Exception, printed: io.StringIO
    ) -> None:
        """A save that failed: a full disk or a bucket that stopped answering ends the run with
        one line (the step being written never appears: the previous checkpoint stays the
        latest); anything else keeps its traceback."""
        full = disk_full(error)
        if full is None and not self.remote:
            sys.stderr.write(printed.getvalue())
            raise error
        directory = mgr.directory
        _drop_closed_loop_tracebacks()  # the run ends with this error
        with contextlib.suppress(Exception), contextlib.redirect_stderr(printed):
            mgr.close()  # stop its threads: the run ends here
        if full is None:  # a bucket: a step without its commit marker is never read
            raise CheckpointError(
                f"{directory}: the bucket did not answer while checkpoint {step} was saved "
                f"({type(error).__name__}: {storage.first_line(error)}); {RESUME_ADVICE}"
            ) from None
        # orbax writes into '<step>.orbax-checkpoint-tmp-*' and renames when complete:
        # the half-written directories go (this run's: it holds the run directory), the
        # previous checkpoint stays.
        for tmp in Path(directory).glob("*.orbax-checkpoint-tmp*"):
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(disk_full_message(directory, f"checkpoint {step}")) from None

    def save_latest(self, step: int, tree: Any, meta: dict[str, Any]) -> None:
        if self.primary:
            self._save("latest", step, tree, meta)

    def save_best(self, step: int, params: Any, meta: dict[str, Any]) -> None:
        if self.primary:
            self._save("best", step, {"params": params}, meta)

    def latest_step(self) -> int | None:
        step = None
        if self.primary and self.latest_dir.exists():
            step = self.latest.latest_step()
        return step if self.procs is None else self.procs.broadcast_json(step)

    def _reading(self, name: str, read: Any) -> Any:
        """`read(manager)` of the `latest` or `best` directory, again from a fresh look at the
        directory while the checkpoint it was reading is replaced under it (`jaxtpu.load`
        or predict of a run that is still training sees the previous best model or the new
        one, never an error)."""
        for attempt in range(READS):
            try:
                return read(getattr(self, name))
            except Exception as e:
                # _Replaced, or a file that went while orbax listed or opened the steps (its
                # manager reads each step's metadata as it starts): read again
                if not isinstance(e, _Replaced) and not _file_went(e):
                    raise
                # the reads cut short finish in tensorstore's threads after their loop closed,
                # each printing a bare 'Event loop is closed' traceback (83 in 93 calls of
                # benchmarks.serving.load_race): dropped, as after a failed save
                _drop_closed_loop_tracebacks()
                self._drop(name)  # its list of steps is stale
                time.sleep(0.01 * attempt)
        raise CheckpointError(
            f"{self.root / name}: its checkpoint was replaced {READS} times while being read; "
            "try again"
        )

    def _drop(self, name: str) -> None:
        """Closes and forgets the `latest` or `best` manager (a reader's: its threads stop
        now, instead of printing 'Event loop is closed' tracebacks when it is collected)."""
        mgr = getattr(self, f"_{name}")
        setattr(self, f"_{name}", None)
        if mgr is not None:
            _silence_closed_loop_noise()
            with contextlib.suppress(Exception), contextlib.redirect_stderr(io.StringIO()):
                mgr.close()

    def close(self) -> None:
        """Closes the managers of a reader (scoring, `jaxtpu.load`); a run's own saves end
        with `wait`."""
        for name in ("latest", "best"):
            self._drop(name)

    def _restore_everywhere(
        self, name: str, where: Path, template: Any, expect: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        """Process 0 restores; the others get its state, its metadata or its error."""

        def restore(mgr: ocp.CheckpointManager) -> tuple[Any, dict[str, Any]]:
            return self._restore(mgr, where, template, expect)

        if self.procs is None:
            return self._reading(name, restore)
        state, found = template, {"error": None, "meta": None}
        if self.primary:
            try:
                state, found["meta"] = self._reading(name, restore)
            except CheckpointError as e:
                found["error"] = str(e)
        found = self.procs.broadcast_json(found)
        if found["error"]:
            raise CheckpointError(found["error"])
        return self.procs.broadcast(jax.tree_util.tree_map(np.asarray, state)), found["meta"]

    def _restore(
        self, mgr: ocp.CheckpointManager, where: Path, template: Any, expect: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        step = mgr.latest_step()
        if step is None:
            raise CheckpointError(f"{where}: no checkpoint found")
        path = where / str(step)
        try:
            meta = _read_meta(mgr, step)
        except Exception as e:  # orbax raises many types for damaged files
            _check_still_there(path)
            raise CheckpointError(f"{path}: unreadable checkpoint metadata ({e})") from None
        check_compatible(meta, expect, path)
        target = ocp.args.StandardRestore(jax.tree_util.tree_map(np.asarray, template))
        try:
            state = mgr.restore(step, args=ocp.args.Composite(state=target)).state
        except Exception as e:
            _check_still_there(path)
            raise CheckpointError(
                f"{path}: unreadable or incomplete checkpoint ({type(e).__name__}: {e}); "
                "move it away to start from the previous one, or start a new --workdir"
            ) from None
        return state, meta

    def restore_latest(self, template: Any, expect: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return self._restore_everywhere("latest", self.latest_dir, template, expect)

    def restore_best(self, template: Any, expect: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        state, meta = self._restore_everywhere("best", self.best_dir, {"params": template}, expect)
        return state["params"], meta

    def best_meta(self) -> dict[str, Any] | None:
        if not self.best_dir.exists():
            return None

        def meta(mgr: ocp.CheckpointManager) -> dict[str, Any] | None:
            step = mgr.latest_step()
            if step is None:
                return None
            try:
                return _read_meta(mgr, step)
            except Exception as e:
                _check_still_there(self.best_dir / str(step))
                raise CheckpointError(
                    f"{self.best_dir / str(step)}: unreadable checkpoint metadata ({e})"
                ) from None

        return self._reading("best", meta)


def _file_went(error: BaseException) -> bool:
    """Whether a FileNotFoundError is behind `error` (orbax wraps some in its own errors);
    never for jaxtpu's own one-line errors (a damaged checkpoint is reported, not retried)."""
    seen: BaseException | None = error
    for _ in range(10):
        if seen is None or isinstance(seen, CheckpointError):
            return False
        if isinstance(seen, FileNotFoundError):
            return True
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    return False


def _read_meta(mgr: ocp.CheckpointManager, step: int) -> dict[str, Any]:
    return mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta


def _check_still_there(path: Path) -> None:
    """After a failed read of step directory `path`: `_Replaced` when it is gone or going (a
    newer step sits beside it: the run that owns the directory replaced it, and deletes the
    old one file by file), so that the caller reads the directory again."""
    steps = [int(p.name) for p in path.parent.glob("[0-9]*") if p.name.isdigit()]
    if not path.exists() or max(steps, default=-1) > int(path.name):
        raise _Replaced(str(path))
