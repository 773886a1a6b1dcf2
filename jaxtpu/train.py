"""`python -m jaxtpu.train`: fine-tune a BERT-family model on a Jigsaw task on N devices.

`main()` only parses flags; `train_and_evaluate(cfg, workdir)` does the work (tests call it).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxtpu.core import hostmem
from jaxtpu.core.flags.cli import parse_args
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import JAX_STRATEGIES, Config, require_strategy
from jaxtpu.core.run import loop, plan, signals
from jaxtpu.core.run.folds import train_folds
from jaxtpu.core.run.protocol import ResumeState
from jaxtpu.core.run.rundir import claim_workdir, exit_code, user_errors
from jaxtpu.core.run.store import RunStore
from jaxtpu.core.schedules import describe_layer_rates

__all__ = ["main", "train_and_evaluate"]

log = logging.getLogger("jaxtpu")


def train_and_evaluate(cfg: Config, workdir: str | Path | None = None) -> dict[str, Any]:
    """Trains and evaluates as `cfg` says, writing everything to `workdir`.

    Args:
      cfg: the resolved configuration.
      workdir: run directory (default: cfg.output.workdir).
    Returns:
      A summary: final validation metrics, best metric and step, steps, wall time.
    Raises:
      UserError (and its kinds in `jaxtpu.core.errors`): bad input, with a message.
      TrainingError: the loss became NaN/Inf.
    """
    require_strategy(cfg, JAX_STRATEGIES, "jaxtpu")
    from jaxtpu import hosts

    t_start = time.time()
    hosts.set_cpu_device_count(cfg.placement.num_devices)
    hosts.use_compilation_cache()
    hosts.init_distributed(
        cfg.placement.coordinator_address, cfg.placement.num_processes, cfg.placement.process_id
    )
    procs = hosts.Processes()
    if not procs.primary:  # process 0 reports for everyone
        log.setLevel(logging.WARNING)
    with (
        signals.early(procs.preemption_service) as early,
        claim_workdir(workdir or cfg.output.workdir, cfg, procs.primary) as store,
    ):
        return _train(cfg, store, procs, t_start, early)


def _train(
    cfg: Config, store: RunStore, procs: Any, t_start: float, early: Any = None
) -> dict[str, Any]:
    """The body of a run in its claimed run directory: the data, the backend, resume, start
    (the state placed and the steps jitted), then the shared loop."""
    import jax

    from jaxtpu import hosts

    devices = hosts.init_devices(cfg.placement.num_devices)
    spec = RunSpec.resolve(cfg, len(devices), devices[0].platform)  # defaults per platform
    log.info(
        "devices: %d x %s (%s)%s, %s, precision %s%s%s",
        len(devices),
        devices[0].platform,
        devices[0].device_kind,
        f" over {procs.count} processes" if procs.count > 1 else "",
        spec.describe_placement(),
        cfg.train.precision,
        f", remat {cfg.model.remat}" if cfg.model.remat != "none" else "",
        ", scanned layers" if cfg.model.scan_layers else "",
    )
    if jax.config.jax_compilation_cache_dir:  # set by hosts.use_compilation_cache
        log.info("compiled programs cached in %s", jax.config.jax_compilation_cache_dir)
    if hostmem.active():
        log.info("host memory: malloc on transparent huge pages (%s)", hostmem.HUGE_PAGES)
    saved = None
    if cfg.placement.programs:  # its environment is checked before the data are read
        from jaxtpu.programs import SavedPrograms

        saved = SavedPrograms(cfg.placement.programs, devices, cfg)
    setup = loop.Setup(compile_cache_empty=hosts.compilation_cache_empty())
    t0 = time.time()
    job = plan.Job.load(cfg, spec, store.local, len(devices), procs.primary, t_start, store)
    setup.data_s, setup.tokens_cached = time.time() - t0, job.data.info["token_cache_hit"]
    backend = build_backend(job, devices, procs, saved)
    t0 = time.time()
    resume = backend.restore_latest(spec.model_key) if cfg.output.resume else ResumeState()
    setup.restore_s = time.time() - t0
    backend.start()  # the state on the devices, the steps jitted (`parallel.JitStrategy.place`)
    return loop.train(job, backend, resume, devices, early, setup)


def build_backend(
    job: plan.Job, devices: list[Any], procs: Any, saved: Any = None, schedule: Any = None
) -> Any:
    """The JAX side of a run, not started: the model (`weights.load_model`), its optimizer for
    the job's schedule, the train state on the host, the strategy with the task's steps, and
    the run directory's checkpoints.

    Args:
      job: the run's config, resolution, data and plan.
      devices: every device of the run.
      procs: this host's processes (`hosts.Processes`).
      saved: the programs of --programs DIR, if given.
      schedule: an optax schedule replacing the run's (the learning-rate finder's sweep).
    Returns:
      A `backend.JaxBackend`.
    """
    import jax

    from jaxtpu import checkpoint, optim, parallel, steps, weights
    from jaxtpu.backend import JaxBackend
    from jaxtpu.placement import Placement

    cfg, spec = job.cfg, job.spec
    model = weights.load_model(cfg, spec)
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(model.params))
    log.info("model: %s", spec.describe_model(n_params, cfg.train.seed))
    if cfg.optim.layerwise:
        rates = describe_layer_rates(cfg.optim, spec.encoder.num_hidden_layers, len(devices))
        log.info("learning rates: %s", rates)
    tx = optim.make_optimizer(cfg.optim, job.plan.horizon, len(devices), model.lr_scales, schedule)
    state = steps.TrainState.create(apply_fn=model.module.apply, params=model.params, tx=tx)
    fns = steps.for_task(cfg.task, cfg.train.margin)
    placement = Placement(spec.sharding, *spec.mesh)
    strategy = parallel.make_strategy(cfg.placement.parallel, devices, fns, placement, saved)
    ckpts = checkpoint.Checkpoints(
        job.rundir, procs if procs.count > 1 else None, cfg.output.async_checkpoint
    )
    return JaxBackend(
        strategy, jax.device_get(state), cfg.train.seed, ckpts, cfg.placement.steps_per_call
    )


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(
        argv,
        prog="python -m jaxtpu.train",
        description="Fine-tune a BERT-family model on a Jigsaw task (--task toxicity, "
        "ranking or multilabel) data-parallel over N devices with JAX/Flax.",
        strategies=JAX_STRATEGIES,
    )
    with user_errors():
        if cfg.train.all_folds:
            summary = train_folds(cfg, train_and_evaluate)
        else:
            summary = train_and_evaluate(cfg)
    return exit_code(summary, "jaxtpu.train")


if __name__ == "__main__":
    hostmem.reexec_with_huge_pages()
    sys.exit(main())
