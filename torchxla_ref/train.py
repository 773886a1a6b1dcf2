"""`python -m torchxla_ref.train`: the PyTorch/XLA reference trainer.

Same flags, data and batches, metrics, loop and run directory layout as `jaxtpu.train`, all
from the framework-free `jaxtpu.core` (this side never imports JAX); only the framework calls
differ. `--parallel spmd` (default here), `spawn`, `eager` or `ddp` (the last two plain PyTorch,
on CUDA GPUs or the host CPU).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.cli import implied, parse_with
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import TORCH_STRATEGIES, Config, jax_only_options, require_strategy
from jaxtpu.core.flags.values import is_run_dir
from jaxtpu.core.hardware import precision_problem
from jaxtpu.core.run import loop, plan, signals
from jaxtpu.core.run.exits import exit_code, setup_logging, user_errors
from jaxtpu.core.run.folds import train_folds
from jaxtpu.core.run.protocol import ResumeState
from jaxtpu.core.run.rundir import claim_workdir
from jaxtpu.core.storage import is_remote
from torchxla_ref import parallel
from torchxla_ref.backend import XlaBackend

log = logging.getLogger("jaxtpu")


def _train(cfg: Config, workdir: Path, t_start: float) -> dict[str, Any]:
    """The body of a run, in the process (spmd, eager) or in each replica (spawn, ddp); a SIGTERM
    from its start on stops it before its first step (`signals.early`)."""
    with signals.early() as early:
        return _run(cfg, workdir, t_start, early)


def _run(cfg: Config, workdir: Path, t_start: float, early: Any) -> dict[str, Any]:
    strategy = parallel.make_strategy(cfg.placement.parallel, cfg.placement.num_devices)
    devices = [str(strategy.device)] * strategy.num_devices
    spec = RunSpec.resolve(cfg, len(devices))
    kind = getattr(strategy.device, "type", "xla")  # eager, ddp: cpu or cuda
    problem = precision_problem(
        cfg.train.precision, kind, getattr(strategy, "compute_capability", None)
    )
    if problem is not None and problem[0] == "error":  # every replica stops, not the first only
        raise UserError(problem[1])
    if strategy.ordinal == 0:
        name = cfg.placement.parallel
        runtime = "torch" if name in parallel.PLAIN_TORCH else "torch_xla"
        log.info("devices: %d x %s (%s %s)", len(devices), strategy.device, runtime, name)
        if problem is not None:
            log.warning(problem[1])

    job = plan.Job.load(cfg, spec, workdir, len(devices), strategy.ordinal == 0, t_start)
    backend = build_backend(job, strategy, devices)
    resume = backend.restore_latest(spec.model_key) if cfg.output.resume else ResumeState()
    backend.start()
    return loop.train(job, backend, resume, devices, early)


def build_backend(job: plan.Job, strategy: Any, devices: list[str]) -> XlaBackend:
    """The torch side of a run: transformers' encoder with the Jigsaw head, filled from the
    checkpoint (`weights.load_model`), on the strategy's device, with its optimizer and
    schedule for the job's plan: the twin of `jaxtpu.engine.build.build_backend`."""
    from torchxla_ref import optim, weights

    cfg, spec = job.cfg, job.spec
    model = weights.load_model(spec.model_spec(cfg), spec.weights, cfg.train.seed)
    model = model.to(strategy.device)
    optimizer, scheduler = optim.make_optimizer(model, cfg.optim, job.plan.horizon, len(devices))
    n_params = sum(p.numel() for p in model.parameters())
    n_trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info("model: %s", spec.describe_model(n_params, cfg.train.seed, n_trained))
    return XlaBackend(
        strategy,
        model,
        optimizer,
        scheduler,
        cfg,
        job.workdir,
        xla=cfg.placement.parallel not in parallel.PLAIN_TORCH,
    )


def _spawn_replica(index: int, cfg: Config, workdir: Path, t_start: float) -> None:
    setup_logging()
    if index != 0:
        logging.getLogger("jaxtpu").setLevel(logging.WARNING)
    _train(cfg, workdir, t_start)


def _ddp_replica(index: int, cfg: Config, workdir: Path, t_start: float, rendezvous: str) -> None:
    setup_logging()
    if index != 0:
        logging.getLogger("jaxtpu").setLevel(logging.WARNING)
    parallel.start_ddp(index, cfg.placement.num_devices, rendezvous)
    try:
        _train(cfg, workdir, t_start)
    except UserError as e:  # told by the parent in one line (`_spawn_ddp`), not a traceback
        (workdir / f"{DDP_ERROR}{index}").write_text(str(e))
        sys.exit(2)
    finally:
        import torch.distributed as dist

        dist.destroy_process_group()


DDP_ERROR = ".ddp_error."


def _spawn_ddp(cfg: Config, workdir: Path, t_start: float) -> None:
    """`--parallel ddp`: one process per device, met through a file in the run directory. A
    user error in any process stops them all and is raised here, as the first process said it."""
    import torch.multiprocessing as mp

    rendezvous = workdir / ".ddp_rendezvous"
    for stale in [rendezvous, *workdir.glob(f"{DDP_ERROR}*")]:  # a killed run's
        stale.unlink(missing_ok=True)
    try:
        mp.spawn(
            _ddp_replica,
            args=(cfg, workdir, t_start, str(rendezvous)),
            nprocs=cfg.placement.num_devices,
        )
    except mp.ProcessExitedException:
        said = sorted(workdir.glob(f"{DDP_ERROR}*"))
        if not said:
            raise
        raise UserError(said[0].read_text()) from None
    finally:
        for made in [rendezvous, *workdir.glob(f"{DDP_ERROR}*")]:
            made.unlink(missing_ok=True)


def train_and_evaluate(cfg: Config, workdir: str | Path | None = None) -> dict[str, Any] | None:
    """Trains and evaluates the torch_xla reference as `cfg` says; see `jaxtpu.train`.

    Returns:
      The run summary (spmd, eager), or None for spawn and ddp (read `summary.json` in the run
      directory).
    """
    require_strategy(cfg, TORCH_STRATEGIES, "torchxla_ref")
    if cfg.placement.num_processes > 1 or cfg.placement.coordinator_address:
        raise UserError(
            "--coordinator-address/--num-processes: multi-host runs are jaxtpu only; the "
            "torch_xla reference runs on one host"
        )
    if is_run_dir(cfg.model.init_from):
        raise UserError(
            f"--init-from {cfg.model.init_from} is a jaxtpu run directory: continuing a run on "
            "new rows is jaxtpu's (jaxtpu train --init-from RUN); the reference starts from a "
            "state-dict file or a peft adapter"
        )
    if jax_only_options(cfg):
        raise UserError(
            f"{', '.join(jax_only_options(cfg))}: jaxtpu-only options; the torch_xla "
            "reference replicates its model on every device, saves synchronously and has no "
            "profiler flag"
        )
    target = str(workdir or cfg.output.workdir)
    if is_remote(target):
        raise UserError(
            f"--workdir {target}: the torch_xla reference writes local run directories; runs "
            "in a bucket are jaxtpu's (jaxtpu train --workdir gs://...)"
        )
    t_start = time.time()
    strategy = cfg.placement.parallel
    if cfg.train.precision == "fp16" and strategy not in parallel.PLAIN_TORCH:
        raise UserError(
            f"--precision fp16 --parallel {strategy}: torch_xla has no fp16 loss scaling (its "
            "GPU path is gone); the torch side trains fp16 with plain torch: --parallel eager "
            "or ddp"
        )
    if strategy == "eager" and cfg.placement.num_devices != 1:
        raise UserError(
            "--parallel eager runs on one device: use --num-devices 1 (or --parallel ddp for "
            "one process per device)"
        )
    if strategy == "ddp":
        parallel.ddp_devices(cfg.placement.num_devices)
    elif strategy != "eager":
        parallel.configure_runtime(cfg.placement.num_devices, strategy)
    with claim_workdir(target, cfg) as store:
        workdir = store.local
        if strategy == "ddp":
            _spawn_ddp(cfg, workdir, t_start)
            return None
        if strategy != "spawn":
            return _train(cfg, workdir, t_start)
        import torch_xla.distributed.xla_multiprocessing as xmp

        xmp.spawn(_spawn_replica, args=(cfg, workdir, t_start), nprocs=None)
        return None


def implied_by_fp16(cfg: Config, given: frozenset[str]) -> Config:
    """fp16 on this side is plain torch (torch_xla has no fp16 loss scaling): --parallel
    eager on one device, unless the user chose the strategy or the device count (a choice
    that conflicts is still refused by `train_and_evaluate`)."""
    if cfg.train.precision != "fp16":
        return cfg
    why = "--precision fp16 trains with plain torch (torch_xla has no fp16 loss scaling)"
    cfg = implied(cfg, given, {"parallel": "eager"}, why)
    if cfg.placement.parallel == "eager":
        cfg = implied(cfg, given, {"num_devices": 1}, "--parallel eager runs on one device")
    return cfg


def without_torch_xla() -> None:
    """A plain-PyTorch run (eager, ddp) tells transformers and accelerate not to import
    torch_xla, which they do wherever it is installed (accelerate at its import, seconds of
    every start for nothing such a run uses); `USE_TORCH_XLA` is their own switch, and a value
    the user set is kept. Before anything imports transformers; ddp's replicas inherit it."""
    os.environ.setdefault("USE_TORCH_XLA", "0")


def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = parse_with(
        argv,
        prog="python -m torchxla_ref.train",
        description="PyTorch/XLA reference trainer: same flags, data, metrics and run "
        "directory as jaxtpu.train (--parallel spmd|spawn|eager|ddp).",
        strategies=TORCH_STRATEGIES,
    )
    cfg = implied_by_fp16(cfg, args.given)
    if cfg.placement.parallel in parallel.PLAIN_TORCH:
        without_torch_xla()
    with user_errors():
        if cfg.train.all_folds:
            summary = train_folds(cfg, train_and_evaluate)
        else:
            summary = train_and_evaluate(cfg)
    return exit_code(summary, "torchxla_ref.train")


if __name__ == "__main__":
    sys.exit(main())
