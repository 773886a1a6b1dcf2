"""A run's train and eval steps lowered for a target's devices on abstract inputs (no weight
is created, nothing runs), and every program of a run compiled and saved for another machine
(`save_programs`)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import Config
from jaxtpu.core.run import plan
from jaxtpu.core.schedules import Horizon
from jaxtpu.engine import weights
from jaxtpu.preflight.targets import platform_of


def bytes_per_device(tree: Any, shardings: Any) -> int:
    import jax
    import numpy as np

    sizes = jax.tree_util.tree_map(
        lambda x, s: math.prod(s.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize,
        tree,
        shardings,
    )
    return int(sum(jax.tree_util.tree_leaves(sizes)))


@dataclass
class Lowered:
    """The run's train and eval steps lowered for a device set, with what they take."""

    train: Any
    eval: Any
    state: Any  # abstract (shapes and dtypes)
    shardings: Any
    batches: Any  # the abstract K stacked batches of one train call


ANY_HORIZON = Horizon(1000, 1000)  # memory and FLOPs do not depend on the schedule's length


def abstract_run(
    cfg: Config, devices: list[Any], spec: RunSpec, horizon: Horizon = ANY_HORIZON
) -> tuple[Any, Any, Any, Any]:
    """(strategy, abstract state placed by its shardings, their shardings, abstract rng) of
    the run on `devices`: shapes only, no weight created. `horizon` (the schedule's length)
    changes no shape, only the schedule's constants in the program."""
    import jax

    from jaxtpu.engine import optim, parallel, steps
    from jaxtpu.engine.placement import Placement
    from jaxtpu.models import encoder as models

    module = models.for_run(cfg, spec)
    params = models.abstract_params(module, spec.task.example_shape(cfg.data.max_len))
    if spec.lora:
        params = weights.hold_frozen(params, cfg.train.precision)
    tx = optim.make_optimizer(cfg.optim, horizon, len(devices))
    scaler = steps.loss_scaler(cfg.train)
    state = jax.eval_shape(lambda p: steps.create_state(module.apply, p, tx, scaler), params)
    placement = Placement(spec.sharding, *spec.mesh)
    fns = steps.for_task(cfg.task, cfg.train.margin)
    strategy = parallel.make_strategy(cfg.placement.parallel, devices, fns, placement)
    shardings = strategy.state_sharding(state)
    rng = jax.eval_shape(lambda: jax.random.key(0))
    rng = jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=strategy.replicated)
    abstract_state = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings
    )
    return strategy, abstract_state, shardings, rng


def lower(
    cfg: Config, devices: list[Any], spec: RunSpec | None = None, platform: str = ""
) -> Lowered:
    """Traces and lowers the run's train call (K = --steps-per-call batches) and eval step for
    `devices` on abstract inputs: no weight is created, nothing runs. With `platform` (e.g.
    'cuda') the programs are lowered for that platform instead of the devices' own: they can
    be read, not compiled here."""
    import jax

    spec = spec or RunSpec.resolve(cfg, len(devices), platform_of(devices))
    strategy, abstract_state, shardings, rng = abstract_run(cfg, devices, spec)
    train, evaluate = strategy.jitted(shardings)
    rows = cfg.train.batch_size * len(devices)

    def batch(lead: tuple[int, ...], sharding: Any) -> dict[str, Any]:
        """The task's batch (`Task.batch_layout`) of the global rows, as shapes only."""
        layout = spec.task.batch_layout(cfg.data.max_len)
        return {
            k: jax.ShapeDtypeStruct((*lead, rows, *shape), dtype, sharding=sharding)
            for k, (shape, dtype) in layout.items()
        }

    def lowered(fn: Any, *args: Any) -> Any:
        if not platform:
            return fn.lower(*args)
        return fn.trace(*args).lower(lowering_platforms=(platform,))

    batches = batch((cfg.placement.steps_per_call,), strategy.steps_sharding)
    return Lowered(
        lowered(train, abstract_state, batches, rng),
        lowered(evaluate, abstract_state, batch((), strategy.batch_sharding)),
        abstract_state,
        shardings,
        batches,
    )


def save_programs(cfg: Config, target: str, devices: list[Any], directory: Path) -> list[Path]:
    """Compiles every program a run with `cfg` uses on `devices` (a train call of each length
    its buckets use, an evaluation batch of each length of its validation set), reading the
    data as the run does (their size sets the schedule's length, a constant of the train
    program), and writes them to `directory` (`jaxtpu.engine.programs`) for `train --programs`."""
    from jaxtpu.engine import programs
    from jaxtpu.engine.backend import stack_steps

    n = len(devices)
    spec = RunSpec.resolve(cfg, n, platform_of(devices))
    job = plan.Job.load(cfg, spec, directory, n, primary=False, started=time.time())
    strategy, state, _, rng = abstract_run(cfg, devices, spec, job.plan.horizon)
    strategy.build(state)
    calls, evals = plan.program_inputs(job, lambda rows: slice(0, rows))
    stacked = [stack_steps(c, cfg.placement.steps_per_call) for c in calls]
    t0 = time.perf_counter()
    with no_compilation_cache():
        built = strategy.precompile(state, rng, stacked, evals)
    print(
        f"  compiled {built} programs ({len(calls)} train call lengths, {len(evals)} eval "
        f"lengths) in {time.perf_counter() - t0:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return programs.save(directory, strategy.programs(), devices, cfg.to_dict())


@contextmanager
def no_compilation_cache() -> Iterator[None]:
    """JAX's persistent compilation cache off, reads too: an executable read back from it
    serializes without its code on XLA:CPU (loading it then fails with 'Function ... not
    found'), so programs to save are compiled afresh."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # JAX decides once per process whether to use it
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        compilation_cache.reset_cache()
