"""optax AdamW (torch's update, or the transformers.AdamW the Kaggle notebooks ran) with the
no-decay mask, schedules, gradient accumulation and clipping."""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxtpu.core.flags.schema import OptimConfig
from jaxtpu.core.schedules import Horizon, learning_rate, peak_lr

# Leaves that get no weight decay: every bias and the LayerNorm scales (the seeds' `no_decay`
# list ["bias", "LayerNorm.weight", "LayerNorm.bias"]).
NO_DECAY_LEAVES = ("bias", "scale")
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_ divides by (norm + 1e-6)


def decay_mask(params: Any, which: str = "not-bias-or-norm") -> Any:
    """True for parameters that get weight decay (`--decay-params`): all but the biases and
    LayerNorm scales, or every one."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: which == "all" or getattr(path[-1], "key", None) not in NO_DECAY_LEAVES,
        params,
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


def make_schedule(cfg: OptimConfig, horizon: Horizon, num_devices: int) -> optax.Schedule:
    return partial(learning_rate, horizon=horizon, cfg=cfg, peak=peak_lr(cfg, num_devices), xp=jnp)


class TransformersAdamState(NamedTuple):
    count: jax.Array
    mu: Any
    nu: Any


def scale_leaves(scales: Any) -> optax.GradientTransformation:
    """Each update times its leaf's learning-rate multiplier
    (`jaxtpu.engine.weights.lr_scales`): after `optax.adamw`, whose update is -lr (adam +
    weight_decay p), this is torch.optim.AdamW with a parameter group at lr x scale, decay
    included. A scale of a scanned leaf is one per stacked
    layer (shape (layers,)), broadcast over the rest of the leaf."""

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        del params
        return jax.tree_util.tree_map(_times, updates, scales), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def _times(x: Any, scale: Any) -> Any:
    scale = jnp.asarray(scale, jnp.float32)
    scale = scale.reshape(scale.shape + (1,) * (x.ndim - scale.ndim))
    return (x * scale).astype(x.dtype)


def transformers_adamw(
    learning_rate: optax.Schedule,
    b1: float,
    b2: float,
    eps: float,
    weight_decay: float,
    mask: Any,
    scales: Any = None,
) -> optax.GradientTransformation:
    """The update of `transformers.AdamW` (transformers < 5, `correct_bias=True`), which the
    PyTorch/XLA and Lightning Jigsaw notebooks ran: with t the update number and lr its rate,

        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        p' = p - lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)
        p'' = p' - lr * weight_decay * p'        (decayed parameters only)

    eps is added to sqrt(v) before the bias correction and the decay applies to the stepped
    weights: both differ from torch.optim.AdamW (eps after correction, decay first).
    `scales` (`jaxtpu.engine.weights.lr_scales`, or None for 1 everywhere) multiplies lr per leaf,
    as a parameter group's own rate does: the decay then uses the scaled rate too."""

    def init(params: Any) -> TransformersAdamState:
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return TransformersAdamState(jnp.zeros([], jnp.int32), zeros, zeros)

    def update(grads: Any, state: TransformersAdamState, params: Any = None):
        lr = learning_rate(state.count)
        t = (state.count + 1).astype(jnp.float32)
        mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
        nu = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu, grads)
        step_size = lr * jnp.sqrt(1 - b2**t) / (1 - b1**t)
        decays = mask(params) if callable(mask) else mask
        per_leaf = scales if scales is not None else jax.tree_util.tree_map(lambda _: 1.0, params)

        def one(p: Any, m: Any, v: Any, decay: bool, scale: Any) -> Any:
            step = _times(-step_size * m / (jnp.sqrt(v) + eps), scale)
            if decay and weight_decay:
                step = step - _times(lr * weight_decay * (p + step), scale)
            return step.astype(p.dtype)

        updates = jax.tree_util.tree_map(one, params, mu, nu, decays, per_leaf)
        return updates, TransformersAdamState(state.count + 1, mu, nu)

    return optax.GradientTransformation(init, update)


def make_optimizer(
    cfg: OptimConfig,
    horizon: Horizon,
    num_devices: int,
    scales: Any = None,
    schedule: optax.Schedule | None = None,
) -> optax.GradientTransformation:
    """AdamW (`--adamw` form, betas `--adam-beta1/2`, `--adam-eps`; decay on
    `--decay-params`) after global-norm clipping, wrapped in `optax.MultiSteps` when
    accumulating: the update is the mean of `accumulate` gradients.

    Args:
      cfg: optimizer settings.
      horizon: the run's optimizer updates (train steps // accumulate), and per epoch.
      num_devices: for --scale-lr.
      scales: per-leaf learning-rate multipliers (`jaxtpu.engine.weights.lr_scales`, stacked as the
        params are) for --layer-lr-decay/--head-lr; None when every parameter trains at the
        schedule's rate (the optimizer state is then as it always was).
      schedule: the rate per update instead of the run's schedule (`jaxtpu.lrfind`'s sweep).
    """
    chain = []
    if cfg.clip_norm > 0:
        chain.append(clip_by_global_norm(cfg.clip_norm))
    common = dict(
        b1=cfg.adam_beta1,
        b2=cfg.adam_beta2,
        eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
        mask=partial(decay_mask, which=cfg.decay_params),
    )
    schedule = schedule or make_schedule(cfg, horizon, num_devices)
    if cfg.adamw == "transformers":
        chain.append(transformers_adamw(schedule, **common, scales=scales))
    else:
        chain.append(optax.adamw(schedule, **common))
        if scales is not None:
            chain.append(scale_leaves(scales))
    tx = optax.chain(*chain)
    if cfg.accumulate > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=cfg.accumulate)
    return tx
