"""`python -m jaxtpu.train`: fine-tune a BERT toxicity classifier or ranker on N devices.

`main()` only parses flags; `train_and_evaluate(cfg, workdir)` does the work (tests call it).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu import config as C
from jaxtpu import loop as L
from jaxtpu.loop import TrainingError
from jaxtpu.run_io import RunLog, prepare_workdir, user_errors

__all__ = ["JaxBackend", "TrainingError", "build_model", "main", "train_and_evaluate"]

log = logging.getLogger("jaxtpu")


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


class JaxBackend:
    """The JAX side of the shared loop: a strategy (pmap or jit), the state on its devices,
    and the run's checkpoints."""

    name = "jaxtpu"

    def __init__(self, strategy: Any, state: Any, seed: int, ckpts: Any = None) -> None:
        import jax

        self.strategy = strategy
        self.state = state
        self.num_devices = strategy.n
        self.procs = strategy.procs
        self.num_processes = self.procs.count
        self.primary = self.procs.primary
        self.rng = jax.random.key(seed)
        self.ckpts = ckpts

    def compile_count(self) -> int:
        return self.strategy.traces

    def local_rows(self, n: int) -> slice:
        return self.procs.rows(n)

    def any_process(self, flag: bool) -> bool:
        return self.procs.any(flag)

    def train_steps(self, batches: list[dict[str, np.ndarray]]) -> list[Any]:
        """One device call: a plain step for one batch, a `lax.scan` over K stacked ones."""
        s = self.strategy
        if len(batches) == 1:
            self.state, metrics = s.train_step(self.state, s.put_batch(batches[0]), self.rng)
            return [(1, metrics)]
        stacked = {k: np.stack([b[k] for b in batches]) for k in batches[0]}
        self.state, metrics = s.train_steps(self.state, s.put_batches(stacked), self.rng)
        return [(len(batches), metrics)]

    def fetch(self, handles: list[Any]) -> list[dict[str, float]]:
        out: list[dict[str, float]] = []
        for k, metrics in handles:
            if k == 1:
                out.append(self.strategy.host_metrics(metrics))
            else:
                out.extend(self.strategy.host_metrics_stacked(metrics))
        return out

    def eval_batch(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.strategy.eval_step(self.state, self.strategy.put_batch(batch))

    def save_latest(self, step: int, meta: dict[str, Any]) -> None:
        host = self.strategy.host_state(self.state)
        tree = {"step": host.step, "params": host.params, "opt_state": host.opt_state}
        self.ckpts.save_latest(step, tree, meta)

    def save_best(self, step: int, meta: dict[str, Any]) -> None:
        self.ckpts.save_best(step, self.strategy.host_state(self.state).params, meta)

    def device_memory_mb(self) -> list[float] | None:
        """Peak memory per device of this process, where the backend reports it (TPU/GPU; not
        XLA:CPU)."""
        stats = [d.memory_stats() or {} for d in self.strategy.local_devices]
        peaks = [s.get("peak_bytes_in_use") for s in stats]
        return None if None in peaks else [round(p / 2**20, 1) for p in peaks]


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
    task, run = cfg.run.task, cfg.run
    parallel.set_cpu_device_count(run.num_devices)
    parallel.init_distributed(run.coordinator_address, run.num_processes, run.process_id)
    procs = parallel.Processes()
    if not procs.primary:  # process 0 reports for everyone
        log.setLevel(logging.WARNING)
    workdir = prepare_workdir(
        Path(workdir or cfg.run.workdir), cfg.run.resume, cfg.run.task, create=procs.primary
    )
    devices = parallel.init_devices(run.num_devices)
    n_dev = len(devices)
    log.info(
        "devices: %d x %s (%s)%s, strategy %s, precision %s",
        n_dev,
        devices[0].platform,
        devices[0].device_kind,
        f" over {procs.count} processes" if procs.count > 1 else "",
        run.parallel,
        run.precision,
    )

    data = L.load_data(cfg, workdir, save_tokenizer=procs.primary)
    info = data.info
    plan = L.Plan.make(cfg, len(data.train), n_dev, info["unit"])
    log.info(plan.describe(cfg, n_dev))

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
    tx = optim.make_optimizer(cfg.optim, plan.total_updates, n_dev)
    state = steps.TrainState.create(apply_fn=model.module.apply, params=model.params, tx=tx)
    state = jax.device_get(state)

    ckpts = checkpoint.Checkpoints(workdir, procs if procs.count > 1 else None)
    progress = L.Progress()
    if run.resume and ckpts.latest_step() is not None:
        restored, meta = ckpts.restore_latest(
            {"step": state.step, "params": state.params, "opt_state": state.opt_state}, identity
        )
        state = state.replace(**restored)
        progress = L.Progress(int(meta["step"]), meta["best"])
        log.info("resumed from %s at step %d", ckpts.latest_dir, progress.step)
    elif run.resume:
        log.info("--resume: no checkpoint in %s yet, starting at step 0", workdir)

    strategy = parallel.make_strategy(run.parallel, devices, task)
    backend = JaxBackend(strategy, strategy.put_state(state), run.seed, ckpts)
    runlog = RunLog(
        workdir, resume_step=progress.step if run.resume else None, enabled=procs.primary
    )
    runlog.write_config(cfg, info, devices)
    return L.run(cfg, data, plan, backend, workdir, progress, identity, runlog, t_start)


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
