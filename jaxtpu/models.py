"""Flax Linen BERT encoder and the Jigsaw head. Architecture only: knows nothing of devices.

Module and parameter names mirror Hugging Face's `BertModel` (`embeddings/LayerNorm`,
`encoder/layer_3/attention/self/query`, ...) so `jaxtpu.weights` maps them with one table.

Precision: `dtype` is the compute dtype (bf16 or fp32), `param_dtype` the storage dtype
(fp32 master weights). Softmax, LayerNorm and the residual stream run in fp32, as PyTorch's
autocast does; the logits are returned in fp32.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jaxtpu import ops
from jaxtpu.core.config import EncoderConfig

Dtype = jnp.dtype


def _dense(cfg: EncoderConfig, features: int, name: str, dtype: Dtype, param_dtype: Dtype):
    extra = {"dot_general": ops.mixed_dot_general} if dtype == jnp.bfloat16 else {}
    return nn.Dense(
        features,
        dtype=dtype,
        param_dtype=param_dtype,
        kernel_init=nn.initializers.normal(cfg.initializer_range),
        name=name,
        **extra,
    )


# The name every dense (weight) matmul output carries, for `--remat dots`.
DENSE_OUT = "dense_out"


def _saved(y: jax.Array) -> jax.Array:
    """Marks a dense layer's output as one that `--remat dots` keeps (a no-op otherwise)."""
    return checkpoint_name(y, DENSE_OUT)


# Logical names of the residual stream's axes. A strategy that shards the weights maps them to
# mesh axes (flax's `nn.logical_axis_rules`, see `jaxtpu.parallel`), so the activations stay
# split by batch rows; without rules these constraints do nothing.
RESIDUAL = ("batch", "length", "embed")


def _residual(x: jax.Array) -> jax.Array:
    return nn.with_logical_constraint(x, RESIDUAL)


def _layer_norm(cfg: EncoderConfig, name: str, param_dtype: Dtype) -> nn.LayerNorm:
    return nn.LayerNorm(
        epsilon=cfg.layer_norm_eps, dtype=jnp.float32, param_dtype=param_dtype, name=name
    )


class Embeddings(nn.Module):
    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, input_ids: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.cfg
        init = nn.initializers.normal(cfg.initializer_range)

        def embed(num: int, name: str) -> nn.Embed:
            return nn.Embed(
                num, cfg.hidden_size, param_dtype=self.param_dtype, embedding_init=init, name=name
            )

        seq_len = input_ids.shape[-1]
        x = embed(cfg.vocab_size, "word_embeddings")(input_ids)
        x = x + embed(cfg.max_position_embeddings, "position_embeddings")(jnp.arange(seq_len))
        # Token type 0 everywhere (single-segment inputs): row 0 of the table.
        x = x + embed(cfg.type_vocab_size, "token_type_embeddings")(jnp.zeros((1,), jnp.int32))
        x = _layer_norm(cfg, "LayerNorm", self.param_dtype)(x.astype(jnp.float32))
        return ops.Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)


class SelfAttention(nn.Module):
    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, mask_bias: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.cfg
        heads = cfg.num_attention_heads
        head_dim = cfg.hidden_size // heads
        batch, seq_len, _ = x.shape

        def project(name: str) -> jax.Array:
            y = _saved(_dense(cfg, cfg.hidden_size, name, self.dtype, self.param_dtype)(x))
            # (B, L, H, D) -> (B, H, L, D): the bhqd layout is the fast one on XLA:CPU.
            return y.reshape(batch, seq_len, heads, head_dim).transpose(0, 2, 1, 3)

        q, k, v = project("query"), project("key"), project("value")
        q = q * jnp.asarray(1.0 / math.sqrt(head_dim), q.dtype)
        scores = ops.matmul("bhqd,bhkd->bhqk", q, k, self.dtype)
        probs = jax.nn.softmax(scores.astype(jnp.float32) + mask_bias, axis=-1)
        probs = ops.Dropout(cfg.attention_probs_dropout_prob)(probs, deterministic=deterministic)
        ctx = ops.matmul("bhqk,bhkd->bhqd", probs, v, self.dtype)
        return ctx.transpose(0, 2, 1, 3).reshape(batch, seq_len, cfg.hidden_size)


class DenseResidual(nn.Module):
    """Dense -> dropout -> add residual -> LayerNorm (HF's BertSelfOutput / BertOutput)."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, residual: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.cfg
        y = _saved(_dense(cfg, cfg.hidden_size, "dense", self.dtype, self.param_dtype)(x))
        y = ops.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
        return _layer_norm(cfg, "LayerNorm", self.param_dtype)(y.astype(jnp.float32) + residual)


class Layer(nn.Module):
    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    def setup(self) -> None:
        kw = dict(cfg=self.cfg, dtype=self.dtype, param_dtype=self.param_dtype)
        self.attention = _Attention(**kw)
        self.intermediate = _Intermediate(**kw)
        self.output = DenseResidual(**kw)

    def __call__(self, x: jax.Array, mask_bias: jax.Array, deterministic: bool) -> jax.Array:
        x = self.attention(x, mask_bias, deterministic)
        return _residual(self.output(self.intermediate(x), x, deterministic))


class _Attention(nn.Module):
    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    def setup(self) -> None:
        kw = dict(cfg=self.cfg, dtype=self.dtype, param_dtype=self.param_dtype)
        self.self = SelfAttention(**kw)
        self.output = DenseResidual(**kw)

    def __call__(self, x: jax.Array, mask_bias: jax.Array, deterministic: bool) -> jax.Array:
        return self.output(self.self(x, mask_bias, deterministic), x, deterministic)


class _Intermediate(nn.Module):
    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        y = _saved(_dense(cfg, cfg.intermediate_size, "dense", self.dtype, self.param_dtype)(x))
        return jax.nn.gelu(y, approximate=False)  # HF "gelu" is the exact erf form


# `--remat`: what each encoder layer keeps for its backward pass (`jax.checkpoint` policies);
# everything else is recomputed from the layer's input. The params do not change.
REMAT = {
    "layer": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.save_only_these_names(DENSE_OUT),
}


class _ScanBlock(nn.Module):
    """One `Layer` in the (carry, x) -> (carry, y) form `nn.scan` runs."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    deterministic: bool = True

    @nn.compact
    def __call__(self, x: jax.Array, mask_bias: jax.Array) -> tuple[jax.Array, None]:
        layer = Layer(self.cfg, self.dtype, self.param_dtype, name="layer")
        return layer(x, mask_bias, self.deterministic), None


class Encoder(nn.Module):
    """The encoder layers: `layer_0` ... `layer_{n-1}`, or with `scan` one `layers` module
    whose params carry a leading layer axis (`stack_layers` converts between the two)."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    remat: str = "none"
    scan: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, mask_bias: jax.Array, deterministic: bool) -> jax.Array:
        kw = dict(cfg=self.cfg, dtype=self.dtype, param_dtype=self.param_dtype)
        if self.scan:
            block = _ScanBlock
            if self.remat != "none":
                block = nn.remat(block, policy=REMAT[self.remat], prevent_cse=False)
            layers = nn.scan(
                block,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=nn.broadcast,
                length=self.cfg.num_hidden_layers,
            )
            x, _ = layers(**kw, deterministic=deterministic, name=SCANNED)(x, mask_bias)
            return x
        layer = Layer
        if self.remat != "none":
            # argument 3 of Layer.__call__ (self = 0) is the Python bool `deterministic`
            layer = nn.remat(Layer, policy=REMAT[self.remat], static_argnums=(3,))
        for i in range(self.cfg.num_hidden_layers):
            x = layer(**kw, name=f"layer_{i}")(x, mask_bias, deterministic)
        return x


# The scanned encoder's one module: its params are `layer_i`'s stacked on axis 0.
SCANNED = "layers"


def stack_layers(params: dict) -> dict:
    """Params of the unscanned model -> the scanned model's (every `layer_i` stacked on a
    leading axis under `encoder/layers/layer`); the inverse of `unstack_layers`."""
    enc = dict(params["bert"]["encoder"])
    n = len(enc)
    layers = [enc[f"layer_{i}"] for i in range(n)]
    stacked = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *layers)
    return _with_encoder(params, {SCANNED: {"layer": stacked}})


def unstack_layers(params: dict) -> dict:
    """Params of the scanned model -> the unscanned model's (`layer_0` ... `layer_{n-1}`,
    the names `jaxtpu.weights` maps to Hugging Face's)."""
    stacked = params["bert"]["encoder"][SCANNED]["layer"]
    n = jax.tree_util.tree_leaves(stacked)[0].shape[0]
    layers = {
        f"layer_{i}": jax.tree_util.tree_map(lambda x, i=i: np.asarray(x[i]), stacked)
        for i in range(n)
    }
    return _with_encoder(params, layers)


def _with_encoder(params: dict, encoder: dict) -> dict:
    bert = {**params["bert"], "encoder": encoder}
    return {**params, "bert": bert}


class Bert(nn.Module):
    """BERT encoder + pooler. Returns (last_hidden_state, pooled_output), both fp32."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    remat: str = "none"
    scan: bool = False

    @nn.compact
    def __call__(
        self, input_ids: jax.Array, attention_mask: jax.Array, deterministic: bool = True
    ) -> tuple[jax.Array, jax.Array]:
        cfg, kw = self.cfg, dict(dtype=self.dtype, param_dtype=self.param_dtype)
        x = _residual(Embeddings(cfg, name="embeddings", **kw)(input_ids, deterministic))
        # Additive mask over keys, (B, 1, 1, L): 0 where attended, a large negative at padding.
        mask_bias = jnp.where(attention_mask[:, None, None, :] > 0, 0.0, -1e9).astype(jnp.float32)
        encoder = Encoder(cfg, name="encoder", remat=self.remat, scan=self.scan, **kw)
        x = encoder(x, mask_bias, deterministic)
        pooled = _Pooler(cfg, name="pooler", **kw)(x[:, 0])
        return x, pooled.astype(jnp.float32)


class _Pooler(nn.Module):
    """tanh(Dense(first token)), as Hugging Face's BertPooler (whose output it is)."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, cls_token: jax.Array) -> jax.Array:
        dense = _dense(self.cfg, self.cfg.hidden_size, "dense", self.dtype, self.param_dtype)
        return nn.tanh(dense(cls_token))


class Classifier(nn.Module):
    """BERT -> pooled output -> dropout -> Dense(1): one score per comment, the head of every
    task. Inputs may carry extra leading dims (the ranking pairs' (B, 2, L)); the output keeps
    them, so a ranker is this model applied to both comments of a pair.
    """

    cfg: EncoderConfig
    head_dropout: float = 0.0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    remat: str = "none"
    scan: bool = False

    @nn.compact
    def __call__(
        self, input_ids: jax.Array, attention_mask: jax.Array, deterministic: bool = True
    ) -> jax.Array:
        lead = input_ids.shape[:-1]
        flat = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
        bert = Bert(self.cfg, self.dtype, self.param_dtype, self.remat, self.scan, name="bert")
        _, pooled = bert(flat(input_ids), flat(attention_mask), deterministic)
        x = ops.Dropout(self.head_dropout)(pooled, deterministic=deterministic)
        logit = _dense(self.cfg, 1, "classifier", self.dtype, self.param_dtype)(x)
        return logit[:, 0].astype(jnp.float32).reshape(lead)


def create_module(
    cfg: EncoderConfig,
    head_dropout: float,
    precision: str,
    remat: str = "none",
    scan: bool = False,
) -> Classifier:
    """The model with fp32 storage and the compute dtype of `precision` (every task shares it;
    `Task.example_shape` says what its inputs look like); `remat` is a key of `REMAT` or
    'none'; `scan` runs the layers as one `nn.scan` (params as `stack_layers` makes them)."""
    dtype = jnp.bfloat16 if precision == "bf16" else jnp.float32
    return Classifier(
        cfg,
        head_dropout=head_dropout,
        dtype=dtype,
        param_dtype=jnp.float32,
        remat=remat,
        scan=scan,
    )


def init_params(module: nn.Module, example_shape: tuple[int, ...], seed: int) -> dict:
    """Freshly initialised fp32 params of `module` for inputs of one example's shape, on the
    host (numpy)."""
    dummy = jnp.zeros((1, *example_shape), jnp.int32)
    init = jax.jit(lambda key: module.init(key, dummy, dummy)["params"])
    return jax.device_get(init(jax.random.key(seed)))


def abstract_params(module: nn.Module, example_shape: tuple[int, ...]) -> dict:
    """The param tree of `module` as `jax.ShapeDtypeStruct`s: no init is computed."""
    dummy = jnp.zeros((1, *example_shape), jnp.int32)
    return jax.eval_shape(lambda: module.init(jax.random.key(0), dummy, dummy)["params"])


def param_shapes(module: nn.Module, example_shape: tuple[int, ...]) -> dict:
    """The param tree of `module` as zeros, without computing an init (a restore template)."""
    shapes = abstract_params(module, example_shape)
    return jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), shapes)
