"""`python -m jaxtpu.train`: fine-tune a BERT toxicity classifier or ranker on N devices.

`main()` only parses flags; `train_and_evaluate(cfg, workdir)` does the work (tests call it).
"""

from __future__ import annotations

import logging
import math
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu import config as C
from jaxtpu import data as D
from jaxtpu import metrics as M
from jaxtpu.run_io import RunLog, UserError, prepare_workdir, user_errors
from jaxtpu.schedules import learning_rate, peak_lr

log = logging.getLogger("jaxtpu")


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. the loss became NaN); finished work is kept."""


@dataclass
class Model:
    """A model, its encoder shape and freshly initialised or pretrained fp32 params."""

    module: Any
    encoder: C.EncoderConfig
    params: Any
    kept: list[str]

    def identity(self, task: str) -> dict[str, Any]:
        return {"task": task, "encoder": self.encoder.to_hf_dict()}


def build_model(cfg: C.Config, max_len: int) -> Model:
    """The task's model with params from --model-dir (pretrained) or a seeded random init."""
    import jax

    from jaxtpu import models, weights

    enc = C.encoder_config(cfg)
    module = models.build_model(cfg.run.task, enc, cfg.head_dropout, cfg.run.precision)
    shape = (1, 2, max_len) if cfg.run.task == "ranking" else (1, max_len)
    dummy = np.zeros(shape, np.int32)
    init = jax.jit(lambda key: module.init(key, dummy, dummy)["params"])
    params = jax.device_get(init(jax.random.key(cfg.run.seed)))
    kept: list[str] = []
    model_dir = C.resolve_model_dir(cfg.model.model_dir)
    if model_dir:
        params, kept = weights.load_params(model_dir, params)
    return Model(module, enc, params, kept)


def evaluate(strategy: Any, state: Any, examples: D.Examples, global_batch: int, task: str):
    """Scores every validation example exactly once across all devices, then computes the
    metrics on the host over the whole set."""
    outs, idxs, weights = [], [], []
    for idx, weight in D.eval_batches(len(examples), global_batch):
        outs.append(strategy.eval_step(state, strategy.put_batch(examples.take(idx, weight))))
        idxs.append(idx)
        weights.append(weight)
    idx, weight = np.concatenate(idxs), np.concatenate(weights)
    scores = np.concatenate([o["score"] for o in outs])
    losses = np.concatenate([o["loss"] for o in outs])
    return M.evaluate(task, scores, examples.label[idx], losses, weight), scores[weight > 0]


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


def train_and_evaluate(cfg: C.Config, workdir: str | Path | None = None) -> dict[str, Any]:
    """Trains and evaluates as `cfg` says, writing everything to `workdir`.

    Args:
      cfg: the resolved configuration.
      workdir: run directory (default: cfg.run.workdir).
    Returns:
      A summary: final validation metrics, best metric and step, steps, wall time.
    Raises:
      UserError (and subclasses such as DataError, ConfigError): bad input, with a message.
      TrainingError: the loss became NaN/Inf.
    """
    import jax

    from jaxtpu import checkpoint, optim, parallel, steps

    t_start = time.time()
    workdir = prepare_workdir(Path(workdir or cfg.run.workdir), cfg.run.resume, cfg.run.task)
    task, run = cfg.run.task, cfg.run
    devices = parallel.init_devices(run.num_devices)
    n_dev = len(devices)
    log.info(
        "devices: %d x %s (%s), strategy %s, precision %s",
        n_dev,
        devices[0].platform,
        devices[0].device_kind,
        run.parallel,
        run.precision,
    )

    tokenizer = D.load_tokenizer(C.tokenizer_dir(cfg))
    if not (workdir / "tokenizer").exists():  # predict/export need it, wherever the model was
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
    global_batch = run.batch_size * n_dev
    spe = D.steps_per_epoch(len(data.train), global_batch)
    if spe == 0:
        raise UserError(
            f"--batch-size {run.batch_size} x {n_dev} devices = global batch {global_batch} is "
            f"larger than the {len(data.train)} training {info['unit']}; use a smaller "
            "--batch-size or --num-devices"
        )
    total = spe * run.epochs if not run.max_steps else min(spe * run.epochs, run.max_steps)
    total_updates = max(total // cfg.optim.accumulate, 1)
    log.info(
        "steps: %d (%d per epoch x %d epochs%s), global batch %d = %d per device x %d",
        total,
        spe,
        run.epochs,
        f", capped by --max-steps {run.max_steps}" if run.max_steps else "",
        global_batch,
        run.batch_size,
        n_dev,
    )

    model = build_model(cfg, cfg.data.max_len)
    identity = model.identity(task)
    log.info(
        "model: %s, %d layers x %d hidden, %.1fM params, from %s",
        type(model.module).__name__,
        model.encoder.num_hidden_layers,
        model.encoder.hidden_size,
        sum(x.size for x in jax.tree_util.tree_leaves(model.params)) / 1e6,
        C.resolve_model_dir(cfg.model.model_dir) or f"random init (seed {run.seed})",
    )
    tx = optim.make_optimizer(cfg.optim, total_updates, n_dev)
    state = steps.TrainState.create(apply_fn=model.module.apply, params=model.params, tx=tx)
    state = jax.device_get(state)

    ckpts = checkpoint.Checkpoints(workdir)
    start = 0
    best = {"value": -math.inf, "step": None, "bad_evals": 0}
    if run.resume and ckpts.latest_step() is not None:
        restored, meta = ckpts.restore_latest(
            {"step": state.step, "params": state.params, "opt_state": state.opt_state}, identity
        )
        state = state.replace(**restored)
        start = int(meta["step"])
        best = meta["best"]
        log.info("resumed from %s at step %d", ckpts.latest_dir, start)
    elif run.resume:
        log.info("--resume: no checkpoint in %s yet, starting at step 0", workdir)

    strategy = parallel.make_strategy(run.parallel, devices, task)
    state = strategy.put_state(state)
    rng = jax.random.key(run.seed)
    peak = peak_lr(cfg.optim, n_dev)
    monitor = M.MONITOR[task]
    runlog = RunLog(workdir, resume_step=start if run.resume else None)
    runlog.write_config(cfg, info, devices)

    def meta(step: int) -> dict[str, Any]:
        return {**identity, "step": step, "best": best, "config": cfg.to_dict()}

    def save_latest(step: int) -> None:
        host = strategy.host_state(state)
        tree = {"step": host.step, "params": host.params, "opt_state": host.opt_state}
        ckpts.save_latest(step, tree, meta(step))

    last_eval: dict[str, Any] = {}

    def run_eval(step: int, epoch: int) -> bool:
        """Evaluates, logs, checkpoints; returns True when early stopping says stop."""
        nonlocal last_eval
        t0 = time.time()
        result, _ = evaluate(strategy, state, data.valid, global_batch, task)
        value = result[monitor]
        improved = np.isfinite(value) and value > best["value"]
        if improved:
            best.update(value=float(value), step=step, bad_evals=0)
            ckpts.save_best(step, strategy.host_state(state).params, {**meta(step), **result})
        else:
            best["bad_evals"] += 1
        save_latest(step)
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
        return bool(run.patience and best["bad_evals"] >= run.patience)

    bar = None
    if run.progress:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True)
    pending: list[Any] = []
    step, t_log, step_log = start, time.time(), start
    compile_s: float | None = None
    stopped_by = None
    with _StopFlag() as stop:
        for epoch in range(start // spe, run.epochs):
            for idx in D.train_batches(len(data.train), global_batch, run.seed, epoch, step % spe):
                if step >= total:
                    break
                state, m = strategy.train_step(state, strategy.put_batch(data.train.take(idx)), rng)
                step += 1
                pending.append(m)
                if compile_s is None:
                    jax.block_until_ready(m)
                    compile_s = time.time() - t_log
                    log.info("first step (compile + run): %.1fs", compile_s)
                    t_log, step_log = time.time(), step
                    runlog.write({"event": "compile", "step": step, "seconds": compile_s})
                if step % run.log_every == 0 or step == total:
                    host = [strategy.host_metrics(x) for x in pending]  # one sync per interval
                    pending = []
                    loss = float(np.mean([h["loss"] for h in host]))
                    if not np.isfinite(loss):
                        raise TrainingError(
                            f"loss became {loss} at step {step}; stopped. The last good "
                            f"checkpoint is kept in {ckpts.root} (best at step {best['step']})"
                        )
                    dt = max(time.time() - t_log, 1e-9)
                    rate = (step - step_log) * global_batch / dt if step > step_log else 0.0
                    t_log, step_log = time.time(), step
                    lr = float(
                        learning_rate(step // cfg.optim.accumulate, total_updates, cfg.optim, peak)
                    )
                    grad_norm = float(np.mean([h["grad_norm"] for h in host]))
                    runlog.write(
                        {
                            "event": "train",
                            "step": step,
                            "epoch": epoch,
                            "loss": loss,
                            "grad_norm": grad_norm,
                            "lr": lr,
                            "examples_per_s": rate,
                        }
                    )
                    if bar is not None:
                        bar.set_postfix(loss=f"{loss:.4f}", ex_s=f"{rate:.1f}", refresh=False)
                if bar is not None:
                    bar.update(1)
                if run.eval_every and step % run.eval_every == 0 and step < total:
                    if run_eval(step, epoch):
                        stopped_by = "early stopping"
                        break
                if stop.signal is not None:
                    stopped_by = "SIGTERM"
                    break
            if stopped_by or step >= total:
                break
            if not last_eval or last_eval["step"] != step:
                if run_eval(step, epoch):
                    stopped_by = "early stopping"
                    break
        if bar is not None:
            bar.close()
        if stopped_by == "SIGTERM":
            jax.block_until_ready(state)
            save_latest(step)
            log.info("SIGTERM: saved the latest state at step %d; resume with --resume", step)
        elif not last_eval or last_eval["step"] != step:
            run_eval(step, epoch)

    summary = {
        "task": task,
        "steps": step,
        "total_steps": total,
        "stopped_by": stopped_by,
        "final": last_eval,
        "monitor": monitor,
        "best": best,
        "compile_seconds": compile_s,
        "wall_seconds": time.time() - t_start,
        "devices": n_dev,
        "parallel": run.parallel,
        "precision": run.precision,
        "train_traces": strategy.traces,
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


def main(argv: Sequence[str] | None = None) -> int:
    cfg = C.parse_args(
        argv,
        prog="python -m jaxtpu.train",
        description="Fine-tune a BERT toxicity classifier (--task toxicity) or ranker "
        "(--task ranking) data-parallel over N devices with JAX/Flax.",
    )
    with user_errors():
        train_and_evaluate(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
