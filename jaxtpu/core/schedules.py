"""Learning-rate schedules as plain formulas, and the layer-wise rate of each parameter
(`layer_lr_scale`), shared by the JAX and the torch side.

Framework-free: `xp` is the array module to compute with (`numpy` on the torch side, where
`torch.optim.lr_scheduler.LambdaLR` calls it with a Python int, or `jax.numpy` inside optax).
`step` counts optimizer updates, starting at 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Horizon:
    """How long a run's schedule is: `total` optimizer updates, `per_epoch` of them in an epoch
    (training steps per epoch / --accumulate; for --schedule-interval epoch)."""

    total: int
    per_epoch: float

    def scheduler_steps(self, cfg: Any) -> int:
        """The scheduler steps in the run: updates, or epochs when it steps per epoch."""
        if cfg.schedule_interval == "epoch":
            return max(int(np.ceil(self.total / max(self.per_epoch, 1e-9))), 1)
        return max(int(self.total), 1)


def learning_rate(step: Any, horizon: Horizon, cfg: Any, peak: float, xp: Any = np) -> Any:
    """The learning rate at optimizer update `step` of the run.

    Args:
      step: update index (int or array).
      horizon: the run's length in updates (and per epoch).
      cfg: a `jaxtpu.core.flags.schema.OptimConfig` (schedule, schedule_interval, warmup_frac,
        t_max, t0, t_mult, eta_min).
      peak: the peak learning rate (after --scale-lr).
      xp: numpy or jax.numpy.
    With --schedule-interval epoch the schedule's step is the epoch (update // updates per
    epoch): the rate holds through an epoch, as a Lightning scheduler without an interval.
    Schedules, with T the run's scheduler steps:
      constant: `peak` after a linear warm-up of `warmup_frac` x T steps (transformers'
        get_constant_schedule_with_warmup: peak x step / warm-up steps).
      linear: the same warm-up to `peak`, then linear decay to 0 at T (transformers'
        get_linear_schedule_with_warmup).
      cosine: torch's CosineAnnealingLR(T_max=`t_max` or T, eta_min): eta_min + (peak -
        eta_min)(1 + cos(pi t / T_max)) / 2, rising again past T_max as torch's does.
      cosine-restarts: torch's CosineAnnealingWarmRestarts(T_0=`t0`, T_mult=`t_mult`, eta_min).
      onecycle: torch's OneCycleLR (cosine, pct_start = warmup_frac or 0.3, div_factor 25,
        final_div_factor 1e4).
    """
    step = xp.asarray(step, dtype=xp.float32)
    if cfg.schedule_interval == "epoch":
        step = xp.floor(step / max(horizon.per_epoch, 1e-9))
    total = horizon.scheduler_steps(cfg)
    warm = int(cfg.warmup_frac * total)
    rising = step / max(warm, 1)  # the warm-up of both transformers schedules
    if cfg.schedule == "constant":
        return peak * xp.where(step < warm, rising, 1.0)
    if cfg.schedule == "linear":
        decay = xp.maximum(0.0, (total - step) / max(total - warm, 1))
        return peak * xp.where(step < warm, rising, decay)
    if cfg.schedule == "cosine":
        t_max = cfg.t_max if cfg.t_max > 0 else total
        return _cosine(step, t_max, peak, cfg.eta_min, xp)
    if cfg.schedule == "cosine-restarts":
        t0, mult = float(cfg.t0), float(cfg.t_mult)
        if cfg.t_mult == 1:
            cycle = xp.floor(step / t0)
            t_cur, t_i = step - cycle * t0, t0
        else:  # cycle n starts at t0 (mult^n - 1) / (mult - 1) and lasts t0 mult^n
            n = xp.floor(xp.log(step / t0 * (mult - 1.0) + 1.0) / np.log(mult))
            t_cur = step - t0 * (mult**n - 1.0) / (mult - 1.0)
            t_i = t0 * mult**n
        return _cosine(t_cur, t_i, peak, cfg.eta_min, xp)
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


def _cosine(t: Any, period: Any, peak: float, eta_min: float, xp: Any) -> Any:
    return eta_min + (peak - eta_min) * (1.0 + xp.cos(np.pi * t / period)) / 2.0


def peak_lr(cfg: Any, num_devices: int) -> float:
    """--lr, multiplied by the device count when --scale-lr is set (as the TPU notebooks do)."""
    return cfg.lr * num_devices if cfg.scale_lr else cfg.lr


# Where a parameter sits in the layer-wise learning-rate decay (`layer_lr_scale`): the
# numbered layers (`layer.3`, DistilBERT's `transformer.layer.3`, ModernBERT's and EuroBERT's
# `layers.3`); the embedding is named by the layer kind (`LayerKind.embedding_modules`).
_LAYER = re.compile(r"(?:^|\.)layers?\.(\d+)\.")


def layer_lr_scale(
    name: str, num_layers: int, decay: float, head_scale: float, embedding: tuple[str, ...]
) -> float:
    """The multiplier of a parameter's learning rate under `--layer-lr-decay` and `--head-lr`,
    one rule for both sides.

    Args:
      name: the parameter's name as the torch side's `named_parameters` gives it: `bert.` and
        the family's Hugging Face key for the encoder, anything else for the head (the Flax
        side names its leaves the same way, `jaxtpu.engine.weights.hf_key`).
      num_layers: the encoder's layers, N.
      decay: F in (0, 1] (1 = off).
      head_scale: --head-lr / --lr (1 when --head-lr is not given).
      embedding: the first parts of the encoder's keys that are its embedding (the layer
        kind's `embedding_modules`).
    Returns:
      layer i (0 = the one nearest the embeddings): F^(N-1-i), so the top layer keeps the
      rate; the embeddings F^N, the lowest; the rest of the encoder (the final norm, BERT's
      pooler, DeBERTa's relative-position table) F^0 = 1, as the top layer; the head
      `head_scale`.
    """
    if not name.startswith("bert."):
        return head_scale
    key = name[len("bert.") :]
    if key.split(".", 1)[0] in embedding:
        return decay**num_layers
    layer = _LAYER.search(key)
    if layer is None:
        return 1.0
    return decay ** (num_layers - 1 - int(layer.group(1)))


def describe_layer_rates(cfg: Any, num_layers: int, num_devices: int) -> str:
    """The peak rates of --layer-lr-decay/--head-lr in one line, for the run's log."""
    peak = peak_lr(cfg, num_devices)
    f = cfg.layer_lr_decay
    layers = (
        f"layers 0-{num_layers - 1} {peak * f ** (num_layers - 1):.3g} to {peak:.3g} "
        f"(x{f:g} per layer down)"
    )
    return (
        f"embeddings {peak * f**num_layers:.3g}, {layers}, the rest of the encoder "
        f"{peak:.3g}, head {peak * cfg.head_scale:.3g} (peaks of the schedule)"
    )
