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
from jaxtpu.core.data import community, perspective
from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.cli import parse_args
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import JAX_STRATEGIES, Config, require_strategy
from jaxtpu.core.hardware import precision_problem
from jaxtpu.core.run import loop, plan, signals
from jaxtpu.core.run.exits import exit_code, user_errors
from jaxtpu.core.run.folds import train_folds
from jaxtpu.core.run.protocol import ResumeState
from jaxtpu.core.run.rundir import claim_workdir
from jaxtpu.core.run.store import RunStore
from jaxtpu.engine.build import build_backend
from jaxtpu.engine.community import compare, compared_line, forgetting

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
    from jaxtpu.engine import hosts

    t_start = time.time()
    cfg = perspective.resolve(cfg)  # --perspective: the file's attributes, before it is recorded
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


def check_precision(precision: str, device: Any) -> None:
    """Refuses bf16 on a GPU without bfloat16, warns of fp16 off a GPU
    (`jaxtpu.core.hardware.precision_problem`)."""
    problem = precision_problem(
        precision, device.platform, getattr(device, "compute_capability", None)
    )
    if problem is None:
        return
    level, message = problem
    if level == "error":
        raise ConfigError(message)
    log.warning(message)


def _train(
    cfg: Config, store: RunStore, procs: Any, t_start: float, early: Any = None
) -> dict[str, Any]:
    """The body of a run in its claimed run directory: the data, the backend, resume, start
    (the state placed and the steps jitted), then the shared loop."""
    import jax

    from jaxtpu.engine import hosts

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
    check_precision(cfg.train.precision, devices[0])
    if jax.config.jax_compilation_cache_dir:  # set by hosts.use_compilation_cache
        log.info("compiled programs cached in %s", jax.config.jax_compilation_cache_dir)
    if hostmem.active():
        log.info("host memory: malloc on transparent huge pages (%s)", hostmem.HUGE_PAGES)
    saved = None
    if cfg.placement.programs:  # its environment is checked before the data are read
        from jaxtpu.engine.programs import SavedPrograms

        saved = SavedPrograms(cfg.placement.programs, devices, cfg)
    setup = loop.Setup(compile_cache_empty=hosts.compilation_cache_empty())
    t0 = time.time()
    # --init-from RUN: the new rows split by time, RUN's rows replayed, in files of the run dir
    read_cfg, prepared = community.prepare(cfg, store.local)
    read_cfg = perspective.prepare(read_cfg, store.local)  # --perspective: its rows, written
    job = plan.Job.load(read_cfg, spec, store.local, len(devices), procs.primary, t_start, store)
    setup.data_s, setup.tokens_cached = time.time() - t0, job.data.info["token_cache_hit"]
    backend = build_backend(job, devices, procs, saved)
    t0 = time.time()
    resume = backend.restore_latest(spec.model_key) if cfg.output.resume else ResumeState()
    setup.restore_s = time.time() - t0
    backend.start()  # the state on the devices, the steps jitted (`parallel.JitStrategy.place`)
    summary = loop.train(job, backend, resume, devices, early, setup)
    if prepared is not None and summary["best"]["step"] is not None and procs.primary:
        summary["compared"] = _compare(prepared, store, procs, devices)
    return summary


def _compare(prepared: Any, store: RunStore, procs: Any, devices: list[Any]) -> dict[str, Any]:
    """Both validations of a run that continued RUN, under RUN and under the new best model
    (`jaxtpu.engine.community`), said in the closing line; one process's work."""
    if procs.count > 1:
        log.warning(
            "--init-from %s: compare the two models with `jaxtpu evaluate` on %s and %s "
            "(not scored at the end of a multi-process run)",
            prepared.run,
            prepared.valid_csv,
            prepared.original_valid,
        )
        return {}
    compared = compare(prepared, store.local, devices)
    log.info("%s", compared_line(compared, prepared.run))
    if lost := forgetting(compared, prepared.run):
        log.warning("%s", lost)
    return compared


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
    sys.exit(main())
