"""The JAX side of a run, built and not yet started (`build_backend`): the model, its optimizer
for the job's schedule, the train state on the host, the strategy with the task's steps and the
run directory's checkpoints. `jaxtpu.train` starts it and runs the loop; `jaxtpu.lrfind` builds
one with its own sweep of learning rates.
"""

from __future__ import annotations

import logging
from typing import Any

from jaxtpu.core.flags.values import is_run_dir
from jaxtpu.core.run import plan
from jaxtpu.core.schedules import describe_layer_rates
from jaxtpu.engine import weights
from jaxtpu.engine.scoring import load_trained

log = logging.getLogger("jaxtpu")


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

    from jaxtpu.engine import checkpoint, optim, parallel, steps
    from jaxtpu.engine.backend import JaxBackend
    from jaxtpu.engine.placement import Placement

    cfg, spec = job.cfg, job.spec
    start = None
    if is_run_dir(spec.weights):  # --init-from RUN: RUN's best params
        start = load_trained(str(spec.weights)).params
    model = weights.load_model(cfg, spec, start=start)
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(model.params))
    n_trained = sum(x.size for x in jax.tree_util.tree_leaves(steps.split_trained(model.params)[0]))
    log.info("model: %s", spec.describe_model(n_params, cfg.train.seed, n_trained))
    if cfg.optim.layerwise:
        rates = describe_layer_rates(cfg.optim, spec.encoder.num_hidden_layers, len(devices))
        log.info("learning rates: %s", rates)
    scales = None if model.lr_scales is None else steps.split_trained(model.lr_scales)[0]
    tx = optim.make_optimizer(cfg.optim, job.plan.horizon, len(devices), scales, schedule)
    state = steps.create_state(model.module.apply, model.params, tx, steps.loss_scaler(cfg.train))
    fns = steps.for_task(cfg.task, cfg.train.margin)
    placement = Placement(spec.sharding, *spec.mesh)
    strategy = parallel.make_strategy(cfg.placement.parallel, devices, fns, placement, saved)
    ckpts = checkpoint.Checkpoints(
        job.rundir, procs if procs.count > 1 else None, cfg.output.async_checkpoint
    )
    return JaxBackend(
        strategy, jax.device_get(state), cfg.train.seed, ckpts, cfg.placement.steps_per_call
    )
