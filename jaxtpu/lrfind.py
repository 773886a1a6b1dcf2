"""`jaxtpu lr-find`: the learning-rate range test (Smith 2015; fastai's and Lightning's
`lr_find`, the TPU_utility notebook's "learning rate finder").

A short run on the run's own data and model whose rate grows exponentially from --start-lr to
--end-lr, one optimizer update per step (the run's AdamW form, clipping, decay groups and
layer-wise factors; no warm-up, no schedule), recording the loss of each step. It stops early
when the smoothed loss passes 4x its minimum (fastai's stop) or becomes NaN. It writes
`lr_find.csv` (step, lr, loss, smoothed loss) and `lr_find.png` beside it, and suggests a rate
by the rule `suggest` states. The run directory is a temporary one: no checkpoint, model or
training run is written anywhere.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core.errors import UserError
from jaxtpu.core.files import atomic_write
from jaxtpu.core.flags.cli import parse_with
from jaxtpu.core.flags.commands import add_command_flags, check_command_flags
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import JAX_STRATEGIES, Config, require_strategy
from jaxtpu.core.lrsweep import DIVERGED, smooth, suggest, sweep_rate
from jaxtpu.core.run import plan
from jaxtpu.core.run.exits import user_errors
from jaxtpu.engine.build import build_backend

log = logging.getLogger("jaxtpu")


def add_flags(parser: argparse.ArgumentParser) -> None:
    add_command_flags(parser, "lr-find", grouped=True)


def check_flags(args: argparse.Namespace, cfg: Config) -> None:
    if not 0 < args.start_lr < args.end_lr or not math.isfinite(args.end_lr):
        raise UserError(
            f"--start-lr {args.start_lr:g} and --end-lr {args.end_lr:g}: expected 0 < start < end"
        )
    check_command_flags("lr-find", args)
    if cfg.optim.accumulate > 1:
        raise UserError("lr-find takes one optimizer update per step: drop --accumulate")
    if cfg.output.resume:
        raise UserError("lr-find starts from the model's initial weights: drop --resume")
    out = Path(args.out)
    if out.exists() and not out.is_dir():  # checked before the sweep, not after it
        raise UserError(
            f"--out {out}: a file is there; lr-find writes a directory (lr_find.csv, "
            "lr_find.png): choose another --out"
        )


def find(cfg: Config, start: float, end: float, steps: int) -> dict[str, Any]:
    """Runs the sweep (see the module docstring). Returns {'lr', 'loss', 'smoothed',
    'suggestion', 'why', 'stopped'}."""
    from jaxtpu.engine import hosts

    require_strategy(cfg, JAX_STRATEGIES, "jaxtpu")
    hosts.set_cpu_device_count(cfg.placement.num_devices)
    hosts.use_compilation_cache()
    devices = hosts.init_devices(cfg.placement.num_devices)
    procs = hosts.Processes()
    spec = RunSpec.resolve(cfg, len(devices), devices[0].platform)
    with tempfile.TemporaryDirectory(prefix="jaxtpu-lr-find-") as tmp:
        job = plan.Job.load(cfg, spec, Path(tmp), len(devices), procs.primary, time.time())

        def rate(count: Any) -> Any:
            import jax.numpy as jnp

            return sweep_rate(count, start, end, steps, xp=jnp)

        backend = build_backend(job, devices, procs, schedule=rate)
        backend.start()
        lrs, losses, stopped = [], [], ""
        train, batcher = job.data.train, job.plan.batcher
        rows = backend.local_rows(job.plan.global_batch)
        batches = (b for epoch in range(10**9) for b in batcher.epoch(epoch, cfg.train.seed, 0))
        for i, b in zip(range(steps), batches, strict=False):
            host = [train.take(b.idx[rows], b.weight[rows], b.length)]
            loss = backend.fetch(backend.train_steps(backend.prepare(host)))[0]["loss"]
            lrs.append(float(sweep_rate(i, start, end, steps)))
            losses.append(loss)
            if not math.isfinite(loss):
                stopped = f"the loss became {loss} at lr {lrs[-1]:.3g}"
                lrs.pop(), losses.pop()
                break
            avg = smooth(losses)
            if i > 0 and avg[-1] > DIVERGED * avg.min():
                stopped = f"the smoothed loss passed {DIVERGED:g}x its minimum at lr {lrs[-1]:.3g}"
                break
            if (i + 1) % max(steps // 10, 1) == 0:
                log.info("lr-find: step %d/%d, lr %.3g, loss %.4f", i + 1, steps, lrs[-1], loss)
    smoothed = smooth(losses)
    suggestion, why = suggest(np.asarray(lrs), smoothed) if losses else (None, "no step ran")
    return {
        "lr": lrs,
        "loss": losses,
        "smoothed": smoothed.tolist(),
        "suggestion": suggestion,
        "why": why,
        "stopped": stopped,
    }


def write(result: dict[str, Any], out: Path) -> list[Path]:
    """lr_find.csv, and lr_find.png when matplotlib is installed (the dev extra)."""
    out.mkdir(parents=True, exist_ok=True)
    table = out / "lr_find.csv"
    with atomic_write(table, newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "lr", "loss", "smoothed_loss"])
        for i, row in enumerate(zip(result["lr"], result["loss"], result["smoothed"], strict=True)):
            w.writerow([i + 1, *(f"{x:.6g}" for x in row)])
    written = [table]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("lr_find.png not drawn: matplotlib is not installed (pip install matplotlib)")
        return written
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(result["lr"], result["loss"], alpha=0.3, label="loss")
    ax.plot(result["lr"], result["smoothed"], label="smoothed loss")
    if result["suggestion"]:
        ax.axvline(result["suggestion"], color="red", ls="--", label="suggested")
    ax.set(xscale="log", xlabel="learning rate", ylabel="training loss", title="lr-find")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "lr_find.png", dpi=100)
    plt.close(fig)
    return [*written, out / "lr_find.png"]


def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = parse_with(
        argv,
        prog="jaxtpu lr-find",
        description="Learning-rate range test: a short sweep of the rate from --start-lr to "
        "--end-lr on the run's data and model (every training flag applies), the loss against "
        "the rate in lr_find.csv and lr_find.png, and a suggested --lr. Writes no checkpoint.",
        strategies=JAX_STRATEGIES,
        add_flags=add_flags,
    )
    with user_errors():
        check_flags(args, cfg)
        result = find(cfg, args.start_lr, args.end_lr, args.lr_find_steps)
        files = write(result, Path(args.out))
    if result["stopped"]:
        print(f"stopped early: {result['stopped']}")
    print(
        f"{len(result['lr'])} steps from lr {args.start_lr:g}; wrote {', '.join(map(str, files))}"
    )
    if result["suggestion"] is None:
        print(f"no suggestion: {result['why']}")
    else:
        print(f"suggested --lr {result['suggestion']:.3g} ({result['why']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
