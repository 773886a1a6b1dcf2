"""The Jigsaw head every family shares: pooling one vector per comment (`--pooling`), dropout
and a dense layer to one score per comment (or one per label); the logits are fp32.
Architecture only: knows nothing of devices."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.models import bert, eurobert, layers, modernbert, ops

Dtype = jnp.dtype
# The encoder of each layer kind (`Family.layer_kind`): one interface, (hidden, pooled or None).
BACKBONES = {
    "bert": bert.Backbone,
    "modernbert": modernbert.Backbone,
    "eurobert": eurobert.Backbone,
}


def pool(pooling: str, hidden: jax.Array, pooled: jax.Array | None, mask: jax.Array) -> jax.Array:
    """One vector per comment (`--pooling`): the pooler output, the first token's hidden
    state, or the mean of the hidden states of its real (unmasked) tokens."""
    if pooling == "pooler":
        return pooled
    if pooling == "cls":
        return hidden[:, 0]
    weight = mask[..., None].astype(jnp.float32)
    return (hidden * weight).sum(1) / jnp.maximum(weight.sum(1), 1e-9)


class Classifier(nn.Module):
    """Encoder -> pooling -> dropout -> Dense(outputs): the head of every task (one score per
    comment, or one per label). Inputs may carry extra leading dims (the ranking pairs'
    (B, 2, L)); the output keeps them, so a ranker is this model applied to both comments of
    a pair. A single output is returned without its axis.
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

    @nn.compact
    def __call__(
        self, input_ids: jax.Array, attention_mask: jax.Array, deterministic: bool = True
    ) -> jax.Array:
        lead = input_ids.shape[:-1]
        flat = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
        bert = BACKBONES[self.cfg.family.layer_kind](
            self.cfg,
            self.dtype,
            self.param_dtype,
            matmul_out=self.matmul_out,
            remat=self.remat,
            scan=self.scan,
            name="bert",
        )
        mask = flat(attention_mask)
        hidden, pooled = bert(flat(input_ids), mask, deterministic)
        x = pool(self.pooling, hidden, pooled, mask)
        x = ops.Dropout(self.head_dropout)(x, deterministic=deterministic)
        # the logits stay fp32 whatever --matmul-output says: the loss reads them
        logits = layers.dense(self.cfg, self.outputs, "classifier", self.dtype, self.param_dtype)(x)
        logits = logits.astype(jnp.float32)
        return logits[:, 0].reshape(lead) if self.outputs == 1 else logits.reshape(*lead, -1)
