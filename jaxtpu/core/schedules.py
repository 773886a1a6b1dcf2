"""Learning-rate schedules as plain formulas, shared by the JAX and the torch side.

Framework-free: `xp` is the array module to compute with (`numpy` on the torch side, where
`torch.optim.lr_scheduler.LambdaLR` calls it with a Python int, or `jax.numpy` inside optax).
`step` counts optimizer updates, starting at 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def learning_rate(step: Any, total: int, cfg: Any, peak: float, xp: Any = np) -> Any:
    """The learning rate at optimizer update `step` of `total`.

    Args:
      step: update index (int or array).
      total: number of optimizer updates in the run.
      cfg: a `jaxtpu.core.config.OptimConfig` (schedule, warmup_frac, eta_min).
      peak: the peak learning rate (after --scale-lr).
      xp: numpy or jax.numpy.
    Schedules:
      constant: `peak` after a linear warm-up of `warmup_frac` x `total` updates (transformers'
        get_constant_schedule_with_warmup: peak x step / warm-up updates).
      linear: the same warm-up to `peak`, then linear decay to 0 at `total` (transformers'
        get_linear_schedule_with_warmup).
      cosine: torch's CosineAnnealingLR with T_max=`total`, eta_min=`cfg.eta_min`.
      onecycle: torch's OneCycleLR (cosine, pct_start = warmup_frac or 0.3, div_factor 25,
        final_div_factor 1e4).
    """
    step = xp.asarray(step, dtype=xp.float32)
    total = max(int(total), 1)
    warm = int(cfg.warmup_frac * total)
    rising = step / max(warm, 1)  # the warm-up of both transformers schedules
    if cfg.schedule == "constant":
        return peak * xp.where(step < warm, rising, 1.0)
    if cfg.schedule == "linear":
        decay = xp.maximum(0.0, (total - step) / max(total - warm, 1))
        return peak * xp.where(step < warm, rising, decay)
    if cfg.schedule == "cosine":
        t = xp.minimum(step, float(total))
        return cfg.eta_min + (peak - cfg.eta_min) * (1.0 + xp.cos(np.pi * t / total)) / 2.0
    if cfg.schedule == "onecycle":
        pct_start = cfg.warmup_frac or 0.3
        initial, final = peak / 25.0, peak / 25.0 / 1e4
        up = float(pct_start * total) - 1.0
        down = float(total) - up - 1.0

        def anneal(start: float, end: float, pct: Any) -> Any:
            return end + (start - end) / 2.0 * (xp.cos(np.pi * pct) + 1.0)

        rising = anneal(initial, peak, xp.minimum(step / max(up, 1e-9), 1.0))
        falling = anneal(peak, final, xp.clip((step - up) / max(down, 1e-9), 0.0, 1.0))
        return xp.where(step <= up, rising, falling)
    raise ValueError(f"unknown schedule {cfg.schedule!r}")


def peak_lr(cfg: Any, num_devices: int) -> float:
    """--lr, multiplied by the device count when --scale-lr is set (as the TPU notebooks do)."""
    return cfg.lr * num_devices if cfg.scale_lr else cfg.lr
