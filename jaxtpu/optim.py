"""optax AdamW with the no-decay mask, schedules, gradient accumulation and clipping."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxtpu.core.config import OptimConfig
from jaxtpu.core.schedules import learning_rate, peak_lr

# Leaves that get no weight decay: every bias and the LayerNorm scales (the seeds' `no_decay`
# list ["bias", "LayerNorm.weight", "LayerNorm.bias"]).
NO_DECAY_LEAVES = ("bias", "scale")
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_ divides by (norm + 1e-6)


def decay_mask(params: Any) -> Any:
    """True for parameters that get weight decay."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: getattr(path[-1], "key", None) not in NO_DECAY_LEAVES, params
    )


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """Global-norm clipping as `torch.nn.utils.clip_grad_norm_` (the reference side's) does it:
    every gradient times one scalar, min(1, max_norm / (norm + 1e-6)).

    `optax.clip_by_global_norm` divides by the norm without the 1e-6 and selects per element
    between the gradient and its clipped value. XLA:CPU did not copy that divide into both
    moment updates: it wrote the clipped gradients out and read them back, one more pass over
    every gradient each step. The scalar product fuses into the moment updates. The state is
    optax's (empty), so checkpoints are unchanged."""

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        del params
        norm = optax.tree.norm(updates)
        coef = jnp.minimum(max_norm / (norm + CLIP_EPS), 1.0)
        return jax.tree_util.tree_map(lambda g: g * coef.astype(g.dtype), updates), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def make_schedule(cfg: OptimConfig, total_updates: int, num_devices: int) -> optax.Schedule:
    return partial(
        learning_rate, total=total_updates, cfg=cfg, peak=peak_lr(cfg, num_devices), xp=jnp
    )


def make_optimizer(
    cfg: OptimConfig, total_updates: int, num_devices: int
) -> optax.GradientTransformation:
    """AdamW (torch defaults: betas 0.9/0.999, eps 1e-8) after global-norm clipping, wrapped in
    `optax.MultiSteps` when accumulating: the update is the mean of `accumulate` gradients.

    Args:
      cfg: optimizer settings.
      total_updates: optimizer updates in the run (train steps // accumulate).
      num_devices: for --scale-lr.
    """
    chain = []
    if cfg.clip_norm > 0:
        chain.append(clip_by_global_norm(cfg.clip_norm))
    chain.append(
        optax.adamw(
            make_schedule(cfg, total_updates, num_devices),
            b1=0.9,
            b2=0.999,
            eps=1e-8,
            weight_decay=cfg.weight_decay,
            mask=decay_mask,
        )
    )
    tx = optax.chain(*chain)
    if cfg.accumulate > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=cfg.accumulate)
    return tx
