"""The training loop both sides share: a pure schedule of device calls, and a short driver that
runs it (logging, evaluation, checkpoints, early stopping, NaN detection, SIGTERM, progress).

Framework-free. Each side supplies a `Backend` (JAX: `jaxtpu.backend.JaxBackend`; torch_xla:
`torchxla_ref.backend.XlaBackend`) that owns the model state on its devices; the loop only ever
hands it numpy batches from `jaxtpu.core.data.taskdata` and asks for host numbers at the logging
interval.
"""

from __future__ import annotations

import csv
import logging
import math
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from jaxtpu.core.data import taskdata, tokenized
from jaxtpu.core.data.buckets import Batcher, Rows
from jaxtpu.core.data.tokens import load_tokenizer, save_tokenizer
from jaxtpu.core.errors import ConfigError, TrainingError, UserError
from jaxtpu.core.files import atomic_write
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import Config, RunConfig, profile_range
from jaxtpu.core.hardware import peak_flops_per_device
from jaxtpu.core.run.rundir import RunLog
from jaxtpu.core.run.timing import Clock, batch_work, progress_postfix
from jaxtpu.core.run.trackers import parse as parse_trackers
from jaxtpu.core.schedules import Horizon, learning_rate, peak_lr
from jaxtpu.core.tasks import Task, higher_is_better

log = logging.getLogger("jaxtpu")


class Backend(Protocol):
    """What a framework provides to the loop."""

    name: str
    num_devices: int  # global, over all processes
    num_processes: int
    primary: bool  # process 0: the one that writes the run directory
    device_kind: str  # `hardware.peak_flops_per_device` knows a TPU's; "" = unknown

    def local_rows(self, n: int) -> slice:
        """The rows of an n-row global batch this process feeds (all of them with one)."""

    def any_process(self, flag: bool) -> bool:
        """True on every process when `flag` is True on any (a host-level collective)."""

    def compile_count(self) -> int:
        """How many train programs were built so far: one per sequence length of the train
        calls (evaluation programs are not counted, on either side)."""

    def prepare(self, batches: list[dict[str, np.ndarray]]) -> Any:
        """The input of one `train_steps` call built from these consecutive host batches
        (e.g. stacked and already on the devices). Runs on the input thread, while the
        devices work on earlier calls."""

    def precompile(
        self, calls: list[list[dict[str, np.ndarray]]], evals: list[dict[str, np.ndarray]]
    ) -> int:
        """Builds, before the first step, the programs for a train call like each of `calls`
        and an evaluation batch like each of `evals` (one of each shape the run uses);
        returns how many it built (0: it builds them on first use)."""

    def train_steps(self, prepared: Any) -> list[Any]:
        """Runs the steps of one `prepare`d call asynchronously (one device call on the
        JAX side, see --steps-per-call); returns handles on their device-side metrics."""

    def fetch(self, handles: list[Any]) -> list[dict[str, float]]:
        """Host values of the handles' metrics ('loss', 'grad_norm'), one dict per step: one
        device sync."""

    def eval_batch(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Per-example 'score' and 'loss' of the global batch whose local rows are `batch`,
        on the host of every process."""

    def restore_latest(self, identity: dict[str, Any]) -> ResumeState:
        """Continues from the run's latest checkpoint, which must match `identity` (a fresh
        start when there is none); called before the first step."""

    def save_latest(self, step: int, meta: dict[str, Any]) -> None: ...

    def save_best(self, step: int, meta: dict[str, Any]) -> None: ...

    def device_memory_mb(self) -> list[float] | None:
        """Peak memory per device of this process, where the devices report it."""

    def profile_start(self, directory: Path) -> None:
        """Starts the profiler's trace into `directory` (only with `--profile-steps`, a flag
        of the sides whose backend has a profiler)."""

    def profile_stop(self) -> None: ...


@dataclass
class Plan:
    """How many steps a run takes, derived once from the config and the data size."""

    n_train: int
    global_batch: int
    steps_per_epoch: int
    total: int
    total_updates: int
    batcher: Batcher  # every train and eval batch (padded, or in length buckets)
    accumulate: int = 1

    @property
    def horizon(self) -> Horizon:
        """The schedule's length: the run's optimizer updates, and per epoch."""
        return Horizon(self.total_updates, self.steps_per_epoch / self.accumulate)

    @classmethod
    def make(cls, cfg: Config, train: tokenized.Examples, num_devices: int) -> Plan:
        run, n_train = cfg.run, len(train)
        global_batch = run.batch_size * num_devices
        if n_train < global_batch:
            raise UserError(
                f"--batch-size {run.batch_size} x {num_devices} devices = global batch "
                f"{global_batch} is larger than the {n_train} training {cfg.task.unit}; use a "
                "smaller --batch-size or --num-devices"
            )
        batcher = Batcher.for_data(
            cfg.data.buckets, train.real_lengths(), global_batch, cfg.data.max_len,
            run.steps_per_call, (run.valid_batch_size or run.batch_size) * num_devices,
        )  # fmt: skip
        spe = batcher.steps_per_epoch()
        total = spe * run.epochs if not run.max_steps else min(spe * run.epochs, run.max_steps)
        updates = max(total // cfg.optim.accumulate, 1)
        return cls(n_train, global_batch, spe, total, updates, batcher, cfg.optim.accumulate)

    def describe(self, cfg: Config, num_devices: int) -> str:
        cap = f", capped by --max-steps {cfg.run.max_steps}" if cfg.run.max_steps else ""
        return (
            f"steps: {self.total} ({self.steps_per_epoch} per epoch x {cfg.run.epochs} epochs"
            f"{cap}), global batch {self.global_batch} = {cfg.run.batch_size} per device x "
            f"{num_devices}"
        )


@dataclass
class ResumeState:
    """What a checkpoint carries for the loop to continue where it stopped."""

    step: int = 0
    best: dict[str, Any] = field(
        default_factory=lambda: {"value": -math.inf, "step": None, "bad_evals": 0}
    )


@dataclass
class Job:
    """Everything a run needs besides the framework: config and its resolved spec, data, plan
    and run directory."""

    cfg: Config
    spec: RunSpec
    data: taskdata.TaskData
    plan: Plan
    workdir: Path
    started: float
    monitor: str = ""  # the metric that picks the best checkpoint (`Task.choose_monitor`)

    def __post_init__(self) -> None:
        if not self.monitor:
            valid = self.data.valid
            self.monitor = self.cfg.task.choose_monitor(self.cfg.run.monitor, valid.groups)

    @classmethod
    def load(
        cls,
        cfg: Config,
        spec: RunSpec,
        workdir: Path,
        num_devices: int,
        primary: bool,
        started: float,
    ) -> Job:
        """Loads the tokenizer (process 0 keeps a copy in the run directory for predict and
        export) and the data, and plans the steps. Every process of a multi-process run loads
        the same examples (deterministic) and feeds only its rows of each global batch."""
        tokenizer = load_tokenizer(spec.tokenizer_dir)
        rows = spec.encoder.vocab_size
        if len(tokenizer) > rows:
            raise ConfigError(
                f"tokenizer {spec.tokenizer_dir} has {len(tokenizer)} tokens but the encoder's "
                f"embedding table has {rows} rows: its ids would index past the table; give "
                "the tokenizer of this checkpoint (--tokenizer-dir) or a larger --vocab-size"
            )
        if primary:  # always this run's tokenizer: never one left by an earlier run
            save_tokenizer(tokenizer, workdir / "tokenizer")
        data = taskdata.load_task_data(cfg, tokenizer)
        info = data.info
        log.info(
            "data: %s%s | %d train %s, %d validation (%s)%s",
            info["source"],
            " [DEMO DATA]" if info["demo"] else "",
            info["train_examples"],
            info["unit"],
            info["valid_examples"],
            info["split"],
            " | tokens from cache" if info["token_cache_hit"] else "",
        )
        job = cls(cfg, spec, data, Plan.make(cfg, data.train, num_devices), workdir, started)
        if data.valid.groups:
            log.info("validation by %s; monitoring %s", data.valid.groups.describe(), job.monitor)
        log.info(job.plan.describe(cfg, num_devices))
        log.info(job.plan.batcher.describe())
        return job


# --------------------------------------------------------------------------- the schedule


@dataclass(frozen=True)
class Call:
    """One device call of a run: its training steps and what follows them."""

    epoch: int
    end: int  # steps done after this call
    batches: tuple[Rows, ...]  # one batch of the training examples per step
    log: bool  # fetch the losses, check them, write a metrics line
    evaluate: bool  # evaluate (and save best/latest): eval interval, epoch end, last step
    checkpoint: bool  # save the latest state (--checkpoint-every)


def schedule(plan: Plan, run: RunConfig, start: int) -> Iterator[Call]:
    """The device calls from step `start` to `plan.total`: a pure function of the plan, the
    run settings and the start step.

    A call holds up to --steps-per-call K steps of one sequence length and ends early on a
    logging, evaluation, checkpoint or epoch boundary (the intervals are multiples of K, so
    only epoch ends, the last step and a change of bucket cut a call short). Every run
    evaluates at each epoch end and at its last step; a finished run that is resumed gets one
    call that only evaluates.
    """
    spe, total, batcher = plan.steps_per_epoch, plan.total, plan.batcher
    if start >= total:
        yield Call(max(total - 1, 0) // spe, start, (), log=False, evaluate=True, checkpoint=False)
        return
    step = start
    for epoch in range(start // spe, run.epochs):
        chunk: list[Rows] = []
        for batch in batcher.epoch(epoch, run.seed, step % spe):
            if chunk and batch.length != chunk[-1].length:  # one shape per device call
                yield Call(epoch, step, tuple(chunk), False, False, False)
                chunk = []
            chunk.append(batch)
            step += 1
            checkpoint = bool(run.checkpoint_every and step % run.checkpoint_every == 0)
            evaluate = bool(run.eval_every and step % run.eval_every == 0)
            evaluate = evaluate or step % spe == 0 or step == total
            # a checkpoint step is also a logging step: its losses are checked before saving
            log_now = step % run.log_every == 0 or step == total or checkpoint
            if len(chunk) == run.steps_per_call or log_now or evaluate:
                yield Call(
                    epoch, step, tuple(chunk), log_now, evaluate, checkpoint and step < total
                )
                chunk = []
            if step == total:
                return


def program_inputs(
    job: Job, local_rows: Callable[[int], slice], start: int = 0
) -> tuple[list[list[dict[str, np.ndarray]]], list[dict[str, np.ndarray]]]:
    """One input of each program a run from step `start` uses: a train call (of one batch) of
    each sequence length the schedule uses (one program each, whatever the number of batches
    in a call), and an evaluation batch of each length of the validation set; this process's
    `local_rows` of each. What the train loop precompiles and `preflight --save-programs`
    saves."""
    gb = job.plan.global_batch
    rows = local_rows(gb)
    idx, weight = np.arange(gb)[rows] % len(job.data.train), np.ones(gb, np.float32)[rows]
    batcher, valid = job.plan.batcher, job.data.valid
    every, used = set(batcher.batch_lengths()), []
    for call in schedule(job.plan, job.cfg.run, start):
        if call.batches and call.batches[0].length not in used:
            used.append(call.batches[0].length)
            if len(used) == len(every):
                break
    calls = [[job.data.train.take(idx, weight, n)] for n in used]
    lengths = batcher.eval_batch_lengths(valid.real_lengths())
    egb = batcher.eval_global_batch
    rows = local_rows(egb)
    idx, weight = np.arange(egb)[rows] % len(valid), np.ones(egb, np.float32)[rows]
    return calls, [valid.take(idx, weight, n) for n in lengths]


# --------------------------------------------------------------------------- the driver

VALID_SCORES = "valid_scores.csv"  # the best model's predictions of the validation set


def score_examples(backend: Any, examples: tokenized.Examples, batcher: Batcher, task: Task):
    """Scores every example exactly once across all devices (in the batcher's buckets), then
    computes the metrics on the host over the whole set.
    Returns (metrics, scores of the examples in their order)."""
    outs, batches = [], []
    rows = backend.local_rows(batcher.eval_global_batch)
    for b in batcher.eval_batches(examples.real_lengths()):
        outs.append(backend.eval_batch(examples.take(b.idx[rows], b.weight[rows], b.length)))
        batches.append(b)
    idx = np.concatenate([b.idx for b in batches])
    weight = np.concatenate([b.weight for b in batches])
    scores = np.concatenate([o["score"] for o in outs])
    losses = np.concatenate([o["loss"] for o in outs])
    groups = examples.groups.take(idx)
    result = task.validation_metrics(scores, examples.label[idx], losses, weight, groups)
    real = weight > 0
    ordered = np.empty((len(examples), *scores.shape[1:]), scores.dtype)
    ordered[idx[real]] = scores[real]
    return result, ordered


_END = object()


class Prefetch:
    """Builds the next device calls' inputs on a background thread (host gather, then
    `backend.prepare`: stacking and the transfer to the devices) while the devices run the
    current one, through a bounded queue: torch_xla's ParallelLoader, for both sides.

    `wait_s` adds up the time the loop waited for its input: when it grows, the host does not
    keep up with the devices. Errors on the thread are raised in the loop."""

    def __init__(self, items: Iterator[Any], depth: int = 2) -> None:
        self.wait_s = 0.0
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._work, args=(items,), name="jaxtpu-input", daemon=True
        )
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _work(self, items: Iterator[Any]) -> None:
        try:
            for item in items:
                if not self._put((item, None)):
                    return
            self._put((_END, None))
        except BaseException as e:  # noqa: BLE001 - handed to the loop, raised there
            self._put((_END, e))

    def __iter__(self) -> Iterator[Any]:
        while True:
            t0 = time.perf_counter()
            item, error = self._queue.get()
            self.wait_s += time.perf_counter() - t0
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


class _StopFlag:
    """Set by SIGTERM (what a TPU VM gets before preemption) or a first Ctrl-C (SIGINT): the
    loop saves the latest state at the end of the current call and stops. A second Ctrl-C
    stops at once (KeyboardInterrupt; finished checkpoints are kept)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signal: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopFlag:
        try:
            self._old = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        except ValueError:  # not the main thread
            self._old = {}
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.signal is not None:
            raise KeyboardInterrupt  # the second Ctrl-C
        self.signal = signum
        if signum == signal.SIGINT:
            log.warning(
                "Ctrl-C: saving the latest state after this step (Ctrl-C again to quit now)"
            )

    @property
    def name(self) -> str | None:
        return None if self.signal is None else signal.Signals(self.signal).name

    def requested(self, backend: Backend, call: Call) -> bool:
        """Whether to stop after this call; with several processes all agree, at log calls."""
        if backend.num_processes == 1:
            return self.signal is not None
        return call.log and backend.any_process(self.signal is not None)

    def __exit__(self, *exc: Any) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)


class _Driver:
    """The bookkeeping of one run around the schedule: metrics lines, the best value,
    checkpoints, the progress bar."""

    def __init__(self, job: Job, backend: Backend, resume: ResumeState, runlog: RunLog) -> None:
        self.job, self.backend, self.runlog = job, backend, runlog
        self.cfg, self.task = job.cfg, job.cfg.task
        self.best = resume.best
        self.last_eval: dict[str, Any] = {}
        self.peak = peak_lr(self.cfg.optim, backend.num_devices)
        self.started = time.time()
        self.clock = Clock(peak_flops_per_device(backend.device_kind), backend.num_devices)
        self.lengths = job.data.train.real_lengths()
        self.compile_s: float | None = None
        self.bar = None
        if self.cfg.run.progress and backend.primary:
            from tqdm import tqdm

            self.bar = tqdm(
                total=job.plan.total, initial=resume.step, desc="train", unit="step",
                dynamic_ncols=True,
            )  # fmt: skip

    def meta(self, step: int) -> dict[str, Any]:
        return {**self.job.spec.identity, "step": step, "best": self.best,
                "config": self.cfg.to_dict()}  # fmt: skip

    def save_latest(self, step: int) -> None:
        with self.clock.timing("checkpoint"):
            self.backend.save_latest(step, self.meta(step))

    def check_finite(self, what: str, value: float, step: int) -> None:
        """Never goes on from (or checkpoints) a diverged state."""
        if not np.isfinite(value):
            raise TrainingError(
                f"{what} became {value} at step {step}; stopped. The last good checkpoints are "
                f"kept in {self.job.workdir / 'checkpoints'} (best at step {self.best['step']}); "
                "lower --lr or check the data"
            )

    def precompile(self, start: int) -> None:
        """Has the backend build every program of the run before the first step
        (`program_inputs`)."""
        calls, evals = program_inputs(self.job, self.backend.local_rows, start)
        t0 = time.time()
        with self.clock.timing("compile"):
            built = self.backend.precompile(calls, evals)
        if built:
            seconds = time.time() - t0
            log.info(
                "compiled %d programs (%d train call lengths, %d eval lengths) in %.1fs",
                built, len(calls), len(evals), seconds,
            )  # fmt: skip
            self.runlog.write({"event": "compile", "programs": built, "seconds": seconds})
            self.compile_s = seconds  # no timed first call needed

    def timed_first_call(self, prepared: Any, step: int) -> list[Any]:
        """Runs the first call and waits for it once, to report its compilation apart from
        the steps; returns its handles."""
        t0 = time.time()
        with self.clock.timing("compile"):
            handles = self.backend.train_steps(prepared)
            self.backend.fetch(handles[-1:])
        self.compile_s = time.time() - t0
        what = "compile + run" if self.backend.compile_count() else "nothing compiled"
        log.info("first step (%s): %.1fs", what, self.compile_s)
        self.runlog.write({"event": "compile", "step": step, "seconds": self.compile_s})
        return handles

    def count(self, call: Call) -> None:
        """The work of the call's steps, for the throughput and MFU figures."""
        enc, cpe = self.job.spec.encoder, self.task.comments_per_example
        for b in call.batches:
            self.clock.did(batch_work(
                b.idx, b.weight, b.length or self.cfg.data.max_len, self.lengths, cpe,
                lambda comments, seq: enc.train_flops(comments, seq)[0],
            ))  # fmt: skip

    def log_train(self, host: list[dict[str, float]], call: Call, waited: float) -> None:
        """One metrics line; `waited` is the loop's total wait for input so far."""
        step = call.end
        loss = float(np.mean([h["loss"] for h in host]))
        self.check_finite("loss", loss, step)
        self.clock.waited(waited)
        figures = self.clock.interval()
        share = figures["time_share"]
        update = (step - 1) // self.cfg.optim.accumulate  # the update step `step` fed
        lr = learning_rate(update, self.job.plan.horizon, self.cfg.optim, self.peak)
        # grad_norm is None on accumulation micro-steps of the torch side
        norms = [h["grad_norm"] for h in host if h.get("grad_norm") is not None]
        self.runlog.write(
            {
                "event": "train", "step": step, "epoch": call.epoch, "loss": loss,
                "grad_norm": float(np.mean(norms)) if norms else None, "lr": float(lr),
                **figures, "data_wait_s": share["data_wait"] * figures["wall_s"],
                "data_wait_share": share["data_wait"], "compiles": self.backend.compile_count(),
            }
        )  # fmt: skip
        if self.bar is not None:
            self.bar.set_postfix(progress_postfix(loss, figures), refresh=False)

    def write_valid_scores(self, scores: np.ndarray) -> None:
        """`valid_scores.csv`: the best model's predictions (`Task.predictions`) of every
        validation example, with its row in the training file (`row`, when the validation set
        was split from it) or in the validation file: the out-of-fold predictions of a fold."""
        rows = self.job.data.valid_rows
        rows = np.arange(len(scores)) if rows is None else rows
        preds = self.task.predictions(scores)
        with atomic_write(self.job.workdir / VALID_SCORES, newline="") as f:
            w = csv.writer(f)
            w.writerow(["row", *self.task.score_columns])
            w.writerows([r, *p] for r, p in zip(rows.tolist(), preds.tolist(), strict=True))

    def validate(self, call: Call) -> bool:
        """Evaluates, logs, saves the best and the latest state; True when early stopping
        says stop."""
        t0, step, monitor = time.time(), call.end, self.job.monitor
        with self.clock.timing("eval"):
            result, scores = score_examples(
                self.backend, self.job.data.valid, self.job.plan.batcher, self.task
            )
        self.check_finite("validation loss", result["val_loss"], step)
        value, best = result[monitor], self.best["value"]
        improved = bool(np.isfinite(value)) and (
            best is None
            or not np.isfinite(best)
            or (value > best if higher_is_better(monitor) else value < best)
        )
        if improved:
            self.best.update(value=float(value), step=step, bad_evals=0)
            with self.clock.timing("checkpoint"):
                self.backend.save_best(step, {**self.meta(step), **result})
            if self.backend.primary:
                self.write_valid_scores(scores)
        else:
            self.best["bad_evals"] += 1
        self.save_latest(step)
        self.last_eval = {"step": step, "epoch": call.epoch, **result}
        self.last_eval["eval_seconds"] = time.time() - t0
        self.runlog.write(
            {"event": "eval", **self.last_eval, "best_" + monitor: self.best["value"]}
        )
        log.info(
            "eval @ step %d: val_loss %.4f, %s %.4f%s (%.1fs)", step, result["val_loss"],
            monitor, value, " (best)" if improved else "", time.time() - t0,
        )  # fmt: skip
        patience = self.cfg.run.patience
        return bool(patience and self.best["bad_evals"] >= patience)


def train(
    cfg: Config,
    spec: RunSpec,
    workdir: Path,
    devices: list[Any],
    primary: bool,
    started: float,
    build_backend: Callable[[Job], Backend],
) -> dict[str, Any]:
    """One run, the same on both sides: prepare the data and the plan, have the side build its
    backend (model, optimizer, state on its `devices`), resume if asked, record the config and
    run the schedule.

    Args:
      cfg, spec: the configuration and its resolution (`RunSpec.resolve`).
      workdir: the claimed run directory.
      devices: the run's devices (recorded in config.json).
      primary: whether this process writes the run directory (process 0).
      started: the run's start time (time.time()).
      build_backend: the side's backend for the job.
    Returns:
      The run summary (`run`).
    """
    job = Job.load(cfg, spec, workdir, len(devices), primary, started)
    backend = build_backend(job)
    resume = backend.restore_latest(spec.identity) if cfg.run.resume else ResumeState()
    runlog = RunLog(
        workdir, resume_step=resume.step if cfg.run.resume else None, enabled=primary,
        trackers=parse_trackers(cfg.run.tracker), config=cfg.to_dict(),
    )  # fmt: skip
    runlog.write_config(cfg, spec, job.data.info, devices)
    return run(job, backend, resume, runlog)


def run(job: Job, backend: Backend, resume: ResumeState, runlog: RunLog) -> dict[str, Any]:
    """Trains from `resume.step` to `job.plan.total` as `schedule` says.

    Returns:
      The run summary (also written to summary.json and as the last metrics.jsonl line).
    Raises:
      TrainingError: the loss became NaN/Inf (the last good checkpoints are kept).
    """
    drv = _Driver(job, backend, resume, runlog)
    rows = backend.local_rows(job.plan.global_batch)
    train = job.data.train

    def inputs() -> Iterator[tuple[Call, Any]]:  # runs on the input thread
        for call in schedule(job.plan, job.cfg.run, resume.step):
            host = [train.take(b.idx[rows], b.weight[rows], b.length) for b in call.batches]
            yield call, backend.prepare(host) if host else None

    with _StopFlag() as stop:
        if resume.step < job.plan.total:
            drv.precompile(resume.step)
        # a signal while the programs were built: nothing trained yet. Every process asks
        # (a host-level collective), so all of a multi-process run stop here together.
        if backend.any_process(stop.signal is not None):
            stopped_by = stop.name or "SIGTERM"  # another process's signal
            log.info(
                "%s before the first step: nothing trained, nothing to save; stopped", stopped_by
            )
            step = resume.step
        else:
            step, stopped_by = _steps(drv, inputs(), stop, resume.step)
    if drv.bar is not None:
        drv.bar.close()
    return _finish(drv, step, stopped_by)


class Profile:
    """`--profile-steps A:B`: the backend's profiler traces the device calls that hold steps A
    to B (whole calls: with --steps-per-call K, a little more), into RUN/profile/."""

    def __init__(self, spec: str, workdir: Path, backend: Any) -> None:
        # process 0 only: it alone writes the run directory
        self.range = profile_range(spec) if backend.primary else None
        self.directory = workdir / "profile"
        self.backend, self.active = backend, False

    def before(self, call: Call) -> None:
        if self.range is None or self.active:
            return
        first = call.end - len(call.batches) + 1
        if first <= self.range[1] and call.end >= self.range[0]:
            self.backend.profile_start(self.directory)
            self.active = True

    def after(self, call: Call, pending: list) -> None:
        """Stops after the call that reaches B, once its steps are done."""
        if self.active and self.range and call.end >= self.range[1]:
            self.backend.fetch(pending)  # the trace holds the steps, not only their dispatch
            self.backend.profile_stop()
            self.active = False
            log.info("profile of steps %d-%d written to %s (TensorBoard's profile tab, "
                     "Perfetto)", *self.range, self.directory)  # fmt: skip

    def __enter__(self) -> Profile:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.active:  # the run ended (or stopped) inside the range: keep what was traced
            self.backend.profile_stop()
            self.active = False


def _steps(drv: _Driver, inputs: Iterator[tuple[Call, Any]], stop: _StopFlag, start: int):
    """Runs the device calls of `inputs` from step `start`: the loop body of `run`.
    Returns (the last step done, what stopped the run early or None)."""
    backend, step, stopped_by, pending = drv.backend, start, None, []
    profile = Profile(drv.job.cfg.run.profile_steps, drv.job.workdir, backend)
    with Prefetch(inputs) as feed, profile:
        for call, prepared in feed:
            if call.batches:
                profile.before(call)
                if drv.compile_s is None:  # the first call compiles, unless precompiled
                    pending += drv.timed_first_call(prepared, call.end)
                else:
                    pending += backend.train_steps(prepared)
                drv.count(call)
                profile.after(call, pending)
            step = call.end
            if call.log:  # the only device sync between evaluations
                drv.log_train(backend.fetch(pending), call, feed.wait_s)
                pending = []
            if drv.bar is not None:
                drv.bar.update(len(call.batches))
            if call.evaluate and drv.validate(call):
                return step, "early stopping"
            if stop.requested(backend, call):
                stopped_by = stop.name or "SIGTERM"  # another process's signal
                backend.fetch(pending)
                drv.save_latest(step)
                log.info(
                    "%s: saved the latest state at step %d; continue with --resume",
                    stopped_by,
                    step,
                )
                return step, stopped_by
            if call.checkpoint and not call.evaluate:  # an evaluation saved it already
                drv.save_latest(step)  # its loss was checked when logged
    return step, stopped_by


def _finish(drv: _Driver, step: int, stopped_by: str | None) -> dict[str, Any]:
    job, backend, monitor = drv.job, drv.backend, drv.job.monitor
    run_cfg = job.cfg.run
    summary = {
        "framework": backend.name,
        "task": run_cfg.task,
        "steps": step,
        "total_steps": job.plan.total,
        "stopped_by": stopped_by,
        "final": drv.last_eval,
        "monitor": monitor,
        "best": drv.best,
        "compile_seconds": drv.compile_s,
        "wall_seconds": time.time() - job.started,
        "setup_seconds": drv.started - job.started,  # data, model, state: before the loop
        "loop": drv.clock.totals(),  # its wall time's shares, throughput and MFU
        "devices": backend.num_devices,
        "parallel": run_cfg.parallel,
        "precision": run_cfg.precision,
        "train_compiles": backend.compile_count(),
        "device_memory_mb": backend.device_memory_mb(),
        "workdir": str(job.workdir),
    }
    drv.runlog.finish(summary)
    log.info(
        "done: %d steps in %.0fs; final %s %.4f, best %.4f at step %s; run dir %s",
        step,
        summary["wall_seconds"],
        monitor,
        drv.last_eval.get(monitor, float("nan")),
        drv.best["value"],
        drv.best["step"],
        job.workdir,
    )
    return summary
