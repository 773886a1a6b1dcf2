"""`python -m jaxtpu.preflight`: how much memory a training run needs per device on a target
(this machine's devices, or a TPU slice this machine does not have), before you rent it.

It builds the run's real train and eval steps from the training flags (model, task, batch,
max length, precision, strategy, --sharding, --mesh, --remat), compiles them ahead of time
for the target without running them or allocating a weight, and reads the compiler's own
accounting (`memory_analysis`, `cost_analysis`) of the compiled executables. For a TPU target
it also estimates the step time (`speed.estimate`: the TPU compiler's cost model on v2/v3,
jaxtpu's roofline of the compiled program on v4, v5e, v5p and v6e), with the examples/s,
tokens/s and model-FLOPs utilisation bound that implies, and from the training data the time
of an epoch and of the run, and on a v5e-8 whether it fits Kaggle's session limits:
estimates, not measurements.

TPU targets compile on a CPU-only host: PyPI's `libtpu` (installed by the project) compiles
for a TPU topology through `jax.experimental.topologies.get_topology_desc`; the numbers are the
TPU compiler's, for the same program that would run there. What a TPU compilation told
preflight is remembered (`jaxtpu.preflight.memo`, beside JAX's compilation cache): the same
program for the same target again is read back, not compiled, and says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jaxtpu.core import files, storage
from jaxtpu.core.errors import ConfigError, UserError
from jaxtpu.core.flags.cli import parse_with
from jaxtpu.core.flags.commands import add_command_flags
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.run.exits import user_errors
from jaxtpu.core.storage import check_output_path
from jaxtpu.preflight.fit import check, find_batch, options
from jaxtpu.preflight.lowering import save_programs
from jaxtpu.preflight.report import Report, say, table
from jaxtpu.preflight.speed import add_epoch, training_examples
from jaxtpu.preflight.targets import (
    GPU_TARGETS,
    TARGETS,
    TPU_TARGETS,
    check_gpu_target,
    describe_target,
    implied_by_target,
    platform_of,
    target_devices,
)


def _add_flags(p: argparse.ArgumentParser) -> None:
    target = (
        "Where the run would train: cpu (this machine's --num-devices devices; capacity = host "
        "RAM / devices) or a TPU slice, compiled here by libtpu: "
        + ", ".join(
            f"{k} ({v.topology}, {v.chip.hbm_gib:g} GiB/chip)" for k, v in TPU_TARGETS.items()
        )
        + "; or GPUs, estimated from this machine's compiler (no GPU needed, none compiled "
        "for): "
        + ", ".join(
            f"{k} ({v.count} x {v.chip.device_kind}, {v.chip.memory_gib:g} GiB)"
            for k, v in GPU_TARGETS.items()
        )
        + " [default: cpu]"
    )
    add_command_flags(
        p, "preflight", choices={"target": TARGETS}, help_text={"target": target}, grouped=True
    )


def _use_compilation_cache() -> None:
    from jaxtpu.engine import hosts  # JAX: imported once a command runs, never by --help

    hosts.use_compilation_cache()


def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = parse_with(
        argv,
        prog="python -m jaxtpu.preflight",
        description="Compile a training run's train and eval steps for a target (this CPU or a "
        "TPU slice) without running them, and print the memory each device needs, whether it "
        "fits, FLOPs per step and compile time, and for a TPU target the estimated (not "
        "measured) step time, epoch time and, on v5e-8, whether the run fits a Kaggle session. "
        "A GPU target (t4x2, p100, t4, l4, a100-40, a100-80, h100) is estimated: memory from "
        "this machine's compiler, the step as its FLOP floor at the GPU's peak, the program "
        "lowered for CUDA. Takes every training flag of jaxtpu.train.",
        strategies=("jit", "shard_map"),
        add_flags=_add_flags,
    )
    with user_errors():
        if cfg.placement.num_processes > 1:
            raise ConfigError("--num-processes: preflight compiles for one host's devices")
        out = Path(args.json or f"runs/preflight/{args.target}.json")
        check_output_path(out, "--json")  # before the first compilation, not after the last
        cfg = implied_by_target(cfg, args)
        _check_target_flags(args, cfg.train.precision)
        _use_compilation_cache()  # and the memo of TPU compilations beside it
        devices, capacity = target_devices(args.target, cfg.placement.num_devices)
        platform = platform_of(devices, args.target)
        configs = options(cfg, args.sweep)
        for c in configs:  # every configuration is valid before any compiles
            RunSpec.resolve(c, len(devices), platform)
        print(
            f"preflight: {len(configs)} configuration(s) for {args.target} "
            f"({describe_target(args.target, devices, capacity)}), "
            f"{cfg.train.task}, {cfg.train.precision}, max_len {cfg.data.max_len}, model "
            f"{cfg.model.model_dir or 'random init'}",
            file=sys.stderr,
            flush=True,
        )
        train = None
        if args.target != "cpu":  # for the epoch estimate, before any compilation
            try:
                train, what = training_examples(cfg, len(devices), platform)
                print(f"preflight: epochs estimated for {what}", file=sys.stderr, flush=True)
            except UserError as e:  # the memory and step estimates do not need the data
                print(f"preflight: no epoch estimate: {e}", file=sys.stderr, flush=True)
        reports: list[Report] = []
        for c in configs:
            if args.find_batch:
                reports.append(find_batch(c, args.target, devices, capacity, say))
                print("  largest batch found:", file=sys.stderr)
            else:
                reports.append(check(c, args.target, devices, capacity))
            if train is not None:
                add_epoch(reports[-1], c, train, len(devices))
            say(reports[-1])
            # after every configuration: a long sweep stopped midway keeps what it measured
            _write_json(
                out,
                {
                    "target": args.target,
                    "config": cfg.to_dict(),
                    "reports": [asdict(r) for r in reports],
                },
            )
        print(table(reports, args.find_batch))
        print(f"preflight: wrote {out}", file=sys.stderr)
        if args.save_programs:
            if reports[0].error or not reports[0].fits:
                raise ConfigError(
                    f"--save-programs {args.save_programs}: the run does not fit "
                    f"{args.target}; nothing saved (see the table)"
                )
            if storage.is_remote(args.save_programs):  # written here, uploaded when complete
                with storage.staged_dir(args.save_programs) as staging:
                    saved = save_programs(cfg, args.target, devices, staging)
            else:
                saved = save_programs(cfg, args.target, devices, Path(args.save_programs))
            print(
                f"preflight: saved {len(saved) - 1} programs in {args.save_programs}; train "
                f"with the same flags and --programs {args.save_programs}",
                file=sys.stderr,
            )
    return 0


def _check_target_flags(args: argparse.Namespace, precision: str) -> None:
    """What the target and --save-programs allow, before anything compiles."""
    if args.target in GPU_TARGETS:
        check_gpu_target(args.target, precision, args.save_programs)
    if args.save_programs:
        _check_programs_dir(args.save_programs, args)


def _check_programs_dir(where: str, args: argparse.Namespace) -> None:
    """--save-programs goes with one configuration, into a new directory or one it wrote (in
    a bucket: a new one)."""
    from jaxtpu.engine.programs import MANIFEST

    if args.sweep is not None or args.find_batch:
        raise ConfigError(
            f"--save-programs {where}: saves one run's programs; leave out "
            f"{'--sweep' if args.sweep is not None else '--find-batch'}"
        )
    if storage.is_remote(where):
        storage.check_output_dir(where, "--save-programs")
        return
    directory = Path(where)
    if directory.exists() and (
        not directory.is_dir() or (any(directory.iterdir()) and not (directory / MANIFEST).exists())
    ):
        raise ConfigError(
            f"--save-programs {directory}: exists and holds no saved programs; give a new directory"
        )


def _write_json(path: Path, record: dict[str, Any]) -> None:
    """Replaces `path` atomically: a killed run never leaves half a file."""
    files.write_text(path, json.dumps(record, indent=2))
