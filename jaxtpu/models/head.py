"""The heads on every family's encoder: jaxtpu's (`--head jaxtpu`: pooling one vector per
comment (`--pooling`), dropout and a dense layer to one score per comment or one per label)
and the family's own `*ForSequenceClassification` head (`--head hf`, the operations of
`jaxtpu.core.hf.heads`); the logits are fp32. Architecture only: knows nothing of devices."""

from __future__ import annotations

import importlib

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.hf.heads import Op, hf_head
from jaxtpu.core.hf.kinds import LayerKind
from jaxtpu.core.hf.tokenizer_dir import segment_types
from jaxtpu.core.serving.heads import POOLED
from jaxtpu.models import layers, ops

Dtype = jnp.dtype


def backbone(kind: LayerKind) -> type[nn.Module]:
    """The encoder of a layer kind: its module's `Backbone` (one interface: (hidden, pooled or
    None))."""
    return importlib.import_module(kind.module).Backbone


def pool(
    pooling: str,
    hidden: jax.Array,
    pooled: jax.Array | None,
    mask: jax.Array,
    ids: jax.Array | None = None,
    pad_id: int = 0,
) -> jax.Array:
    """One vector per comment (`--pooling`): the pooler output, the first token's hidden
    state, the last token whose id is not `pad_id` (transformers' decoder classifiers' rule,
    right or left padding alike), or the mean of the hidden states of its real (unmasked)
    tokens."""
    if pooling == "pooler":
        return pooled
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "last":
        return hidden[jnp.arange(hidden.shape[0]), last_token(ids, pad_id)]
    weight = mask[..., None].astype(jnp.float32)
    return (hidden * weight).sum(1) / jnp.maximum(weight.sum(1), 1e-9)


def last_token(ids: jax.Array, pad_id: int) -> jax.Array:
    """(B,) the index of each row's last token whose id is not `pad_id` (0 when all are)."""
    return jnp.argmax(jnp.arange(ids.shape[-1]) * (ids != pad_id), axis=-1)


ACTIVATIONS = {"tanh": jnp.tanh, "relu": jax.nn.relu, "gelu": ops.gelu}


def run_ops(
    module: nn.Module, ops_: tuple[Op, ...], x: jax.Array, deterministic: bool
) -> jax.Array:
    """Runs a head's operations (`jaxtpu.core.hf.heads.Op`) on `x`, their layers created in
    `module`'s scope under their Hugging Face names."""
    for op in ops_:
        if op.kind == "dropout":
            x = ops.Dropout(module.head_dropout)(x, deterministic=deterministic)
        elif op.kind == "act":
            x = ACTIVATIONS[op.name](x)
        elif op.kind == "norm":
            x = layers.layer_norm(module.cfg, op.name, module.param_dtype, op.bias)(x)
        else:
            width = module.outputs if op.out else module.cfg.hidden_size
            dense = layers.dense(
                module.cfg, width, op.name, module.dtype, module.param_dtype, use_bias=op.bias
            )
            x = dense(x).astype(jnp.float32)
    return x


class HeadBlock(nn.Module):
    """The operations of one block of an `hf` head, in the module the checkpoint names
    (RoBERTa's `classifier`, DeBERTa's `pooler`, ModernBERT's `head`)."""

    cfg: EncoderConfig
    ops_: tuple[Op, ...]
    head_dropout: float
    outputs: int
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        return run_ops(self, self.ops_, x, deterministic)


class Classifier(nn.Module):
    """Encoder -> head: jaxtpu's (pooling -> dropout -> Dense(outputs)) or, `head='hf'`, the
    family's own classification head; for every task (one score per comment, or one per
    label). Inputs may carry extra leading dims (the ranking pairs' (B, 2, L)); the output
    keeps them, so a ranker is this model applied to both comments of a pair. A single output
    is returned without its axis.
    """

    cfg: EncoderConfig
    head_dropout: float = 0.0
    dtype: Dtype = jnp.float32
    param_dtype: Dtype = jnp.float32
    matmul_out: Dtype = jnp.float32  # bf16 matmuls' result dtype (--matmul-output)
    remat: str = "none"
    scan: bool = False
    pooling: str = "pooler"
    outputs: int = 1
    head: str = "jaxtpu"  # 'hf': the family's own classification head
    # text pairs: the separator after which tokens have type 1 (`segment_types`); -1: none
    segment_sep: int = -1

    @nn.compact
    def __call__(
        self, input_ids: jax.Array, attention_mask: jax.Array, deterministic: bool = True
    ) -> jax.Array:
        lead = input_ids.shape[:-1]
        flat = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
        family = self.cfg.family
        # a family's own head without a pooler (RoBERTa's) has none in its checkpoint
        no_pooler = self.head == "hf" and self.pooling != "pooler" and family.pooler
        bert = backbone(family.kind)(
            self.cfg,
            self.dtype,
            self.param_dtype,
            matmul_out=self.matmul_out,
            remat=self.remat,
            scan=self.scan,
            name="bert",
            **({"pooler": False} if no_pooler else {}),
        )
        mask = flat(attention_mask)
        types = {}
        if self.segment_sep >= 0:
            ids = flat(input_ids)
            types["token_types"] = segment_types(ids, mask, self.segment_sep).astype(jnp.int32)
        hidden, pooled = bert(flat(input_ids), mask, deterministic, **types)
        x = pool(self.pooling, hidden, pooled, mask, flat(input_ids), self.cfg.pad_token_id)
        # the comment's vector, kept only when asked for (`mutable=["intermediates"]`: a
        # community's head reads it, `jaxtpu.core.serving.heads`); a no-op otherwise
        self.sow("intermediates", POOLED, x.astype(jnp.float32).reshape(*lead, -1))
        # the logits stay fp32 whatever --matmul-output says: the loss reads them
        if self.head == "hf":
            for block, block_ops in hf_head(self.cfg.model_type).blocks:
                if block:
                    x = HeadBlock(
                        self.cfg,
                        block_ops,
                        self.head_dropout,
                        self.outputs,
                        self.dtype,
                        self.param_dtype,
                        name=block,
                    )(x, deterministic)
                else:
                    x = run_ops(self, block_ops, x, deterministic)
            logits = x
        else:
            x = ops.Dropout(self.head_dropout)(x, deterministic=deterministic)
            logits = layers.dense(
                self.cfg, self.outputs, "classifier", self.dtype, self.param_dtype
            )(x)
            logits = logits.astype(jnp.float32)
        return logits[:, 0].reshape(lead) if self.outputs == 1 else logits.reshape(*lead, -1)
