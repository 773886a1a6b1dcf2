"""The Jigsaw head on transformers' own encoder of each family (`AutoModel`), or (`--head hf`)
transformers' own `*ForSequenceClassification` model of the family: the PyTorch twin of
`jaxtpu.models.encoder`.

Same attribute names as the Flax side (`bert`, and `classifier` or the family's head
modules under `head`), so one Hugging Face directory loads into both. No device logic here.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification, PretrainedConfig

from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.hf.heads import classifier_fields, hf_head
from jaxtpu.core.hf.tokenizer_dir import segment_types


def hf_config(enc: EncoderConfig, extra: dict | None = None) -> PretrainedConfig:
    """transformers' config of the encoder's family (with the `extra` keys of a classifier).
    Eager attention: the plain matmul/softmax graph, which XLA traces and fuses as it is and
    which matches the Flax model operation for operation."""
    d = {**enc.to_hf_dict(), **(extra or {})}
    model_type = d.pop("model_type")
    d.pop("architectures")
    return AutoConfig.for_model(model_type, **d, attn_implementation="eager")


def pool(
    pooling: str, out, attention_mask: torch.Tensor, ids: torch.Tensor, pad_id: int
) -> torch.Tensor:
    """One vector per comment (`--pooling`, as `jaxtpu.models.head.pool`)."""
    if pooling == "pooler":
        return out.pooler_output
    hidden = out.last_hidden_state
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "last":  # transformers' rule: the rightmost token that is not padding
        last = (torch.arange(ids.shape[-1], device=ids.device) * (ids != pad_id)).argmax(-1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    weight = attention_mask.unsqueeze(-1).float()
    return (hidden.float() * weight).sum(1) / weight.sum(1).clamp(min=1e-9)


class Classifier(nn.Module):
    """Encoder -> head, for every task: jaxtpu's (pooling -> dropout -> Linear(hidden,
    outputs)) or, `head='hf'`, transformers' own `*ForSequenceClassification` model of the
    family, whose encoder is `bert` and whose head modules sit under `head`. Extra leading
    dims are kept (a ranker scores both comments of a (B, 2, L) pair), and a single output is
    returned without its axis."""

    def __init__(
        self,
        enc: EncoderConfig,
        head_dropout: float,
        pooling: str | None = None,
        outputs: int = 1,
        head: str = "jaxtpu",
        segment_sep: int = -1,
    ) -> None:
        super().__init__()
        self.segment_sep = segment_sep  # text pairs' token types (`segment_types`); -1: none
        self.pad_token_id = enc.pad_token_id  # `last` pooling's
        self.pooling = pooling or enc.default_pooling
        self.outputs = outputs
        self.head_kind = head
        if head == "hf":
            labels = tuple(f"LABEL_{i}" for i in range(outputs))
            extra = classifier_fields(enc.model_type, labels, "", head_dropout, self.pooling)
            full = AutoModelForSequenceClassification.from_config(hf_config(enc, extra))
            prefix = hf_head(enc.model_type).prefix
            self.bert = getattr(full, prefix)
            self.head = nn.ModuleDict({n: m for n, m in full.named_children() if n != prefix})
            # the whole model runs the forward pass; its modules are registered above
            self.__dict__["full"] = full
            return
        self.bert = AutoModel.from_config(hf_config(enc))
        self.dropout = nn.Dropout(head_dropout)
        self.classifier = nn.Linear(enc.hidden_size, outputs)
        nn.init.normal_(self.classifier.weight, std=enc.initializer_range)
        nn.init.zeros_(self.classifier.bias)

    def train(self, mode: bool = True) -> Classifier:
        super().train(mode)
        if self.head_kind == "hf":
            self.full.train(mode)
        return self

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.features(input_ids, attention_mask)[0]

    def features(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the logits `forward` gives, each comment's vector under the head: the pooled one
        jaxtpu's head reads, fp32; None for a family's own head, whose pooling is its own)."""
        lead = input_ids.shape[:-1]
        seq = input_ids.shape[-1]
        mask = attention_mask.reshape(-1, seq).long()
        ids = input_ids.reshape(-1, seq).long()
        types = {}
        if self.segment_sep >= 0:
            types["token_type_ids"] = segment_types(ids, mask, self.segment_sep).long()
        pooled = None
        if self.head_kind == "hf":
            logits = self.full(input_ids=ids, attention_mask=mask, **types).logits.float()
        else:
            out = self.bert(input_ids=ids, attention_mask=mask, **types)
            pooled = pool(self.pooling, out, mask, ids, self.pad_token_id)
            logits = self.classifier(self.dropout(pooled)).float()
            pooled = pooled.float().reshape(*lead, -1)
        logits = logits[:, 0].reshape(lead) if self.outputs == 1 else logits.reshape(*lead, -1)
        return logits, pooled
