"""What every layer kind shares: dense layers with jaxtpu's precision (bf16 matmuls, fp32
accumulation, `--matmul-output`), LayerNorm in fp32, the residual stream's logical axes, the
`--remat` policies, and converting params between a scanned layer stack and `layer_i`'s.
Architecture only: knows nothing of devices."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.lora import LoraSpec
from jaxtpu.models import ops

Dtype = jnp.dtype


@dataclass(frozen=True)
class LayerConfig(EncoderConfig):
    """What the Flax layers read: the encoder's architecture (the checkpoint's config.json)
    and what the run adds to its dense layers, LoRA's adapters (`jaxtpu.core.lora`), which
    the checkpoint's record (`EncoderConfig`) never carries (`create_module` makes this)."""

    lora: LoraSpec | None = None

    @classmethod
    def of(cls, enc: EncoderConfig, lora: LoraSpec | None) -> LayerConfig:
        return cls(**{f.name: getattr(enc, f.name) for f in fields(enc)}, lora=lora)


def dense(
    cfg: EncoderConfig,
    features: int,
    name: str,
    dtype: Dtype,
    param_dtype: Dtype,
    out: Dtype = jnp.float32,
    use_bias: bool = True,
):
    """A dense layer; under bf16 (fp16) compute its matmul is bf16 (fp16) with fp32
    accumulation and its result in `out` (`--matmul-output`)."""
    extra = {}
    if ops.is_half(dtype):
        half = jnp.dtype(dtype).type
        extra = {"dot_general": partial(ops.mixed_dot_general, out=out, half=half)}
    lora = getattr(cfg, "lora", None)  # a `LayerConfig`'s; a bare encoder's has none
    if lora and name in lora.targets:
        return LoraDense(
            features,
            lora,
            use_bias=use_bias,
            dtype=dtype,
            param_dtype=param_dtype,
            kernel_init=nn.initializers.normal(cfg.initializer_range),
            name=name,
            **extra,
        )
    return nn.Dense(
        features,
        dtype=dtype,
        param_dtype=param_dtype,
        kernel_init=nn.initializers.normal(cfg.initializer_range),
        use_bias=use_bias,
        name=name,
        **extra,
    )


class LoraDense(nn.Module):
    """A frozen dense layer plus a LoRA adapter (`jaxtpu.core.lora`): x W + b + (alpha / r)
    dropout(x) A B, params `kernel` and `bias` as `nn.Dense` names them and `lora_a` (in, r),
    `lora_b` (r, out, zeros at init). Every matmul as `dense` makes it. The dropout draws
    from the `dropout` stream when the call has one (training) and is off otherwise, as peft's
    is in `eval()`."""

    features: int
    lora: LoraSpec
    use_bias: bool = True
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    kernel_init: nn.initializers.Initializer = nn.initializers.normal(0.02)
    dot_general: Callable[..., jax.Array] | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        lora, width = self.lora, x.shape[-1]
        kernel = self.param("kernel", self.kernel_init, (width, self.features), self.param_dtype)
        bias = (
            self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype)
            if self.use_bias
            else None
        )
        zeros, rank = nn.initializers.zeros, lora.rank
        a = self.param("lora_a", zeros, (width, rank), self.param_dtype)  # seeded on load
        b = self.param("lora_b", zeros, (rank, self.features), self.param_dtype)
        dot = self.dot_general or jax.lax.dot_general
        dims = (((x.ndim - 1,), (0,)), ((), ()))
        inputs, kernel, a, b = (t.astype(self.dtype) for t in (x, kernel, a, b))
        y = dot(inputs, kernel, dims)
        if bias is not None:
            y = y + bias.astype(self.dtype)
        dropped = ops.Dropout(lora.dropout)(inputs, deterministic=not self.has_rng("dropout"))
        low = dot(dropped, a, dims).astype(self.dtype)
        update = dot(low, b, dims) * jnp.asarray(lora.scaling, jnp.float32)
        return y + update.astype(y.dtype)


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
# mesh axes (flax's `nn.logical_axis_rules`, see `jaxtpu.engine.parallel`), so the activations stay
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


def stack_layers(params: dict, first: int = 0, period: int = 0) -> dict:
    """Params of the unscanned model -> the scanned model's; the inverse of `unstack_layers`.

    `period` 0 (the BERT layer kind): every `layer_i` stacked on a leading axis under
    `encoder/layers/layer`. `period` p (ModernBERT): `layer_0` .. `layer_{first-1}` stay as
    they are, and the rest, in groups of p consecutive layers, go under
    `encoder/layers/layer_{j}` (layer first + g x p + j at index g)."""
    enc = params["bert"]["encoder"]
    n = sum(_is_layer(name) for name in enc)
    shared = {k: v for k, v in enc.items() if not _is_layer(k)}

    def stack(indices: range) -> dict:
        return jax.tree_util.tree_map(
            lambda *xs: np.stack(xs), *[enc[f"layer_{i}"] for i in indices]
        )

    if not period:
        return _with_encoder(params, {**shared, SCANNED: {"layer": stack(range(n))}})
    if n <= first:
        return params  # nothing to scan
    kept = {f"layer_{i}": enc[f"layer_{i}"] for i in range(first)}
    group = {f"layer_{j}": stack(range(first + j, n, period)) for j in range(period)}
    return _with_encoder(params, {**shared, **kept, SCANNED: group})


def unstack_layers(params: dict) -> dict:
    """Params of the scanned model -> the unscanned model's (`layer_0` ... `layer_{n-1}`,
    the names `jaxtpu.engine.weights` maps to Hugging Face's), in either form `stack_layers`
    makes."""
    enc = params["bert"]["encoder"]
    if SCANNED not in enc:
        return params  # nothing was scanned
    scanned = enc[SCANNED]
    kept = {k: v for k, v in enc.items() if k != SCANNED}
    first = sum(_is_layer(name) for name in kept)
    groups = (
        [scanned["layer"]]
        if "layer" in scanned
        else [scanned[f"layer_{j}"] for j in range(len(scanned))]
    )
    count = jax.tree_util.tree_leaves(groups[0])[0].shape[0]
    out = {}
    for g in range(count):
        for j, stacked in enumerate(groups):
            i = first + g * len(groups) + j
            out[f"layer_{i}"] = jax.tree_util.tree_map(lambda x, g=g: np.asarray(x[g]), stacked)
    return _with_encoder(params, {**kept, **out})


def _with_encoder(params: dict, encoder: dict) -> dict:
    bert = {**params["bert"], "encoder": encoder}
    return {**params, "bert": bert}
