"""What every layer kind shares: dense layers with jaxtpu's precision (bf16 matmuls, fp32
accumulation, `--matmul-output`), LayerNorm in fp32, the residual stream's logical axes, the
`--remat` policies, and converting params between a scanned layer stack and `layer_i`'s.
Architecture only: knows nothing of devices."""

from __future__ import annotations

from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.models import ops

Dtype = jnp.dtype


def dense(
    cfg: EncoderConfig,
    features: int,
    name: str,
    dtype: Dtype,
    param_dtype: Dtype,
    out: Dtype = jnp.float32,
    use_bias: bool = True,
):
    """A dense layer; under bf16 compute its matmul is bf16 with fp32 accumulation and its
    result in `out` (`--matmul-output`)."""
    mixed = partial(ops.mixed_dot_general, out=out)
    extra = {"dot_general": mixed} if dtype == jnp.bfloat16 else {}
    return nn.Dense(
        features,
        dtype=dtype,
        param_dtype=param_dtype,
        kernel_init=nn.initializers.normal(cfg.initializer_range),
        use_bias=use_bias,
        name=name,
        **extra,
    )


def layer_dense(module: nn.Module, features: int, name: str, use_bias: bool = True) -> nn.Dense:
    """`dense` with the encoder config, dtypes and matmul output dtype of `module`."""
    return dense(
        module.cfg, features, name, module.dtype, module.param_dtype, module.matmul_out, use_bias
    )


# The name every dense (weight) matmul output carries, for `--remat dots`.
DENSE_OUT = "dense_out"


def saved(y: jax.Array) -> jax.Array:
    """Marks a dense layer's output as one that `--remat dots` keeps (a no-op otherwise)."""
    return checkpoint_name(y, DENSE_OUT)


# Logical names of the residual stream's axes. A strategy that shards the weights maps them to
# mesh axes (flax's `nn.logical_axis_rules`, see `jaxtpu.parallel`), so the activations stay
# split by batch rows; without rules these constraints do nothing.
RESIDUAL = ("batch", "length", "embed")


def residual(x: jax.Array) -> jax.Array:
    return nn.with_logical_constraint(x, RESIDUAL)


def layer_norm(
    cfg: EncoderConfig, name: str, param_dtype: Dtype, use_bias: bool = True
) -> nn.LayerNorm:
    return nn.LayerNorm(
        epsilon=cfg.layer_norm_eps,
        dtype=jnp.float32,
        param_dtype=param_dtype,
        use_bias=use_bias,
        name=name,
    )


# `--remat`: what each encoder layer keeps for its backward pass (`jax.checkpoint` policies);
# everything else is recomputed from the layer's input. The params do not change.
REMAT = {
    "layer": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.save_only_these_names(DENSE_OUT),
}


# The scanned encoder's one module: its params are `layer_i`'s stacked on axis 0.
SCANNED = "layers"


def _is_layer(name: str) -> bool:
    return name.startswith("layer_") and name[6:].isdigit()


def stack_layers(params: dict) -> dict:
    """Params of the unscanned model -> the scanned model's (every `layer_i` stacked on a
    leading axis under `encoder/layers/layer`); the inverse of `unstack_layers`."""
    enc = params["bert"]["encoder"]
    n = sum(_is_layer(name) for name in enc)
    layers = [enc[f"layer_{i}"] for i in range(n)]
    stacked = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *layers)
    shared = {k: v for k, v in enc.items() if not _is_layer(k)}
    return _with_encoder(params, {**shared, SCANNED: {"layer": stacked}})


def unstack_layers(params: dict) -> dict:
    """Params of the scanned model -> the unscanned model's (`layer_0` ... `layer_{n-1}`,
    the names `jaxtpu.weights` maps to Hugging Face's)."""
    enc = params["bert"]["encoder"]
    stacked = enc[SCANNED]["layer"]
    n = jax.tree_util.tree_leaves(stacked)[0].shape[0]
    layers = {
        f"layer_{i}": jax.tree_util.tree_map(lambda x, i=i: np.asarray(x[i]), stacked)
        for i in range(n)
    }
    shared = {k: v for k, v in enc.items() if k != SCANNED}
    return _with_encoder(params, {**shared, **layers})


def _with_encoder(params: dict, encoder: dict) -> dict:
    bert = {**params["bert"], "encoder": encoder}
    return {**params, "bert": bert}
