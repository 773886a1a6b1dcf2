"""The training loop both sides share: `train` has the side build its backend and runs the
`schedule` of `jaxtpu.core.run.plan` with a short driver (logging, evaluation, best and latest
checkpoints, early stopping, NaN detection, stopping on a signal, progress).

Framework-free: the loop only ever hands the backend (`jaxtpu.core.run.protocol.Backend`) numpy
batches from `jaxtpu.core.data` and asks it for host numbers at the logging interval.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from jaxtpu.core import calibration, metrics
from jaxtpu.core.data import perspective, tokenized
from jaxtpu.core.data.buckets import Batcher
from jaxtpu.core.errors import TrainingError
from jaxtpu.core.files import atomic_write
from jaxtpu.core.flags.schema import checkpoint_interval
from jaxtpu.core.flags.values import parse_trackers
from jaxtpu.core.hardware import peak_flops_per_device
from jaxtpu.core.run.plan import Call, Job, program_inputs, schedule
from jaxtpu.core.run.prefetch import Prefetch
from jaxtpu.core.run.profile import Profile
from jaxtpu.core.run.protocol import Backend, ResumeState
from jaxtpu.core.run.rundir import RunLog
from jaxtpu.core.run.signals import StopFlag
from jaxtpu.core.run.timing import Clock, batch_work, progress_postfix
from jaxtpu.core.schedules import learning_rate, peak_lr
from jaxtpu.core.tasks import Task, higher_is_better

log = logging.getLogger("jaxtpu")


VALID_SCORES = "valid_scores.csv"  # the best model's predictions of the validation set


def score_examples(
    backend: Any,
    examples: tokenized.Examples,
    batcher: Batcher,
    task: Task,
    with_metrics: bool = True,
    extra: tuple[str, ...] = (),
):
    """Scores every example exactly once across all devices (in the batcher's buckets), then
    computes the metrics on the host over the whole set (unless `with_metrics` is off: texts
    scored without labels); examples with row weights (--weighted-val-loss) weigh the loss by
    them, never the other metrics.
    Returns (metrics, scores of the examples in their order), then each of the eval step's
    `extra` outputs in the examples' order (a scorer's pooled vectors)."""
    outs, batches = [], []
    rows = backend.local_rows(batcher.eval_global_batch)
    for b in batcher.eval_batches(examples.real_lengths()):
        outs.append(backend.eval_batch(examples.take(b.idx[rows], b.weight[rows], b.length)))
        batches.append(b)
    idx = np.concatenate([b.idx for b in batches])
    weight = np.concatenate([b.weight for b in batches])
    scores = np.concatenate([o["score"] for o in outs])
    losses = np.concatenate([o["loss"] for o in outs])
    result: dict[str, float] = {}
    if with_metrics:
        groups = examples.groups.take(idx)
        result = task.validation_metrics(scores, examples.label[idx], losses, weight, groups)
    if with_metrics and examples.row_weights is not None:
        result["val_loss"] = metrics.weighted_mean(losses, weight * examples.row_weights[idx])
    real = weight > 0

    def in_order(values: np.ndarray) -> np.ndarray:
        ordered = np.empty((len(examples), *values.shape[1:]), values.dtype)
        ordered[idx[real]] = values[real]
        return ordered

    more = [in_order(np.concatenate([o[k] for o in outs])) for k in extra]
    return (result, in_order(scores), *more)


@dataclass
class Setup:
    """What a run had to make before its first step, which a resumed run reports: on a
    fresh machine (a spot VM's replacement) the tokens and compiled programs are rebuilt,
    the state comes from the run directory (a bucket)."""

    data_s: float = 0.0  # reading and tokenizing the data (`Job.load`)
    tokens_cached: bool = True  # every example's tokens came from the token cache
    compile_cache_empty: bool = False  # JAX's persistent compilation cache had no entry
    restore_s: float = 0.0  # reading the latest checkpoint


class _Driver:
    """The bookkeeping of one run around the schedule: metrics lines, the best value,
    checkpoints, the progress bar."""

    def __init__(
        self,
        job: Job,
        backend: Backend,
        resume: ResumeState,
        runlog: RunLog,
        setup: Setup | None = None,
    ) -> None:
        self.job, self.backend, self.runlog = job, backend, runlog
        self.setup, self.start_step = setup, resume.step
        self.skipped = resume.skipped  # fp16: steps skipped for non-finite gradients
        self.cfg, self.task = job.cfg, job.cfg.task
        self.best = resume.best
        self.last_eval: dict[str, Any] = {}
        self.peak = peak_lr(self.cfg.optim, backend.num_devices)
        self.started = time.time()
        self.clock = Clock(peak_flops_per_device(backend.device_kind), backend.num_devices)
        self.lengths = job.data.train.real_lengths()
        self.compile_s: float | None = None
        self.every_s = checkpoint_interval(self.cfg.output.checkpoint_every)[1]
        self.last_save = time.time()  # for a --checkpoint-every time interval
        self.saved = resume.step  # the step of the latest state saved (0: none)
        self.bar = None
        if self.cfg.output.progress and backend.primary:
            from tqdm import tqdm

            self.bar = tqdm(
                total=job.plan.total,
                initial=resume.step,
                desc="train",
                unit="step",
                dynamic_ncols=True,
            )

    def meta(self, step: int) -> dict[str, Any]:
        return {
            **self.job.spec.model_key,
            "step": step,
            "best": self.best,
            "skipped_steps": self.skipped,
            "config": self.cfg.to_dict(),
        }

    def save_latest(self, step: int) -> None:
        """Publishes the run directory (a bucket run: what the run wrote since), then saves
        the latest state: in that order, the bucket holds every metrics line a committed
        checkpoint covers even when the run dies the moment after the commit (a resume drops
        the lines of steps after the checkpoint it resumes from)."""
        self.job.check()  # never write a run directory another run took over
        with self.clock.timing("checkpoint"):
            if self.backend.primary:
                self.job.publish()
            self.backend.save_latest(step, self.meta(step))
        self.last_save, self.saved = time.time(), step

    def save_due(self, call: Call) -> bool:
        """Whether a --checkpoint-every time interval has passed since the last save, decided
        at logging calls (their losses are checked; with several processes all agree)."""
        if not self.every_s or not call.log or call.evaluate or call.checkpoint:
            return False
        return self.backend.any_process(time.time() - self.last_save >= self.every_s)

    def check_finite(self, what: str, value: float, step: int) -> None:
        """Never goes on from (or checkpoints) a diverged state."""
        if not np.isfinite(value):
            best = self.best["step"]
            kept = (
                f"The last good checkpoints are kept in {self.job.rundir}/checkpoints (latest "
                f"at step {self.saved}" + (f", best at step {best})" if best is not None else ")")
                if self.saved
                else f"No model was saved before it: {self.job.rundir} keeps only the run's "
                "config and metrics (remove it, or choose another --workdir, to start again)"
            )
            raise TrainingError(
                f"{what} became {value} at step {step}; stopped. {kept}; lower --lr or check "
                "the data"
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
                built,
                len(calls),
                len(evals),
                seconds,
            )
            self.runlog.write({"event": "compile", "programs": built, "seconds": seconds})
            self.compile_s = seconds  # no timed first call needed
            self.report_setup()

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
        self.report_setup()
        return handles

    def report_setup(self) -> None:
        """A resumed run says what it rebuilt before going on and how long that took (one
        log line and a metrics line)."""
        s = self.setup
        if s is None or not self.cfg.output.resume or not self.start_step:
            return
        tokens = "read from the token cache" if s.tokens_cached else "rebuilt (none cached here)"
        programs = "compiled (compilation cache empty here)" if s.compile_cache_empty else "built"
        log.info(
            "resumed at step %d: data and tokens %s in %.1fs, programs %s in %.1fs, state "
            "restored from %s in %.1fs",
            self.start_step,
            tokens,
            s.data_s,
            programs,
            self.compile_s or 0.0,
            self.job.rundir,
            s.restore_s,
        )
        self.runlog.write(
            {
                "event": "resume",
                "step": self.start_step,
                "data_s": s.data_s,
                "tokens_rebuilt": not s.tokens_cached,
                "compile_s": self.compile_s,
                "compile_cache_empty": s.compile_cache_empty,
                "restore_s": s.restore_s,
            }
        )

    def count(self, call: Call) -> None:
        """The work of the call's steps, for the throughput and MFU figures."""
        enc, cpe = self.job.spec.encoder, self.task.comments_per_example
        for b in call.batches:
            self.clock.did(
                batch_work(
                    b.idx,
                    b.weight,
                    b.length or self.cfg.data.max_len,
                    self.lengths,
                    cpe,
                    lambda comments, seq: enc.train_flops(comments, seq)[0],
                )
            )

    def log_train(self, host: list[dict[str, float]], call: Call, waited: float) -> None:
        """One metrics line; `waited` is the loop's total wait for input so far."""
        step = call.end
        loss = float(np.mean([h["loss"] for h in host]))
        self.check_finite("loss", loss, step)
        self.clock.waited(waited)
        figures = self.clock.interval()
        share = figures["time_share"]
        scaling = self.loss_scaling(host, step)
        # the update step `step` fed (a skipped step did not advance the schedule)
        update = (step - 1) // self.cfg.optim.accumulate - self.skipped
        lr = learning_rate(update, self.job.plan.horizon, self.cfg.optim, self.peak)
        # grad_norm is None on accumulation micro-steps of the torch side, and not a norm
        # of a skipped step's
        norms = [
            h["grad_norm"] for h in host if h.get("grad_norm") is not None and not h.get("skipped")
        ]
        self.runlog.write(
            {
                "event": "train",
                "step": step,
                "epoch": call.epoch,
                "loss": loss,
                "grad_norm": float(np.mean(norms)) if norms else None,
                "lr": float(lr),
                **scaling,
                **figures,
                "data_wait_s": share["data_wait"] * figures["wall_s"],
                "data_wait_share": share["data_wait"],
                "compiles": self.backend.compile_count(),
            }
        )
        if self.bar is not None:
            self.bar.set_postfix(progress_postfix(loss, figures), refresh=False)

    def loss_scaling(self, host: list[dict[str, float]], step: int) -> dict[str, Any]:
        """A --precision fp16 run's loss scaling over the steps of `host` (up to `step`), for
        its metrics line: the scale of the last step, the steps skipped (their gradients
        were not finite) in the interval and in the run so far; {} for other runs. A
        skipped step is also a log line."""
        if not host or "loss_scale" not in host[0]:
            return {}
        skipped = int(sum(h["skipped"] for h in host))
        self.skipped += skipped
        if skipped:
            log.info(
                "step %d: %d of the last %d steps skipped (an inf/NaN gradient at loss scale "
                "%g); the scale is halved each time, %d skipped in the run",
                step,
                skipped,
                len(host),
                max(h["loss_scale"] for h in host if h["skipped"]),
                self.skipped,
            )
        scale = host[-1]["loss_scale"]
        return {"loss_scale": scale, "skipped": skipped, "skipped_steps": self.skipped}

    def write_valid_scores(self, scores: np.ndarray) -> None:
        """`valid_scores.csv`: the best model's predictions (`Task.predictions`) of every
        validation example, with its row in the training file (`row`, when the validation set
        was split from it) or in the validation file: the out-of-fold predictions of a fold."""
        rows = self.job.data.valid_rows
        rows = np.arange(len(scores)) if rows is None else rows
        preds = self.task.predictions(scores)
        with atomic_write(self.job.workdir / VALID_SCORES, newline="") as f:
            w = csv.writer(f)
            w.writerow(["row", *self.task.score_columns()])
            w.writerows([r, *p] for r, p in zip(rows.tolist(), preds.tolist(), strict=True))

    def write_calibration(self, scores: np.ndarray) -> None:
        """`calibration.json`: per-output Platt scaling fitted on the best model's validation
        outputs (`jaxtpu.core.calibration`); a ranker's scores are not probabilities: none."""
        if self.task.comments_per_example == 2:
            return
        labels, columns = self.job.data.valid.label, self.task.score_columns(True)
        try:
            cal = calibration.fit(scores, labels, columns)
        except ValueError as e:  # outputs and labels of other shapes: scores stay uncalibrated
            log.warning("calibration not fitted (%s); this run scores uncalibrated", e)
            return
        if self.cfg.train.perspective:  # its learnt attributes onto Perspective's scale
            cal = perspective.on_scale(cal, scores, labels, self.cfg.data.valid_csv)
        calibration.write(self.job.workdir, cal)

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
            self.job.check()
            with self.clock.timing("checkpoint"):
                self.backend.save_best(step, {**self.meta(step), **result})
            if self.backend.primary:
                self.write_valid_scores(scores)
                self.write_calibration(scores)
        else:
            self.best["bad_evals"] += 1
        self.save_latest(step)
        self.last_eval = {"step": step, "epoch": call.epoch, **result}
        self.last_eval["eval_seconds"] = time.time() - t0
        self.runlog.write(
            {"event": "eval", **self.last_eval, "best_" + monitor: self.best["value"]}
        )
        log.info(
            "eval @ step %d: val_loss %.4f, %s %.4f%s (%.1fs)",
            step,
            result["val_loss"],
            monitor,
            value,
            " (best)" if improved else "",
            time.time() - t0,
        )
        patience = self.cfg.train.patience
        return bool(patience and self.best["bad_evals"] >= patience)


def train(
    job: Job,
    backend: Backend,
    resume: ResumeState,
    devices: list[Any],
    early: StopFlag | None = None,
    setup: Setup | None = None,
) -> dict[str, Any]:
    """One run, the same on both sides, once the side has built its backend, resumed it (if
    asked) and started it: record the config in the run directory and run the schedule.

    Args:
      job: the config, its resolution, the data and the plan (`Job.load`).
      backend: the side's started backend.
      resume: where it resumed (`Backend.restore_latest`), or a fresh start.
      devices: the run's devices (recorded in config.json).
      early: the side's `signals.early` flag, held since the run started (a SIGTERM that
        came while the data, model and programs were made stops the run before its first
        step).
      setup: what the run made before its first step (a resumed run reports it).
    Returns:
      The run summary (`run`).
    """
    cfg = job.cfg
    runlog = RunLog(
        job.workdir,
        resume_step=resume.step if cfg.output.resume else None,
        enabled=backend.primary,
        trackers=parse_trackers(cfg.output.tracker),
        config=cfg.to_dict(),
    )
    runlog.write_config(cfg, job.spec, job.data.info, devices)
    return run(job, backend, resume, runlog, early, setup)


def run(
    job: Job,
    backend: Backend,
    resume: ResumeState,
    runlog: RunLog,
    early: StopFlag | None = None,
    setup: Setup | None = None,
) -> dict[str, Any]:
    """Trains from `resume.step` to `job.plan.total` as `schedule` says.

    Returns:
      The run summary (also written to summary.json and as the last metrics.jsonl line).
    Raises:
      TrainingError: the loss became NaN/Inf (the last good checkpoints are kept).
    """
    drv = _Driver(job, backend, resume, runlog, setup)
    rows = backend.local_rows(job.plan.global_batch)
    train = job.data.train

    def inputs() -> Iterator[tuple[Call, Any]]:  # runs on the input thread
        for call in schedule(job.plan, job.cfg, resume.step):
            host = [train.take(b.idx[rows], b.weight[rows], b.length) for b in call.batches]
            yield call, backend.prepare(host) if host else None

    try:
        with StopFlag(pending=early) as stop:
            if resume.step < job.plan.total and stop.signal is None:
                drv.precompile(resume.step)
            # a signal while the programs were built: nothing trained yet. Every process asks
            # (a host-level collective), so all of a multi-process run stop here together.
            if backend.any_process(stop.signal is not None):
                stopped_by = stop.name or "SIGTERM"  # another process's signal
                log.info(
                    "%s before the first step: nothing trained, nothing to save; stopped",
                    stopped_by,
                )
                step = resume.step
            else:
                step, stopped_by = _steps(drv, inputs(), stop, resume.step)
    except BaseException:
        _wind_down(backend, runlog)
        raise
    if drv.bar is not None:
        drv.bar.close()
    with drv.clock.timing("checkpoint"):  # saves still being written (--async-checkpoint)
        backend.wait_for_checkpoints()
    return _finish(drv, step, stopped_by)


def _wind_down(backend: Backend, runlog: RunLog) -> None:
    """The run ends on an error (a bad batch, a NaN loss, a save that failed, Ctrl-C): the
    saves still being written (--async-checkpoint) finish, so that no finished work is lost,
    and the run log and its trackers close while the interpreter can still run their threads
    (left to its shutdown, they print tracebacks under the one line that says why the run
    ended). A save that fails now is not reported: the run's own error is."""
    with contextlib.suppress(Exception):
        backend.wait_for_checkpoints()
    with contextlib.suppress(Exception):
        runlog.close()


def _steps(drv: _Driver, inputs: Iterator[tuple[Call, Any]], stop: StopFlag, start: int):
    """Runs the device calls of `inputs` from step `start`: the loop body of `run`.
    Returns (the last step done, what stopped the run early or None)."""
    backend, step, stopped_by, pending = drv.backend, start, None, []
    job = drv.job
    profile = Profile(job.cfg.output.profile_steps, job.workdir, backend, start, job.plan.total)
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
                drv.loss_scaling(backend.fetch(pending), step)  # its skipped steps counted
                drv.save_latest(step)
                log.info(
                    "%s: saved the latest state at step %d; continue with --resume",
                    stopped_by,
                    step,
                )
                return step, stopped_by
            # (an evaluation saved it already; its loss was checked when logged)
            if (call.checkpoint and not call.evaluate) or drv.save_due(call):
                drv.save_latest(step)
    return step, stopped_by


def _finish(drv: _Driver, step: int, stopped_by: str | None) -> dict[str, Any]:
    job, backend, monitor = drv.job, drv.backend, drv.job.monitor
    summary = {
        "framework": backend.name,
        "task": job.cfg.train.task,
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
        "parallel": job.cfg.placement.parallel,
        "precision": job.cfg.train.precision,
        **({"skipped_steps": drv.skipped} if job.cfg.train.precision == "fp16" else {}),
        "train_compiles": backend.compile_count(),
        "device_memory_mb": backend.device_memory_mb(),
        "workdir": job.rundir,
    }
    drv.runlog.finish(summary)
    if drv.best["step"] is None:  # never evaluated (stopped before its first evaluation)
        log.info(
            "done: %d steps in %.0fs; no evaluation yet, no best model; run dir %s",
            step,
            summary["wall_seconds"],
            job.rundir,
        )
        return summary
    log.info(
        "done: %d steps in %.0fs; final %s %.4f, best %.4f at step %s; run dir %s",
        step,
        summary["wall_seconds"],
        monitor,
        drv.last_eval.get(monitor, float("nan")),
        drv.best["value"],
        drv.best["step"],
        job.rundir,
    )
    cal = calibration.read(job.workdir) if backend.primary else None
    if cal is not None:
        log.info("calibration of the best model (%s): %s", calibration.FILE, cal.describe())
    return summary
