"""The EuroBERT layer kind: transformers' `EuroBertModel` (Llama-style layers, bidirectional),
operation for operation, built from the ModernBERT layer kind's pieces (rotary embedding, the
pre-norm residual layer, the scanned group).

What differs from ModernBERT (`jaxtpu.models.modernbert`): RMSNorm instead of LayerNorm, before
every layer's attention (layer 0 too) and after the last layer (`norm`); separate `q_proj`,
`k_proj`, `v_proj`, `o_proj` with grouped-query attention (`num_key_value_heads` key/value
heads, each shared by heads / kv-heads query heads); one rotary base; every layer global; a
SwiGLU feed-forward (silu(`gate_proj`) x `up_proj`, `down_proj`); no embedding norm or dropout,
and only the attention dropout. Module names are Hugging Face's, the layers `encoder/layer_{i}`
(renamed to `layers.{i}` by the family table). Architecture only: knows nothing of devices.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

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


class Attention(nn.Module):
    """Grouped-query self-attention with rotary positions over every (unpadded) token."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)

    @nn.compact
    def __call__(self, x: jax.Array, pad_bias: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.cfg
        heads = cfg.num_attention_heads
        kv_heads = cfg.num_key_value_heads or heads
        head_dim = cfg.hidden_size // heads
        batch, length, _ = x.shape

        def project(name: str, n: int) -> jax.Array:
            dense = layers.layer_dense(self, n * head_dim, name, use_bias=False)
            y = layers.saved(dense(x)).reshape(batch, length, n, head_dim)
            return jnp.moveaxis(y, 2, 1)  # (B, n, L, D)

        q, k, v = project("q_proj", heads), project("k_proj", kv_heads), project("v_proj", kv_heads)
        cos, sin = modernbert.rotary_tables(length, head_dim, cfg.global_rope_theta)
        q, k = modernbert.apply_rotary(q, cos, sin), modernbert.apply_rotary(k, cos, sin)
        # each key/value head serves heads / kv_heads consecutive query heads (`repeat_kv`)
        k, v = jnp.repeat(k, heads // kv_heads, axis=1), jnp.repeat(v, heads // kv_heads, axis=1)
        q = q * jnp.asarray(1.0 / math.sqrt(head_dim), q.dtype)
        scores = ops.matmul("bhqd,bhkd->bhqk", q, k, self.dtype, self.matmul_out)
        probs = jax.nn.softmax(scores.astype(jnp.float32) + pad_bias, axis=-1)
        probs = ops.Dropout(cfg.attention_probs_dropout_prob)(probs, deterministic=deterministic)
        ctx = ops.matmul("bhqk,bhkd->bhqd", probs, v, self.dtype, self.matmul_out)
        ctx = ctx.transpose(0, 2, 1, 3).reshape(batch, length, cfg.hidden_size)
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
    def __call__(self, x: jax.Array, pad_bias: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.cfg
        kw = dict(cfg=cfg, dtype=self.dtype, param_dtype=self.param_dtype)
        kw["matmul_out"] = self.matmul_out
        eps, p = cfg.layer_norm_eps, self.param_dtype
        h = RMSNorm(eps, p, name="input_layernorm")(x)
        x = x + Attention(**kw, name="self_attn")(h, pad_bias, deterministic).astype(jnp.float32)
        h = RMSNorm(eps, p, name="post_attention_layernorm")(x)
        x = x + MLP(**kw, name="mlp")(h).astype(jnp.float32)
        return layers.residual(x)


class Backbone(nn.Module):
    """embed_tokens -> the layers (`modernbert.Encoder` with this kind's `Layer`; scanned as
    one stack: every layer is alike) -> norm. Returns (last_hidden_state fp32, None)."""

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
        pad_bias = jnp.where(attention_mask[:, None, None, :] > 0, 0.0, modernbert.NEG)
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype, matmul_out=self.matmul_out)
        encoder = modernbert.Encoder(
            cfg, **kw, remat=self.remat, scan=self.scan, layer=Layer, name="encoder"
        )
        x = encoder(x, pad_bias.astype(jnp.float32), deterministic)
        return RMSNorm(cfg.layer_norm_eps, self.param_dtype, name="norm")(x), None
