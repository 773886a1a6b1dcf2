"""The EuroBERT layer kind: transformers' `EuroBertModel` (Llama-style layers, bidirectional),
operation for operation, built from the ModernBERT layer kind's pieces (rotary embedding, the
pre-norm residual layer, the scanned group); and the same layers as the decoder kind
(transformers' `Qwen3Model`, `Qwen2Model`, `LlamaModel`).

What differs from ModernBERT (`jaxtpu.models.modernbert`): RMSNorm instead of LayerNorm, before
every layer's attention (layer 0 too) and after the last layer (`norm`); separate `q_proj`,
`k_proj`, `v_proj`, `o_proj` with grouped-query attention (`num_key_value_heads` key/value
heads, each shared by heads / kv-heads query heads); one rotary base; every layer global; a
SwiGLU feed-forward (silu(`gate_proj`) x `up_proj`, `down_proj`); no embedding norm or dropout,
and only the attention dropout. Module names are Hugging Face's, the layers `encoder/layer_{i}`
(renamed to `layers.{i}` by the family table).

What the decoders add, each read from the config (EuroBERT's leave them off): causal attention
(the kind record's `causal`: a token attends to itself and the real tokens before it); heads of
`head_dim` (Qwen3's 128 need not be hidden / heads); biases on `q_proj`, `k_proj`, `v_proj`
(Qwen2: `qkv_bias`); Qwen3's RMSNorm of each head's queries and keys before the rotation
(`qk_norm`); Llama 3.1's `llama3` scaling of the rotary frequencies (`rope_scaling`). Positions
are 0..L-1 whatever the padding, as transformers numbers them when a classifier is given no
`position_ids`. Architecture only: knows nothing of devices.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.models import layers, modernbert, ops

Dtype = jnp.dtype


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) x scale, in fp32 (transformers' `EuroBertRMSNorm`)."""

    eps: float
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
        x = x.astype(jnp.float32)
        x = x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + self.eps)
        return scale.astype(jnp.float32) * x


def inverse_frequencies(cfg: EncoderConfig) -> np.ndarray:
    """The rotary inverse frequencies theta^(-2k / head_dim), (head_dim / 2,) fp32, with Llama
    3.1's `llama3` scaling when the config has it (transformers' `_compute_llama3_parameters`):
    wavelengths longer than original / low_freq_factor are divided by `factor`, shorter than
    original / high_freq_factor kept, and those between blended smoothly."""
    d = cfg.attention_head_size
    inv = 1.0 / (cfg.global_rope_theta ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))
    inv = inv.astype(np.float32)
    if not cfg.rope_scaling:
        return inv
    factor, low, high, original = cfg.rope_scaling
    low_wavelen, high_wavelen = original / low, original / high
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rotary_tables(cfg: EncoderConfig, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) of positions 0..length-1, (L, head_dim) fp32 (`modernbert.rotary_tables`'s
    layout, from `inverse_frequencies`)."""
    angles = np.arange(length, dtype=np.float32)[:, None] * inverse_frequencies(cfg)[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def causal_bias(attention_mask: jax.Array) -> jax.Array:
    """(B, 1, L, L) additive bias of a decoder: 0 where a query may attend a key (the key is
    not after it and is not padding), `modernbert.NEG` elsewhere."""
    length = attention_mask.shape[-1]
    causal = np.tril(np.ones((length, length), bool))[None, None]
    allowed = causal & (attention_mask[:, None, None, :] > 0)
    return jnp.where(allowed, 0.0, modernbert.NEG).astype(jnp.float32)


class Attention(nn.Module):
    """Grouped-query self-attention with rotary positions over every (unpadded) token, or with
    the additive `bias` a decoder's Backbone gives, over the real tokens up to each one."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)

    @nn.compact
    def __call__(self, x: jax.Array, bias: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.cfg
        heads = cfg.num_attention_heads
        kv_heads = cfg.num_key_value_heads or heads
        head_dim = cfg.attention_head_size
        batch, length, _ = x.shape

        def project(name: str, n: int, norm: str = "") -> jax.Array:
            dense = layers.layer_dense(self, n * head_dim, name, use_bias=cfg.qkv_bias)
            y = layers.saved(dense(x)).reshape(batch, length, n, head_dim)
            if norm and cfg.qk_norm:  # Qwen3: each head's vector, before the rotation
                y = RMSNorm(cfg.layer_norm_eps, self.param_dtype, name=norm)(y)
                y = y.astype(self.dtype)
            return jnp.moveaxis(y, 2, 1)  # (B, n, L, D)

        q = project("q_proj", heads, "q_norm")
        k = project("k_proj", kv_heads, "k_norm")
        v = project("v_proj", kv_heads)
        cos, sin = rotary_tables(cfg, length)
        q, k = modernbert.apply_rotary(q, cos, sin), modernbert.apply_rotary(k, cos, sin)
        # each key/value head serves heads / kv_heads consecutive query heads (`repeat_kv`)
        k, v = jnp.repeat(k, heads // kv_heads, axis=1), jnp.repeat(v, heads // kv_heads, axis=1)
        q = q * jnp.asarray(1.0 / math.sqrt(head_dim), q.dtype)
        scores = ops.matmul("bhqd,bhkd->bhqk", q, k, self.dtype, self.matmul_out)
        probs = jax.nn.softmax(scores.astype(jnp.float32) + bias, axis=-1)
        probs = ops.Dropout(cfg.attention_probs_dropout_prob)(probs, deterministic=deterministic)
        ctx = ops.matmul("bhqk,bhkd->bhqd", probs, v, self.dtype, self.matmul_out)
        ctx = ctx.transpose(0, 2, 1, 3).reshape(batch, length, heads * head_dim)
        return layers.saved(
            layers.layer_dense(self, cfg.hidden_size, "o_proj", use_bias=False)(ctx)
        )


class MLP(nn.Module):
    """SwiGLU: down_proj(silu(gate_proj(x)) x up_proj(x))."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        inner = self.cfg.intermediate_size
        gate = layers.saved(layers.layer_dense(self, inner, "gate_proj", use_bias=False)(x))
        up = layers.saved(layers.layer_dense(self, inner, "up_proj", use_bias=False)(x))
        y = jax.nn.silu(gate) * up
        down = layers.layer_dense(self, self.cfg.hidden_size, "down_proj", use_bias=False)
        return layers.saved(down(y))


class Layer(nn.Module):
    """x + self_attn(input_layernorm(x)), then + mlp(post_attention_layernorm(.))."""

    cfg: EncoderConfig
    index: int = 0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)

    @nn.compact
    def __call__(self, x: jax.Array, bias: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.cfg
        kw = dict(cfg=cfg, dtype=self.dtype, param_dtype=self.param_dtype)
        kw["matmul_out"] = self.matmul_out
        eps, p = cfg.layer_norm_eps, self.param_dtype
        h = RMSNorm(eps, p, name="input_layernorm")(x)
        x = x + Attention(**kw, name="self_attn")(h, bias, deterministic).astype(jnp.float32)
        h = RMSNorm(eps, p, name="post_attention_layernorm")(x)
        x = x + MLP(**kw, name="mlp")(h).astype(jnp.float32)
        return layers.residual(x)


class Backbone(nn.Module):
    """embed_tokens -> the layers (`modernbert.Encoder` with this kind's `Layer`; scanned as
    one stack: every layer is alike; causal for a decoder) -> norm. Returns
    (last_hidden_state fp32, None)."""

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
        x = nn.Embed(
            cfg.vocab_size,
            cfg.hidden_size,
            param_dtype=self.param_dtype,
            embedding_init=nn.initializers.normal(cfg.initializer_range),
            name="embed_tokens",
        )(input_ids)
        x = layers.residual(x.astype(jnp.float32))
        if cfg.family.kind.causal:
            bias = causal_bias(attention_mask)
        else:
            bias = jnp.where(attention_mask[:, None, None, :] > 0, 0.0, modernbert.NEG)
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype, matmul_out=self.matmul_out)
        encoder = modernbert.Encoder(
            cfg, **kw, remat=self.remat, scan=self.scan, layer=Layer, name="encoder"
        )
        x = encoder(x, bias.astype(jnp.float32), deterministic)
        return RMSNorm(cfg.layer_norm_eps, self.param_dtype, name="norm")(x), None
