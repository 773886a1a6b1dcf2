"""The training loop both sides share: step order, logging interval, evaluation, checkpoints,
early stopping, NaN detection, SIGTERM, progress bar, run directory records.

Framework-free. Each side supplies a `Backend` (JAX: `jaxtpu.train.JaxBackend`; torch_xla:
`torchxla_ref.train.XlaBackend`) that owns the model state on its devices; the loop only ever
hands it numpy batches from `jaxtpu.data` and asks for host numbers at the logging interval.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from jaxtpu import data as D
from jaxtpu import metrics as M
from jaxtpu.config import Config, UserError
from jaxtpu.run_io import RunLog
from jaxtpu.schedules import learning_rate, peak_lr

log = logging.getLogger("jaxtpu")


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. the loss became NaN); finished work is kept."""


class Backend(Protocol):
    """What a framework provides to the loop."""

    name: str
    num_devices: int  # global, over all processes
    num_processes: int
    primary: bool  # process 0: the one that writes the run directory

    def local_rows(self, n: int) -> slice:
        """The rows of an n-row global batch this process feeds (all of them with one)."""

    def any_process(self, flag: bool) -> bool:
        """True on every process when `flag` is True on any (a host-level collective)."""

    def compile_count(self) -> int:
        """How many times the train step was compiled so far (1 after warm-up)."""

    def train_steps(self, batches: list[dict[str, np.ndarray]]) -> list[Any]:
        """Runs the steps of these consecutive batches asynchronously (one device call on the
        JAX side, see --steps-per-call); returns handles on their device-side metrics."""

    def fetch(self, handles: list[Any]) -> list[dict[str, float]]:
        """Host values of the handles' metrics ('loss', 'grad_norm'), one dict per step: one
        device sync."""

    def eval_batch(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Per-example 'score' and 'loss' of the global batch whose local rows are `batch`,
        on the host of every process."""

    def save_latest(self, step: int, meta: dict[str, Any]) -> None: ...

    def save_best(self, step: int, meta: dict[str, Any]) -> None: ...


@dataclass
class Plan:
    """How many steps a run takes, derived once from the config and the data size."""

    global_batch: int
    steps_per_epoch: int
    total: int
    total_updates: int

    @classmethod
    def make(cls, cfg: Config, n_train: int, num_devices: int, unit: str) -> Plan:
        run = cfg.run
        global_batch = run.batch_size * num_devices
        spe = D.steps_per_epoch(n_train, global_batch)
        if spe == 0:
            raise UserError(
                f"--batch-size {run.batch_size} x {num_devices} devices = global batch "
                f"{global_batch} is larger than the {n_train} training {unit}; use a smaller "
                "--batch-size or --num-devices"
            )
        total = spe * run.epochs if not run.max_steps else min(spe * run.epochs, run.max_steps)
        return cls(global_batch, spe, total, max(total // cfg.optim.accumulate, 1))

    def describe(self, cfg: Config, num_devices: int) -> str:
        cap = f", capped by --max-steps {cfg.run.max_steps}" if cfg.run.max_steps else ""
        return (
            f"steps: {self.total} ({self.steps_per_epoch} per epoch x {cfg.run.epochs} epochs"
            f"{cap}), global batch {self.global_batch} = {cfg.run.batch_size} per device x "
            f"{num_devices}"
        )


@dataclass
class Progress:
    """What a checkpoint must carry for the loop to resume where it stopped."""

    step: int = 0
    best: dict[str, Any] = field(
        default_factory=lambda: {"value": -math.inf, "step": None, "bad_evals": 0}
    )


def load_data(cfg: Config, workdir: Path, save_tokenizer: bool = True) -> D.TaskData:
    """Tokenizer (a copy is kept in the run directory for predict/export) and the task data.

    Every process of a multi-process run loads the same examples (deterministic), and feeds
    only its rows of each global batch."""
    from jaxtpu.config import tokenizer_dir

    tokenizer = D.load_tokenizer(tokenizer_dir(cfg))
    if save_tokenizer and not (workdir / "tokenizer").exists():
        tokenizer.save_pretrained(str(workdir / "tokenizer"))
    data = D.load_task_data(cfg, tokenizer)
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
    return data


def evaluate(backend: Any, examples: D.Examples, global_batch: int, task: str):
    """Scores every example exactly once across all devices, then computes the metrics on the
    host over the whole set. Returns (metrics, scores of the real rows in order)."""
    outs, weights = [], []
    rows = backend.local_rows(global_batch)
    for idx, weight in D.eval_batches(len(examples), global_batch):
        outs.append(backend.eval_batch(examples.take(idx[rows], weight[rows])))
        weights.append(weight)
    weight = np.concatenate(weights)
    scores = np.concatenate([o["score"] for o in outs])
    losses = np.concatenate([o["loss"] for o in outs])
    labels = np.concatenate([examples.label, np.zeros(len(weight) - len(examples), np.float32)])
    return M.evaluate(task, scores, labels, losses, weight), scores[weight > 0]


class _StopFlag:
    """Set by SIGTERM (what a TPU VM gets before preemption): checkpoint, then exit cleanly."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._old: Any = None

    def __enter__(self) -> _StopFlag:
        try:
            self._old = signal.signal(signal.SIGTERM, self._handle)
        except ValueError:  # not the main thread
            self._old = None
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signal = signum

    def __exit__(self, *exc: Any) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


def run(
    cfg: Config,
    data: D.TaskData,
    plan: Plan,
    backend: Backend,
    workdir: Path,
    progress: Progress,
    identity: dict[str, Any],
    runlog: RunLog,
    started: float,
) -> dict[str, Any]:
    """Trains from `progress.step` to `plan.total`, evaluating and checkpointing on the way.

    Returns:
      The run summary (also written to summary.json and as the last metrics.jsonl line).
    Raises:
      TrainingError: the loss became NaN/Inf (the last good checkpoints are kept).
    """
    run_cfg, task = cfg.run, cfg.run.task
    monitor = M.MONITOR[task]
    best = progress.best
    peak = peak_lr(cfg.optim, backend.num_devices)
    gb, spe, total = plan.global_batch, plan.steps_per_epoch, plan.total
    last_eval: dict[str, Any] = {}

    def meta(step: int) -> dict[str, Any]:
        return {**identity, "step": step, "best": best, "config": cfg.to_dict()}

    def run_eval(step: int, epoch: int) -> bool:
        """Evaluates, logs, checkpoints; returns True when early stopping says stop."""
        nonlocal last_eval
        t0 = time.time()
        result, _ = evaluate(backend, data.valid, gb, task)
        if not np.isfinite(result["val_loss"]):  # never checkpoint a diverged state
            raise TrainingError(
                f"validation loss became {result['val_loss']} at step {step}; stopped. The last "
                f"good checkpoints are kept in {workdir / 'checkpoints'} (best at step "
                f"{best['step']}); lower --lr or check the data"
            )
        value = result[monitor]
        improved = bool(np.isfinite(value) and value > best["value"])
        if improved:
            best.update(value=float(value), step=step, bad_evals=0)
            backend.save_best(step, {**meta(step), **result})
        else:
            best["bad_evals"] += 1
        backend.save_latest(step, meta(step))
        last_eval = {"step": step, "epoch": epoch, **result, "eval_seconds": time.time() - t0}
        runlog.write({"event": "eval", **last_eval, "best_" + monitor: best["value"]})
        log.info(
            "eval @ step %d: val_loss %.4f, %s %.4f%s (%.1fs)",
            step,
            result["val_loss"],
            monitor,
            value,
            " (best)" if improved else "",
            time.time() - t0,
        )
        return bool(run_cfg.patience and best["bad_evals"] >= run_cfg.patience)

    bar = None
    if run_cfg.progress and backend.primary:
        from tqdm import tqdm

        bar = tqdm(
            total=total, initial=progress.step, desc="train", unit="step", dynamic_ncols=True
        )
    pending: list[Any] = []
    step = progress.step
    t_log, step_log = time.time(), step
    compile_s: float | None = None
    stopped_by = None
    epoch = step // spe
    rows = backend.local_rows(gb)
    with _StopFlag() as stop:
        for epoch in range(step // spe, run_cfg.epochs):
            chunk: list[np.ndarray] = []
            for idx in D.train_batches(len(data.train), gb, run_cfg.seed, epoch, step % spe):
                if step >= total:
                    break
                chunk.append(idx)
                step += 1
                every = run_cfg.checkpoint_every
                checkpoint_step = bool(every and step % every == 0)
                log_step = step % run_cfg.log_every == 0 or step == total or checkpoint_step
                eval_step = bool(run_cfg.eval_every and step % run_cfg.eval_every == 0)
                if len(chunk) < run_cfg.steps_per_call and not (
                    log_step or eval_step or step % spe == 0
                ):
                    continue  # --steps-per-call: gather K batches for one device call
                pending += backend.train_steps([data.train.take(i[rows]) for i in chunk])
                done, chunk = len(chunk), []
                if compile_s is None:
                    backend.fetch(pending[-1:])  # wait once, to time compilation apart
                    compile_s = time.time() - t_log
                    log.info("first step (compile + run): %.1fs", compile_s)
                    t_log, step_log = time.time(), step
                    runlog.write({"event": "compile", "step": step, "seconds": compile_s})
                # a checkpoint step is also a logging step: its losses are checked before saving
                if log_step:
                    host = backend.fetch(pending)  # the only sync between evaluations
                    pending = []
                    loss = float(np.mean([h["loss"] for h in host]))
                    if not np.isfinite(loss):
                        raise TrainingError(
                            f"loss became {loss} at step {step}; stopped. The last good "
                            f"checkpoints are kept in {workdir / 'checkpoints'} (best at step "
                            f"{best['step']}); lower --lr or check the data"
                        )
                    dt = max(time.time() - t_log, 1e-9)
                    rate = (step - step_log) * gb / dt if step > step_log else 0.0
                    t_log, step_log = time.time(), step
                    update = step // cfg.optim.accumulate
                    lr = float(learning_rate(update, plan.total_updates, cfg.optim, peak))
                    # grad_norm is None on accumulation micro-steps of the torch side
                    norms = [h["grad_norm"] for h in host if h.get("grad_norm") is not None]
                    runlog.write(
                        {
                            "event": "train",
                            "step": step,
                            "epoch": epoch,
                            "loss": loss,
                            "grad_norm": float(np.mean(norms)) if norms else None,
                            "lr": lr,
                            "examples_per_s": rate,
                            "compiles": backend.compile_count(),
                        }
                    )
                    if bar is not None:
                        bar.set_postfix(loss=f"{loss:.4f}", ex_s=f"{rate:.1f}", refresh=False)
                if bar is not None:
                    bar.update(done)
                if eval_step and step < total:
                    if run_eval(step, epoch):
                        stopped_by = "early stopping"
                        break
                signalled = stop.signal is not None
                if backend.num_processes > 1:  # all processes must stop at the same step
                    signalled = step % run_cfg.log_every == 0 and backend.any_process(signalled)
                if signalled:
                    stopped_by = "SIGTERM"
                    break
                if checkpoint_step and step < total:  # its loss was checked when logged
                    backend.save_latest(step, meta(step))
            if stopped_by or step >= total:
                break
            if not last_eval or last_eval["step"] != step:
                if run_eval(step, epoch):
                    stopped_by = "early stopping"
                    break
        if bar is not None:
            bar.close()
        if stopped_by == "SIGTERM":
            backend.fetch(pending)
            backend.save_latest(step, meta(step))
            log.info("SIGTERM: saved the latest state at step %d; continue with --resume", step)
        elif not last_eval or last_eval["step"] != step:
            run_eval(step, epoch)

    summary = {
        "framework": backend.name,
        "task": task,
        "steps": step,
        "total_steps": total,
        "stopped_by": stopped_by,
        "final": last_eval,
        "monitor": monitor,
        "best": best,
        "compile_seconds": compile_s,
        "wall_seconds": time.time() - started,
        "devices": backend.num_devices,
        "parallel": run_cfg.parallel,
        "precision": run_cfg.precision,
        "train_compiles": backend.compile_count(),
        "device_memory_mb": getattr(backend, "device_memory_mb", lambda: None)(),
        "workdir": str(workdir),
    }
    runlog.finish(summary)
    log.info(
        "done: %d steps in %.0fs; final %s %.4f, best %.4f at step %s; run dir %s",
        step,
        summary["wall_seconds"],
        monitor,
        last_eval.get(monitor, float("nan")),
        best["value"],
        best["step"],
        workdir,
    )
    return summary
