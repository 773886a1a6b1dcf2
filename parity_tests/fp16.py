"""Check 3d: `--precision fp16` with dynamic loss scaling, jaxtpu (flax's `DynamicScale`)
against plain torch (`torch.autocast` + `torch.amp.GradScaler`), both on this CPU: the losses,
and the loss scale and skipped steps of every step (docs/parity.md, "fp16 with loss
scaling"). `python -m parity_tests.breaks --check fp16` shows a scaler that never skips
failing it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from parity_tests.checks import TRAJ_FLAGS, Result
from parity_tests.harness import relative_diff, run_jax_runs, run_torch_runs, shared_init

# fp16 with dynamic loss scaling: the scale doubles after 3 finite steps (GradScaler's 2000
# would not grow within 21 steps), and the forced-overflow run starts at 2^28, where this
# model's fp16 gradients overflow (here from 2^19 up) until the scale has halved back into
# range: about ten skipped steps, then training.
FP16_FLAGS = ["--precision", "fp16", "--loss-scale-growth-interval", "3"]
FP16_OVERFLOW_SCALE = "268435456"  # 2^28
FP16_RUNS = {"": [], "forced overflow": ["--loss-scale", FP16_OVERFLOW_SCALE]}
# fp16 trajectories: the bound is the fp32 one, about 25x the worst relative step difference
# measured over 21 steps (docs/measured/parity-quick.json, shown in docs/parity.md).
TRAJ_FP16_RTOL = 1e-3


def fp16_trajectories(work: Path) -> list[Result]:
    """Check 3d: --precision fp16 with dynamic loss scaling, 21 steps with dropout off from
    one init: jaxtpu jit on 8 devices (flax's DynamicScale) against plain torch eager
    (torch.autocast fp16 + torch.amp.GradScaler) on the same global batch of 32. Per run: the
    losses within `TRAJ_FP16_RTOL`, and the loss scale of every step and the skipped steps
    equal, step for step; once as GradScaler starts (2^16, growing every 3 steps here) and
    once forced to overflow (2^28), which must skip and back off the same way on both
    sides."""
    model_dir = shared_init(work / "init-tiny-toxicity", "toxicity", "tiny")
    base = [*TRAJ_FLAGS, "--task", "toxicity", "--model-dir", str(model_dir), *FP16_FLAGS]
    jax_flags = ["--num-devices", "8", "--parallel", "jit"]
    names = {what: f"fp16{'-overflow' if what else ''}" for what in FP16_RUNS}
    jax_runs = run_jax_runs(
        [
            (work / f"traj-{names[w]}-jit", [*base, *extra, *jax_flags])
            for w, extra in FP16_RUNS.items()
        ]
    )
    refs = run_torch_runs(
        [
            (
                work / f"traj-{names[w]}-eager",
                [*base, *extra, "--num-devices", "1", "--batch-size", "32", "--parallel", "eager"],
            )
            for w, extra in FP16_RUNS.items()
        ]
    )
    return [
        fp16_result(what, run, ref.check())
        for what, run, ref in zip(FP16_RUNS, jax_runs, refs, strict=True)
    ]


def fp16_result(what: str, run: Any, ref: Any) -> Result:
    """One fp16 comparison: losses within `TRAJ_FP16_RTOL` over at least 20 steps, and the
    scale and skipped steps equal at every step. A jaxtpu run that failed (a scaler that
    never skips ends in a NaN loss) fails it with its error."""
    kind = f"fp16 ({what})" if what else "fp16"
    check = f"trajectory toxicity {kind}: jaxtpu jit (8 devices) vs torch eager"
    if not (run.workdir / "summary.json").exists():  # this run did not finish
        error = (run.stderr.strip().splitlines() or ["(no output)"])[-1]
        return Result(check, TRAJ_FP16_RTOL, float("inf"), False, f"jaxtpu failed: {error}")
    mine, theirs = run.events("train"), ref.events("train")
    scales = [[r["loss_scale"] for r in rs] for rs in (mine, theirs)]
    skips = [[int(r["skipped"]) for r in rs] for rs in (mine, theirs)]
    rel = relative_diff(run.losses, ref.losses) if len(mine) == len(theirs) else [float("inf")]
    worst = max(rel)
    same = scales[0] == scales[1] and skips[0] == skips[1]
    same &= run.summary.get("skipped_steps") == sum(skips[0])  # the run's own count
    return Result(
        check,
        TRAJ_FP16_RTOL,
        worst,
        worst <= TRAJ_FP16_RTOL and len(rel) >= 20 and same,
        f"{len(rel)} steps, worst at step {int(np.argmax(rel)) + 1}; {sum(skips[1])} skipped "
        f"(torch) vs {sum(skips[0])} (jaxtpu), loss scales "
        f"{'equal at every step' if scales[0] == scales[1] else 'differ'}",
        {
            "jaxtpu jit": run.losses,
            "torch eager": ref.losses,
            "jaxtpu loss scale": scales[0],
            "torch loss scale": scales[1],
            "jaxtpu skipped": skips[0],
            "torch skipped": skips[1],
        },
    )
