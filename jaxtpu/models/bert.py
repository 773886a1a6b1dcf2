"""The BERT layer kind, which six families share (BERT, RoBERTa, XLM-RoBERTa, DistilBERT,
ELECTRA, DeBERTa-v2/v3): what differs between them is a row of `jaxtpu.core.hf.families`
(position numbering, token types, an embedding projection, DeBERTa's disentangled relative
attention). Module and parameter names mirror Hugging Face's `BertModel`
(`embeddings/LayerNorm`, `encoder/layer_3/attention/self/query`, ...); each family's table in
`jaxtpu.core.hf.families` maps them to its own names.

Precision: `dtype` is the compute dtype (bf16 or fp32), `param_dtype` the storage dtype
(fp32 master weights). Softmax, LayerNorm and the residual stream run in fp32, as PyTorch's
autocast does. Architecture only: knows nothing of devices."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.models import layers, ops

Dtype = jnp.dtype


class Embeddings(nn.Module):
    """Token (+ position) (+ token type: 0, or a text pair's `token_types`) embeddings ->
    LayerNorm -> dropout, with the family's projection to hidden_size when the embeddings are
    narrower: ELECTRA's `embeddings_project` after the LayerNorm (in `Backbone`), DeBERTa's
    `embed_proj` before it."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)

    @nn.compact
    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array,
        deterministic: bool,
        token_types: jax.Array | None = None,
    ) -> jax.Array:
        cfg, family = self.cfg, self.cfg.family
        init = nn.initializers.normal(cfg.initializer_range)
        width = cfg.embedding_size or cfg.hidden_size

        def embed(num: int, name: str) -> nn.Embed:
            return nn.Embed(
                num, width, param_dtype=self.param_dtype, embedding_init=init, name=name
            )

        x = embed(cfg.vocab_size, "word_embeddings")(input_ids)
        positions = absolute_positions(cfg, input_ids)
        if positions is not None:
            x = x + embed(cfg.max_position_embeddings, "position_embeddings")(positions)
        if cfg.type_vocab_size > 0:
            # Token type 0 everywhere (single-segment inputs): row 0 of the table; text pairs
            # give their `token_types`.
            types = jnp.zeros((1,), jnp.int32) if token_types is None else token_types
            x = x + embed(cfg.type_vocab_size, "token_type_embeddings")(types)
        if family.projection == "embed_proj" and width != cfg.hidden_size:
            x = nn.Dense(
                cfg.hidden_size,
                use_bias=False,
                param_dtype=self.param_dtype,
                kernel_init=init,
                name="embed_proj",
            )(x)
        x = layers.layer_norm(cfg, "LayerNorm", self.param_dtype)(x.astype(jnp.float32))
        if family.mask_embeddings:  # DeBERTa zeroes the embeddings of padding tokens
            x = x * attention_mask[..., None].astype(x.dtype)
        return ops.Dropout(cfg.hidden_dropout_prob)(x, deterministic=deterministic)


def absolute_positions(cfg: EncoderConfig, input_ids: jax.Array) -> jax.Array | None:
    """The position ids of the family's absolute position embeddings (None without them):
    0..L-1, or RoBERTa's numbering from pad_token_id + 1 over the non-padding tokens."""
    numbering = cfg.family.positions
    if numbering == "relative" and not cfg.position_biased_input:
        return None
    if numbering == "after_padding":
        real = (input_ids != cfg.pad_token_id).astype(jnp.int32)
        return jnp.cumsum(real, axis=-1) * real + cfg.pad_token_id
    return jnp.arange(input_ids.shape[-1])


def relative_positions(length: int, buckets: int, max_position: int) -> np.ndarray:
    """DeBERTa's relative position of query i to key j, (L, L) int: i - j, in log buckets
    beyond buckets/2 when `buckets` > 0 (transformers' `build_relative_position`, computed
    on the host in float32 as it is there: the sequence length is static)."""
    rel = np.arange(length)[:, None] - np.arange(length)[None, :]
    if buckets <= 0 or max_position <= 0:
        return rel
    mid = buckets // 2
    f32 = np.float32
    abs_pos = np.where((rel < mid) & (rel > -mid), mid - 1, np.abs(rel))
    ratio = (abs_pos.astype(f32) / f32(mid)).astype(f32)
    log_pos = np.ceil(np.log(ratio) / np.log(f32((max_position - 1) / mid)) * f32(mid - 1)) + mid
    return np.where(abs_pos <= mid, rel, log_pos * np.sign(rel)).astype(np.int64)


def relative_span(cfg: EncoderConfig) -> tuple[int, int]:
    """(span, max_position) of DeBERTa's relative attention: the relative embeddings table has
    2 * span rows."""
    max_position = cfg.max_relative_positions
    if max_position < 1:
        max_position = cfg.max_position_embeddings
    span = cfg.position_buckets if cfg.position_buckets > 0 else max_position
    return span, max_position


class SelfAttention(nn.Module):
    """Multi-head self-attention; with `relative_attention` (DeBERTa) the scores also get the
    content-to-position and position-to-content terms of the relative embeddings `rel`."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)

    @nn.compact
    def __call__(
        self, x: jax.Array, mask_bias: jax.Array, rel: jax.Array | None, deterministic: bool
    ) -> jax.Array:
        cfg = self.cfg
        heads = cfg.num_attention_heads
        head_dim = cfg.hidden_size // heads
        batch, seq_len, _ = x.shape
        dense = {
            name: layers.layer_dense(self, cfg.hidden_size, name)
            for name in ("query", "key", "value")
        }

        def project(name: str, y: jax.Array) -> jax.Array:
            # (..., L, H, D) -> (..., H, L, D): the bhqd layout is the fast one on XLA:CPU.
            y = layers.saved(dense[name](y))
            y = y.reshape(*y.shape[:-1], heads, head_dim)
            return jnp.moveaxis(y, -2, -3)

        q, k, v = project("query", x), project("key", x), project("value", x)
        # DeBERTa divides every term by sqrt(D x (1 + number of relative terms)).
        terms = 1 + len(cfg.pos_att_type) if cfg.relative_attention else 1
        scale = 1.0 / math.sqrt(head_dim * terms)
        q = q * jnp.asarray(scale, q.dtype)
        scores = ops.matmul("bhqd,bhkd->bhqk", q, k, self.dtype, self.matmul_out)
        if cfg.relative_attention:
            if not cfg.share_att_key:
                for name in ("pos_key", "pos_query"):
                    dense[name] = layers.layer_dense(self, cfg.hidden_size, name)
            rel = ops.Dropout(cfg.hidden_dropout_prob)(rel, deterministic=deterministic)
            scores = scores + _disentangled(cfg, q, k, rel, project, self.dtype)
        probs = jax.nn.softmax(scores.astype(jnp.float32) + mask_bias, axis=-1)
        probs = ops.Dropout(cfg.attention_probs_dropout_prob)(probs, deterministic=deterministic)
        ctx = ops.matmul("bhqk,bhkd->bhqd", probs, v, self.dtype, self.matmul_out)
        return ctx.transpose(0, 2, 1, 3).reshape(batch, seq_len, cfg.hidden_size)


def _disentangled(cfg: EncoderConfig, q, k, rel, project, dtype) -> jax.Array:
    """DeBERTa's disentangled attention terms, (B, H, L, L) fp32, for a query `q` already
    scaled by 1/sqrt(D x (1 + number of terms)):
    c2p[i, j] = q_i . Kr[idx(i, j)] and p2c[i, j] = k_j . Qr[idx'(j, i)] (scaled alike),
    where Kr, Qr are the relative embeddings `rel` projected by the key/query kernels
    (`share_att_key`) or their own `pos_key` / `pos_query`, idx(i, j) = clamp(bucket(i - j)
    + span) and idx'(j, i) = clamp(-bucket(j - i) + span), as in transformers'
    `DisentangledSelfAttention.disentangled_attention_bias`."""
    span, max_position = relative_span(cfg)
    bucket = relative_positions(q.shape[-2], cfg.position_buckets, max_position)
    out = jnp.zeros((), jnp.float32)
    if "c2p" in cfg.pos_att_type:
        pos_key = project("key" if cfg.share_att_key else "pos_key", rel)  # (H, 2S, D)
        c2p = ops.matmul("bhqd,hrd->bhqr", q, pos_key, dtype)
        index = np.clip(bucket + span, 0, 2 * span - 1)
        out = out + jnp.take_along_axis(c2p, index[None, None], axis=-1).astype(jnp.float32)
    if "p2c" in cfg.pos_att_type:
        pos_query = project("query" if cfg.share_att_key else "pos_query", rel)
        scale = 1.0 / math.sqrt(q.shape[-1] * (1 + len(cfg.pos_att_type)))
        p2c = ops.matmul("bhkd,hrd->bhkr", k, pos_query, dtype)
        index = np.clip(-bucket + span, 0, 2 * span - 1)
        p2c = jnp.take_along_axis(p2c, index[None, None], axis=-1)  # [b, h, j, i]
        out = out + jnp.swapaxes(p2c, -1, -2).astype(jnp.float32) * scale
    return out


class DenseResidual(nn.Module):
    """Dense -> dropout -> add residual -> LayerNorm (HF's BertSelfOutput / BertOutput);
    DistilBERT has no dropout after its attention's output dense (`dropout=False`)."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)
    dropout: bool = True

    @nn.compact
    def __call__(self, x: jax.Array, residual: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.cfg
        y = layers.saved(layers.layer_dense(self, cfg.hidden_size, "dense")(x))
        if self.dropout:
            y = ops.Dropout(cfg.hidden_dropout_prob)(y, deterministic=deterministic)
        return layers.layer_norm(cfg, "LayerNorm", self.param_dtype)(
            y.astype(jnp.float32) + residual
        )


class Layer(nn.Module):
    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)

    def setup(self) -> None:
        kw = dict(
            cfg=self.cfg, dtype=self.dtype, param_dtype=self.param_dtype, matmul_out=self.matmul_out
        )
        self.attention = _Attention(**kw)
        self.intermediate = _Intermediate(**kw)
        self.output = DenseResidual(**kw)

    def __call__(
        self, x: jax.Array, mask_bias: jax.Array, rel: jax.Array | None, deterministic: bool
    ) -> jax.Array:
        x = self.attention(x, mask_bias, rel, deterministic)
        return layers.residual(self.output(self.intermediate(x), x, deterministic))


class _Attention(nn.Module):
    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)

    def setup(self) -> None:
        kw = dict(
            cfg=self.cfg, dtype=self.dtype, param_dtype=self.param_dtype, matmul_out=self.matmul_out
        )
        self.self = SelfAttention(**kw)
        self.output = DenseResidual(**kw, dropout=self.cfg.family.attention_output_dropout)

    def __call__(
        self, x: jax.Array, mask_bias: jax.Array, rel: jax.Array | None, deterministic: bool
    ) -> jax.Array:
        return self.output(self.self(x, mask_bias, rel, deterministic), x, deterministic)


class _Intermediate(nn.Module):
    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        y = layers.saved(layers.layer_dense(self, cfg.intermediate_size, "dense")(x))
        return ops.gelu(y)


class _ScanBlock(nn.Module):
    """One `Layer` in the (carry, x) -> (carry, y) form `nn.scan` runs."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)
    deterministic: bool = True

    @nn.compact
    def __call__(
        self, x: jax.Array, mask_bias: jax.Array, rel: jax.Array | None
    ) -> tuple[jax.Array, None]:
        layer = Layer(
            self.cfg, self.dtype, self.param_dtype, matmul_out=self.matmul_out, name="layer"
        )
        return layer(x, mask_bias, rel, self.deterministic), None


class Encoder(nn.Module):
    """The encoder layers: `layer_0` ... `layer_{n-1}`, or with `scan` one `layers` module
    whose params carry a leading layer axis (`stack_layers` converts between the two); with
    DeBERTa's relative attention also the `rel_embeddings` every layer shares (and their
    `LayerNorm` when `norm_rel_ebd` says so)."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)
    remat: str = "none"
    scan: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, mask_bias: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.cfg
        kw = dict(
            cfg=cfg, dtype=self.dtype, param_dtype=self.param_dtype, matmul_out=self.matmul_out
        )
        rel = None
        if cfg.relative_attention:
            span, _ = relative_span(cfg)
            table = nn.Embed(
                2 * span,
                cfg.hidden_size,
                param_dtype=self.param_dtype,
                embedding_init=nn.initializers.normal(cfg.initializer_range),
                name="rel_embeddings",
            )
            rel = table(jnp.arange(2 * span))
            if "layer_norm" in cfg.norm_rel_ebd:
                rel = layers.layer_norm(cfg, "LayerNorm", self.param_dtype)(rel)
        if self.scan:
            block = _ScanBlock
            if self.remat != "none":
                block = nn.remat(block, policy=layers.REMAT[self.remat], prevent_cse=False)
            stack = nn.scan(
                block,
                variable_axes={"params": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=nn.broadcast,
                length=cfg.num_hidden_layers,
            )
            x, _ = stack(**kw, deterministic=deterministic, name=layers.SCANNED)(x, mask_bias, rel)
            return x
        layer = Layer
        if self.remat != "none":
            # argument 4 of Layer.__call__ (self = 0) is the Python bool `deterministic`
            layer = nn.remat(Layer, policy=layers.REMAT[self.remat], static_argnums=(4,))
        for i in range(cfg.num_hidden_layers):
            x = layer(**kw, name=f"layer_{i}")(x, mask_bias, rel, deterministic)
        return x


class Backbone(nn.Module):
    """The pretrained part of every family: embeddings, the layer stack (`Encoder`), and the
    pooler when the family has one, in BERT's module names (its params sit under 'bert' in
    `Classifier`, whatever the family; `jaxtpu.engine.weights` maps them). Returns
    (last_hidden_state, pooled_output or None), fp32."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)
    remat: str = "none"
    scan: bool = False
    pooler: bool = True  # False: leave out the family's pooler (RoBERTa's own classifier)

    @nn.compact
    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array,
        deterministic: bool = True,
        token_types: jax.Array | None = None,
    ) -> tuple[jax.Array, jax.Array | None]:
        cfg, kw = (
            self.cfg,
            dict(dtype=self.dtype, param_dtype=self.param_dtype, matmul_out=self.matmul_out),
        )
        embeddings = Embeddings(cfg, name="embeddings", **kw)
        x = embeddings(input_ids, attention_mask, deterministic, token_types)
        width = cfg.embedding_size or cfg.hidden_size
        if cfg.family.projection == "embeddings_project" and width != cfg.hidden_size:
            x = layers.layer_dense(self, cfg.hidden_size, "embeddings_project")(x)
            x = x.astype(jnp.float32)
        x = layers.residual(x)
        # Additive mask over keys, (B, 1, 1, L): 0 where attended, a large negative at padding.
        mask_bias = jnp.where(attention_mask[:, None, None, :] > 0, 0.0, -1e9).astype(jnp.float32)
        encoder = Encoder(cfg, name="encoder", remat=self.remat, scan=self.scan, **kw)
        x = encoder(x, mask_bias, deterministic)
        pooled = None
        if cfg.family.pooler and self.pooler:  # computed even when unused: exports keep it
            pooled = _Pooler(cfg, name="pooler", **kw)(x[:, 0]).astype(jnp.float32)
        return x, pooled


class _Pooler(nn.Module):
    """tanh(Dense(first token)), as Hugging Face's BertPooler (whose output it is)."""

    cfg: EncoderConfig
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)

    @nn.compact
    def __call__(self, cls_token: jax.Array) -> jax.Array:
        dense = layers.layer_dense(self, self.cfg.hidden_size, "dense")
        return nn.tanh(dense(cls_token))
