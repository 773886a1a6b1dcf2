"""`python -m jaxtpu.train`: fine-tune a BERT toxicity classifier or ranker on N devices.

`main()` only parses flags; `train_and_evaluate(cfg, workdir)` does the work (tests call it).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core import hostmem, loop
from jaxtpu.core.cli import parse_args
from jaxtpu.core.config import (
    JAX_STRATEGIES,
    Config,
    describe_model,
    mesh_shape,
    param_sharding,
    require_strategy,
)
from jaxtpu.core.rundir import RunLog, claim_workdir, exit_code, user_errors

__all__ = ["JaxBackend", "main", "train_and_evaluate"]

log = logging.getLogger("jaxtpu")


class JaxBackend:
    """The JAX side of the shared loop: a strategy (pmap or jit), the state on its devices,
    and the run's checkpoints."""

    name = "jaxtpu"

    def __init__(
        self, strategy: Any, state: Any, seed: int, ckpts: Any = None, steps_per_call: int = 1
    ) -> None:
        import jax

        self.strategy = strategy
        self.steps_per_call = steps_per_call  # K: every train call holds K batch slots
        self.state = strategy.put_state(state)
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

    def stack(self, batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """The batches of one call stacked on a leading axis of K slots: a call of fewer
        batches (the end of a bucket, an epoch, a run) fills the rest with weight-0 copies of
        its first batch, which the step skips. So one program serves every call of a length."""
        slots = batches + [_padding(batches[0])] * (self.steps_per_call - len(batches))
        return {k: np.stack([b[k] for b in slots]) for k in batches[0]}

    def prepare(self, batches: list[dict[str, np.ndarray]]) -> Any:
        """The call's batches stacked in K slots and placed on the devices."""
        return self.strategy.put_steps(self.stack(batches)), len(batches)

    def precompile(
        self, calls: list[list[dict[str, np.ndarray]]], evals: list[dict[str, np.ndarray]]
    ) -> int:
        """Compiles, before the first step, the train call of each of `calls` and the eval
        step of each of `evals` (one of each shape the run will use), several at a time.
        Returns the number of programs compiled (0 under pmap, which compiles on first use)."""
        stacked = [self.stack(c) for c in calls]
        return self.strategy.precompile(self.state, self.rng, stacked, evals)

    def train_steps(self, prepared: Any) -> list[Any]:
        """One device call over the K stacked batches (K >= 1, `steps.train_steps`)."""
        placed, real = prepared
        self.state, metrics = self.strategy.train(self.state, placed, self.rng)
        return [(metrics, real)]

    def fetch(self, handles: list[Any]) -> list[dict[str, float]]:
        """The metrics of the real steps of each call (padding slots left out)."""
        return [m for metrics, real in handles for m in self.strategy.host_metrics(metrics)[:real]]

    def eval_batch(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.strategy.eval(self.state, self.strategy.put_batch(batch))

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


def _padding(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A padding slot: `batch` with every row's weight 0 (see `steps.is_padding`)."""
    return {**batch, "weight": np.zeros_like(batch["weight"])}


def train_and_evaluate(cfg: Config, workdir: str | Path | None = None) -> dict[str, Any]:
    """Trains and evaluates as `cfg` says, writing everything to `workdir`.

    Args:
      cfg: the resolved configuration.
      workdir: run directory (default: cfg.run.workdir).
    Returns:
      A summary: final validation metrics, best metric and step, steps, wall time.
    Raises:
      UserError (and its kinds in `jaxtpu.core.errors`): bad input, with a message.
      TrainingError: the loss became NaN/Inf.
    """
    require_strategy(cfg, JAX_STRATEGIES, "jaxtpu")
    from jaxtpu import parallel

    t_start = time.time()
    run = cfg.run
    parallel.set_cpu_device_count(run.num_devices)
    parallel.use_compilation_cache()
    parallel.init_distributed(run.coordinator_address, run.num_processes, run.process_id)
    procs = parallel.Processes()
    if not procs.primary:  # process 0 reports for everyone
        log.setLevel(logging.WARNING)
    with claim_workdir(Path(workdir or run.workdir), cfg, procs.primary) as workdir:
        return _train(cfg, workdir, procs, t_start)


def _train(cfg: Config, workdir: Path, procs: Any, t_start: float) -> dict[str, Any]:
    """The body of a run in its claimed run directory."""
    import jax

    from jaxtpu import checkpoint, optim, parallel, steps, weights

    run = cfg.run
    devices = parallel.init_devices(run.num_devices)
    n_dev = len(devices)
    data, fsdp = mesh_shape(cfg, n_dev)
    log.info(
        "devices: %d x %s (%s)%s, strategy %s (params %s%s), precision %s%s%s",
        n_dev,
        devices[0].platform,
        devices[0].device_kind,
        f" over {procs.count} processes" if procs.count > 1 else "",
        run.parallel,
        param_sharding(cfg),
        f", mesh data={data},fsdp={fsdp}" if run.parallel != "pmap" else "",
        run.precision,
        f", remat {cfg.model.remat}" if cfg.model.remat != "none" else "",
        ", scanned layers" if cfg.model.scan_layers else "",
    )
    if jax.config.jax_compilation_cache_dir:  # set by parallel.use_compilation_cache
        log.info("compiled programs cached in %s", jax.config.jax_compilation_cache_dir)
    if hostmem.active():
        log.info("host memory: malloc on transparent huge pages (%s)", hostmem.HUGE_PAGES)

    job = loop.Job.prepare(cfg, workdir, n_dev, procs.primary, t_start)
    model = weights.load_model(cfg, cfg.data.max_len)
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(model.params))
    log.info("model: %s", describe_model(cfg, model.encoder, n_params))
    tx = optim.make_optimizer(cfg.optim, job.plan.total_updates, n_dev)
    state = steps.TrainState.create(apply_fn=model.module.apply, params=model.params, tx=tx)
    state = jax.device_get(state)

    ckpts = checkpoint.Checkpoints(workdir, procs if procs.count > 1 else None)
    resume = loop.ResumeState()
    if run.resume and ckpts.latest_step() is not None:
        restored, meta = ckpts.restore_latest(
            {"step": state.step, "params": state.params, "opt_state": state.opt_state},
            job.identity,
        )
        state = state.replace(**restored)
        resume = loop.ResumeState(int(meta["step"]), meta["best"])
        log.info("resumed from %s at step %d", ckpts.latest_dir, resume.step)
    elif run.resume:
        log.info("--resume: no checkpoint in %s yet, starting at step 0", workdir)

    strategy = parallel.strategy_for(cfg, devices)
    backend = JaxBackend(strategy, state, run.seed, ckpts, run.steps_per_call)
    runlog = RunLog(workdir, resume_step=resume.step if run.resume else None, enabled=procs.primary)
    runlog.write_config(cfg, job.data.info, devices)
    return loop.run(job, backend, resume, runlog)


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(
        argv,
        prog="python -m jaxtpu.train",
        description="Fine-tune a BERT toxicity classifier (--task toxicity) or ranker "
        "(--task ranking) data-parallel over N devices with JAX/Flax.",
        strategies=JAX_STRATEGIES,
    )
    with user_errors():
        summary = train_and_evaluate(cfg)
    return exit_code(summary, "jaxtpu.train")


if __name__ == "__main__":
    hostmem.reexec_with_huge_pages()
    sys.exit(main())
