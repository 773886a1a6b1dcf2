"""Flax Linen BERT encoder and the two Jigsaw heads. Knows nothing of devices.

Module and parameter names mirror Hugging Face's `BertModel` (`embeddings/LayerNorm`,
`encoder/layer_3/attention/self/query`, ...) so `jaxtpu.weights` maps them with one table.

Precision: `dtype` is the compute dtype (bf16 or fp32), `param_dtype` the storage dtype
(fp32 master weights). Softmax, LayerNorm and the residual stream run in fp32, as PyTorch's
autocast does; the logits are returned in fp32.
"""

from __future__ import annotations

import math
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxtpu.config import EncoderConfig

Dtype = jnp.dtype


# --------------------------------------------------------------------------- bf16 matmuls


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def mixed_einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """A two-operand matmul-type einsum with bf16 operands and fp32 accumulation and result.

    The backward pass runs its two matmuls the same way (bf16 cotangent, fp32 accumulation),
    as torch.autocast does. Letting JAX differentiate `einsum(..., preferred_element_type=f32)`
    instead gives fp32 backward matmuls, which ran 4-7x slower on XLA:CPU (benchmarks/).
    Every index must appear in exactly two of the three terms (true of matmuls).
    """
    return jnp.einsum(
        spec, a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), preferred_element_type=jnp.float32
    )


def _mixed_fwd(spec: str, a: jax.Array, b: jax.Array):
    a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    out = jnp.einsum(spec, a16, b16, preferred_element_type=jnp.float32)
    # Zero-size markers carry the input dtypes, which the cotangents must have.
    return out, (a16, b16, jnp.zeros((0,), a.dtype), jnp.zeros((0,), b.dtype))


def _mixed_bwd(spec: str, res, g: jax.Array):
    a16, b16, a_dtype, b_dtype = res
    ins, out = spec.split("->")
    sa, sb = ins.split(",")
    g16 = g.astype(jnp.bfloat16)
    f32 = jnp.float32
    da = jnp.einsum(f"{out},{sb}->{sa}", g16, b16, preferred_element_type=f32)
    db = jnp.einsum(f"{sa},{out}->{sb}", a16, g16, preferred_element_type=f32)
    return da.astype(a_dtype.dtype), db.astype(b_dtype.dtype)


mixed_einsum.defvjp(_mixed_fwd, _mixed_bwd)


def _mixed_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    """`nn.Dense`'s contraction (last axis of the input with the kernel's first) in bf16."""
    (lc, rc), (lb, rb) = dimension_numbers
    if tuple(lc) != (lhs.ndim - 1,) or tuple(rc) != (0,) or lb or rb:
        raise NotImplementedError(f"unsupported contraction {dimension_numbers}")
    return mixed_einsum("...k,kn->...n", lhs, rhs)


def _dense(cfg: EncoderConfig, features: int, name: str, dtype: Dtype, param_dtype: Dtype):
    extra = {"dot_general": _mixed_dot_general} if dtype == jnp.bfloat16 else {}
    return nn.Dense(
        features,
        dtype=dtype,
        param_dtype=param_dtype,
        kernel_init=nn.initializers.normal(cfg.initializer_range),
        name=name,
        **extra,
    )


def _matmul(spec: str, a: jax.Array, b: jax.Array, dtype: Dtype) -> jax.Array:
    """Attention matmuls: mixed bf16 under bf16 compute, plain fp32 otherwise."""
    if dtype == jnp.bfloat16:
        return mixed_einsum(spec, a, b)
    return jnp.einsum(spec, a, b)


# --------------------------------------------------------------------------- dropout


def _mix32(x: jax.Array) -> jax.Array:
    """An invertible avalanche mix of uint32 words (xor-shift-multiply, 32-bit constants)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x21F0AAAD)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x735A2D97)
    return x ^ (x >> 15)


def hash_bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Uniform uint32 words for `shape`: two words from the key (one threefry call), then a
    counter-based hash of each element's flat index.

    Cheap elementwise integer work instead of one threefry evaluation per element: on XLA:CPU
    threefry dropout took 0.44 s of a 1.6 s MiniLM step. The index is an iota, so under jit
    with sharded activations each device computes only its part. Indices wrap at 2^32
    elements per call (far beyond one activation tensor here).
    """
    s1, s2 = jax.random.bits(key, (2,), jnp.uint32)
    idx = jnp.zeros(shape, jnp.uint32)
    stride = 1
    for dim in reversed(range(len(shape))):
        idx = idx + jax.lax.broadcasted_iota(jnp.uint32, shape, dim) * jnp.uint32(stride % 2**32)
        stride *= shape[dim]
    return _mix32(_mix32(idx ^ s1) + s2)


class Dropout(nn.Module):
    """Inverted dropout like `nn.Dropout` (keep with probability 1 - rate, scale by
    1 / (1 - rate)), with masks from `hash_bits` drawn from the 'dropout' RNG stream."""

    rate: float

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        if deterministic or self.rate == 0.0:
            return x
        threshold = jnp.uint32(min(int(round(self.rate * 2**32)), 2**32 - 1))
        keep = hash_bits(self.make_rng("dropout"), x.shape) >= threshold
        return jnp.where(keep, x * jnp.asarray(1.0 / (1.0 - self.rate), x.dtype), 0).astype(x.dtype)


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
        return Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)


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
            y = _dense(cfg, cfg.hidden_size, name, self.dtype, self.param_dtype)(x)
            # (B, L, H, D) -> (B, H, L, D): the bhqd layout is the fast one on XLA:CPU.
            return y.reshape(batch, seq_len, heads, head_dim).transpose(0, 2, 1, 3)

        q, k, v = project("query"), project("key"), project("value")
        q = q * jnp.asarray(1.0 / math.sqrt(head_dim), q.dtype)
        scores = _matmul("bhqd,bhkd->bhqk", q, k, self.dtype)
        probs = jax.nn.softmax(scores.astype(jnp.float32) + mask_bias, axis=-1)
        probs = Dropout(cfg.attention_probs_dropout_prob)(probs, deterministic=deterministic)
        ctx = _matmul("bhqk,bhkd->bhqd", probs, v, self.dtype)
        return ctx.transpose(0, 2, 1, 3).reshape(batch, seq_len, cfg.hidden_size)


class DenseResidual(nn.Module):
    """Dense -> dropout -> add residual -> LayerNorm (HF's BertSelfOutput / BertOutput)."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, residual: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.cfg
        y = _dense(cfg, cfg.hidden_size, "dense", self.dtype, self.param_dtype)(x)
        y = Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
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
        return self.output(self.intermediate(x), x, deterministic)


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
        y = _dense(cfg, cfg.intermediate_size, "dense", self.dtype, self.param_dtype)(x)
        return jax.nn.gelu(y, approximate=False)  # HF "gelu" is the exact erf form


class Encoder(nn.Module):
    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, mask_bias: jax.Array, deterministic: bool) -> jax.Array:
        for i in range(self.cfg.num_hidden_layers):
            x = Layer(self.cfg, self.dtype, self.param_dtype, name=f"layer_{i}")(
                x, mask_bias, deterministic
            )
        return x


class Bert(nn.Module):
    """BERT encoder + pooler. Returns (last_hidden_state, pooled_output), both fp32."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(
        self, input_ids: jax.Array, attention_mask: jax.Array, deterministic: bool = True
    ) -> tuple[jax.Array, jax.Array]:
        cfg, kw = self.cfg, dict(dtype=self.dtype, param_dtype=self.param_dtype)
        x = Embeddings(cfg, name="embeddings", **kw)(input_ids, deterministic)
        # Additive mask over keys, (B, 1, 1, L): 0 where attended, a large negative at padding.
        mask_bias = jnp.where(attention_mask[:, None, None, :] > 0, 0.0, -1e9).astype(jnp.float32)
        x = Encoder(cfg, name="encoder", **kw)(x, mask_bias, deterministic)
        pooled = nn.tanh(_Pooler(cfg, name="pooler", **kw)(x[:, 0]))
        return x, pooled.astype(jnp.float32)


class _Pooler(nn.Module):
    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, cls_token: jax.Array) -> jax.Array:
        return _dense(self.cfg, self.cfg.hidden_size, "dense", self.dtype, self.param_dtype)(
            cls_token
        )


class ToxicityClassifier(nn.Module):
    """BERT -> pooled output -> dropout -> Dense(1): one toxicity logit per comment.

    Inputs may carry extra leading dims (the ranking pairs' (B, 2, L)); the output keeps them.
    """

    cfg: EncoderConfig
    head_dropout: float = 0.3
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(
        self, input_ids: jax.Array, attention_mask: jax.Array, deterministic: bool = True
    ) -> jax.Array:
        lead = input_ids.shape[:-1]
        flat = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
        bert = Bert(self.cfg, self.dtype, self.param_dtype, name="bert")
        _, pooled = bert(flat(input_ids), flat(attention_mask), deterministic)
        x = Dropout(self.head_dropout)(pooled, deterministic=deterministic)
        logit = _dense(self.cfg, 1, "classifier", self.dtype, self.param_dtype)(x)
        return logit[:, 0].astype(jnp.float32).reshape(lead)


class Ranker(ToxicityClassifier):
    """Scores each comment of a (less, more) pair with the same head: (B, 2, L) -> (B, 2)."""

    head_dropout: float = 0.2


def build_model(task: str, cfg: EncoderConfig, head_dropout: float, precision: str) -> nn.Module:
    """The model of a task with fp32 storage and the compute dtype of `precision`."""
    dtype = jnp.bfloat16 if precision == "bf16" else jnp.float32
    cls = Ranker if task == "ranking" else ToxicityClassifier
    return cls(cfg, head_dropout=head_dropout, dtype=dtype, param_dtype=jnp.float32)
