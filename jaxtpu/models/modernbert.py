"""The ModernBERT layer kind (ModernBERT, and mmBERT, which is a ModernBERT with another
vocabulary): transformers' `ModernBertModel`, operation for operation.

What differs from the BERT layer kind (`jaxtpu.models.bert`): no biases and LayerNorms without
a bias; the LayerNorm before each block (pre-LN) instead of after it, none before the first
layer's attention and a final one after the last layer; one fused `Wqkv` projection (its output
is [query | key | value], each heads x head_dim); rotary position embeddings instead of a
position table, with a base per attention kind; every layer's attention either global or a
sliding window (`layer_types`: a token attends to the tokens at most `local_attention // 2`
away, padding masked either way); a GeGLU feed-forward (`Wi` to twice the intermediate width,
gelu(first half) x second half, `Wo`); and three dropouts of its own (embeddings, attention
probabilities and output, inside the feed-forward). A sliding-window layer at long lengths is
computed banded, without the L x L matrix (`banded`); scanned, layer 0 runs on its own and the
rest in groups of the layer-kind period (`Encoder`).

Module names mirror Hugging Face's (`embeddings/tok_embeddings`, `attn/Wqkv`, `mlp/Wi`,
`final_norm`), except that the layers are `encoder/layer_{i}` as in every jaxtpu encoder (the
family table renames them to `layers.{i}`). Precision as in `jaxtpu.models.bert`: bf16
matmuls, and softmax, LayerNorm, the rotary embedding and the residual stream in fp32.
Architecture only: knows nothing of devices.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.hf.kinds import SLIDING
from jaxtpu.models import layers, ops

Dtype = jnp.dtype
NEG = -1e9  # the additive bias of a key a query must not attend to


def rotary_tables(length: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) of the rotary embedding of positions 0..length-1, (L, head_dim) fp32, as
    transformers' default RoPE computes them: inverse frequencies theta^(-2k / head_dim) for
    k < head_dim / 2, each angle used twice (the two halves that `_rotate_half` pairs).
    Computed on the host: the length is static."""
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    angles = np.arange(length, dtype=np.float32)[:, None] * inv.astype(np.float32)[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _rotate_half(x: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rotary(x: jax.Array, cos: np.ndarray, sin: np.ndarray) -> jax.Array:
    """The rotary embedding of x (..., L, D), computed in fp32, returned in x's dtype."""
    x32 = x.astype(jnp.float32)
    return (x32 * cos + _rotate_half(x32) * sin).astype(x.dtype)


def window_bias(length: int, half_window: int) -> np.ndarray:
    """(1, 1, L, L) additive bias of a sliding-window layer: 0 where |query - key| <=
    half_window, NEG elsewhere (transformers' bidirectional sliding-window mask)."""
    pos = np.arange(length)
    inside = np.abs(pos[:, None] - pos[None, :]) <= half_window
    return np.where(inside, 0.0, NEG).astype(np.float32)[None, None]


def banded(length: int, half_window: int) -> bool:
    """Whether a sliding-window layer at `length` tokens computes its scores in the banded
    form (`Attention._banded`: each chunk of `half_window` queries against its own and the two
    neighbouring chunks' keys, 3 x half_window scores per query) rather than as the full
    L x L matrix with the band masked: from 8 half-windows (512 tokens for ModernBERT's
    128-token window), where `benchmarks.training.local_attention` found it faster both on this CPU
    (1.7x at 512, 4.9x at 2,048) and in the roofline estimate of the v5e program (1.15x at
    512, 4.5x at 2,048); at 384 tokens the CPU still gains (1.3x) but the v5e estimate loses
    (0.7x), so the TPU decides (docs/families.md, "Sliding-window attention")."""
    return length >= 8 * half_window


def _windows(x: jax.Array, chunk: int, fill: float = 0.0) -> jax.Array:
    """(B, [H,] L, ...) -> (B, [H,] n, 3 x chunk, ...): for each chunk of `chunk` positions,
    the positions of the chunk before it, itself and the one after (`fill` outside 0..L-1),
    n = ceil(L / chunk); positions are axis 2 of a 4-d (B, H, L, D), axis 1 otherwise."""
    axis = 2 if x.ndim == 4 else 1
    length = x.shape[axis]
    n = -(-length // chunk)
    widths = [(0, 0)] * x.ndim
    widths[axis] = (chunk, (n * chunk - length) + chunk)
    x = jnp.pad(x, widths, constant_values=fill)
    x = x.reshape(*x.shape[:axis], n + 2, chunk, *x.shape[axis + 1 :])
    parts = [jax.lax.slice_in_dim(x, i, i + n, axis=axis) for i in range(3)]
    return jnp.concatenate(parts, axis=axis + 1)


class Attention(nn.Module):
    """Fused-QKV self-attention with rotary positions; a sliding-window layer adds the band
    to the padding mask. `sliding` is the layer's kind (`layer_types`); `local_form` how a
    sliding layer computes: 'auto' (`banded`'s rule), 'full' or 'banded' (the same function,
    for tests and `benchmarks.training.local_attention`)."""

    cfg: EncoderConfig
    sliding: bool = False
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)
    local_form: str = "auto"

    @nn.compact
    def __call__(self, x: jax.Array, pad_bias: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.cfg
        heads = cfg.num_attention_heads
        head_dim = cfg.hidden_size // heads
        batch, length, _ = x.shape
        qkv = layers.saved(layers.layer_dense(self, 3 * cfg.hidden_size, "Wqkv", use_bias=False)(x))
        # (B, L, 3, H, D) -> three (B, H, L, D): the bhqd layout, fast on XLA:CPU
        qkv = jnp.moveaxis(qkv.reshape(batch, length, 3, heads, head_dim), (2, 3), (0, 2))
        q, k, v = qkv[0], qkv[1], qkv[2]
        theta = cfg.local_rope_theta if self.sliding else cfg.global_rope_theta
        cos, sin = rotary_tables(length, head_dim, theta)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q = q * jnp.asarray(1.0 / math.sqrt(head_dim), q.dtype)
        half = cfg.local_attention // 2
        form = self.local_form
        if form == "auto":
            form = "banded" if banded(length, half) else "full"
        if self.sliding and form == "banded":
            ctx = self._banded(q, k, v, pad_bias, half, deterministic)
        else:
            bias = pad_bias + window_bias(length, half) if self.sliding else pad_bias
            scores = ops.matmul("bhqd,bhkd->bhqk", q, k, self.dtype, self.matmul_out)
            probs = self._probs(scores, bias, deterministic)
            ctx = ops.matmul("bhqk,bhkd->bhqd", probs, v, self.dtype, self.matmul_out)
        ctx = ctx.transpose(0, 2, 1, 3).reshape(batch, length, cfg.hidden_size)
        out = layers.saved(layers.layer_dense(self, cfg.hidden_size, "Wo", use_bias=False)(ctx))
        return ops.Dropout(cfg.attention_probs_dropout_prob)(out, deterministic=deterministic)

    def _probs(self, scores: jax.Array, bias: jax.Array, deterministic: bool) -> jax.Array:
        """Softmax in fp32 over the last axis, then attention dropout."""
        probs = jax.nn.softmax(scores.astype(jnp.float32) + bias, axis=-1)
        rate = self.cfg.attention_probs_dropout_prob
        return ops.Dropout(rate)(probs, deterministic=deterministic)

    def _banded(self, q, k, v, pad_bias, half: int, deterministic: bool) -> jax.Array:
        """The sliding-window layer's attention without the L x L matrix: queries in chunks
        of `half` positions, each against the keys of its chunk and the two beside it (which
        hold every key within `half` of each of its queries), the band and the padding
        masked there. (B, H, L, D) in and out; the same function as the masked full form."""
        length = q.shape[2]
        n = -(-length // half)
        qb = jnp.pad(q, ((0, 0), (0, 0), (0, n * half - length), (0, 0)))
        qb = qb.reshape(*q.shape[:2], n, half, q.shape[-1])
        kw, vw = _windows(k, half), _windows(v, half)  # (B, H, n, 3 x half, D)
        scores = ops.matmul("bhncd,bhnkd->bhnck", qb, kw, self.dtype, self.matmul_out)
        query = np.arange(n)[:, None, None] * half + np.arange(half)[None, :, None]
        key = (np.arange(n)[:, None, None] - 1) * half + np.arange(3 * half)[None, None, :]
        band = np.where(np.abs(query - key) <= half, 0.0, NEG).astype(np.float32)
        keys = _windows(pad_bias[:, 0, 0, :], half, NEG)  # (B, n, 3 x half)
        probs = self._probs(scores, band + keys[:, None, :, None, :], deterministic)
        ctx = ops.matmul("bhnck,bhnkd->bhncd", probs, vw, self.dtype, self.matmul_out)
        return ctx.reshape(*q.shape[:2], n * half, q.shape[-1])[:, :, :length]


class MLP(nn.Module):
    """GeGLU: Wi -> gelu(input) x gate -> dropout -> Wo."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.cfg
        wi = layers.layer_dense(self, 2 * cfg.intermediate_size, "Wi", use_bias=False)
        inner, gate = jnp.split(layers.saved(wi(x)), 2, axis=-1)
        y = ops.gelu(inner) * gate
        y = ops.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
        return layers.saved(layers.layer_dense(self, cfg.hidden_size, "Wo", use_bias=False)(y))


class Layer(nn.Module):
    """One pre-LN layer: x + attn(attn_norm(x)), then + mlp(mlp_norm(.)); layer 0 has no
    attention norm (its input is the embeddings' norm)."""

    cfg: EncoderConfig
    index: int = 0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)

    @nn.compact
    def __call__(self, x: jax.Array, pad_bias: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.cfg
        kw = dict(cfg=cfg, dtype=self.dtype, param_dtype=self.param_dtype)
        kw["matmul_out"] = self.matmul_out
        h = x
        if self.index > 0:
            h = layers.layer_norm(cfg, "attn_norm", self.param_dtype, use_bias=False)(x)
        sliding = cfg.layer_types[self.index] == SLIDING
        attn = Attention(**kw, sliding=sliding, name="attn")
        x = x + attn(h, pad_bias, deterministic).astype(jnp.float32)
        h = layers.layer_norm(cfg, "mlp_norm", self.param_dtype, use_bias=False)(x)
        x = x + MLP(**kw, name="mlp")(h, deterministic).astype(jnp.float32)
        return layers.residual(x)


class _ScanGroup(nn.Module):
    """One period of layers (`scan_period`: the kinds repeat after it), layers `first` ..
    `first + period - 1` of the model, in the (carry, x) -> (carry, y) form `nn.scan` runs:
    each group of the stack computes what those layers compute, with its own weights."""

    cfg: EncoderConfig
    first: int = 1
    period: int = 1
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)
    deterministic: bool = True
    layer: Any = None  # the layer kind's layer module (default: this module's `Layer`)

    @nn.compact
    def __call__(self, x: jax.Array, pad_bias: jax.Array) -> tuple[jax.Array, None]:
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype, matmul_out=self.matmul_out)
        for j in range(self.period):
            layer = (self.layer or Layer)(self.cfg, self.first + j, **kw, name=f"layer_{j}")
            x = layer(x, pad_bias, self.deterministic)
        return x, None


class Encoder(nn.Module):
    """`layer_0` ... `layer_{n-1}` of the layer kind's `layer` module (this module's `Layer`
    by default; EuroBERT's too); with `scan`, the layers its kind's `scan_layout` keeps apart
    (ModernBERT's `layer_0`: no attention norm) and then one `layers` module scanning groups of
    its period, whose params carry a leading group axis (`jaxtpu.models.layers.stack_layers`
    converts)."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)
    remat: str = "none"
    scan: bool = False
    layer: Any = None

    @nn.compact
    def __call__(self, x: jax.Array, pad_bias: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.cfg
        layer = self.layer or Layer
        if self.remat != "none":
            # argument 3 of Layer.__call__ (self = 0) is the Python bool `deterministic`
            layer = nn.remat(layer, policy=layers.REMAT[self.remat], static_argnums=(3,))
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype, matmul_out=self.matmul_out)
        first, period = cfg.family.kind.scan_layout(cfg.layer_types)
        unscanned = first if self.scan else cfg.num_hidden_layers
        for i in range(unscanned):
            x = layer(cfg, i, **kw, name=f"layer_{i}")(x, pad_bias, deterministic)
        if not self.scan or cfg.num_hidden_layers <= first:
            return x
        block = _ScanGroup
        if self.remat != "none":
            block = nn.remat(block, policy=layers.REMAT[self.remat], prevent_cse=False)
        stack = nn.scan(
            block,
            variable_axes={"params": 0},
            split_rngs={"params": True, "dropout": True},
            in_axes=nn.broadcast,
            length=(cfg.num_hidden_layers - first) // period,
        )
        group = stack(
            cfg,
            first,
            period,
            **kw,
            deterministic=deterministic,
            layer=self.layer,
            name=layers.SCANNED,
        )
        x, _ = group(x, pad_bias)
        return x


class Backbone(nn.Module):
    """Embeddings (tok_embeddings -> norm -> dropout), the layers, final_norm. Returns
    (last_hidden_state fp32, None): ModernBERT has no pooler. The same interface as
    `jaxtpu.models.bert.Backbone`, whose place it takes under 'bert' in `Classifier`."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)
    remat: str = "none"
    scan: bool = False

    @nn.compact
    def __call__(
        self, input_ids: jax.Array, attention_mask: jax.Array, deterministic: bool = True
    ) -> tuple[jax.Array, None]:
        cfg = self.cfg
        embeddings = _Embeddings(cfg, self.param_dtype, name="embeddings")
        x = embeddings(input_ids, deterministic)
        # Additive mask over keys, (B, 1, 1, L): 0 where attended, NEG at padding.
        pad_bias = jnp.where(attention_mask[:, None, None, :] > 0, 0.0, NEG).astype(jnp.float32)
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype, matmul_out=self.matmul_out)
        encoder = Encoder(cfg, **kw, remat=self.remat, scan=self.scan, name="encoder")
        x = encoder(x, pad_bias, deterministic)
        x = layers.layer_norm(cfg, "final_norm", self.param_dtype, use_bias=False)(x)
        return x, None


class _Embeddings(nn.Module):
    cfg: EncoderConfig
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, input_ids: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.cfg
        x = nn.Embed(
            cfg.vocab_size,
            cfg.hidden_size,
            param_dtype=self.param_dtype,
            embedding_init=nn.initializers.normal(cfg.initializer_range),
            name="tok_embeddings",
        )(input_ids)
        x = layers.layer_norm(cfg, "norm", self.param_dtype, use_bias=False)(x.astype(jnp.float32))
        x = ops.Dropout(cfg.embedding_dropout)(x, deterministic=deterministic)
        return layers.residual(x)
