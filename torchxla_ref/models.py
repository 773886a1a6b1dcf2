"""The Jigsaw head on `transformers.BertModel`: the PyTorch twin of `jaxtpu.models`.

Same attribute names as the Flax side (`bert`, `classifier`), so one Hugging Face directory
(`model.safetensors` + `head.safetensors`) loads into both. No device logic here.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import BertConfig, BertModel

from jaxtpu.core.config import EncoderConfig


def hf_config(enc: EncoderConfig) -> BertConfig:
    # Eager attention: the plain matmul/softmax graph, which XLA traces and fuses as it is and
    # which matches the Flax model operation for operation.
    return BertConfig(**enc.to_hf_dict(), attn_implementation="eager")


class Classifier(nn.Module):
    """BERT -> pooled output -> dropout -> Linear(hidden, 1), the head of every task; extra
    leading dims are kept (a ranker scores both comments of a (B, 2, L) pair)."""

    def __init__(self, enc: EncoderConfig, head_dropout: float) -> None:
        super().__init__()
        self.bert = BertModel(hf_config(enc))
        self.dropout = nn.Dropout(head_dropout)
        self.classifier = nn.Linear(enc.hidden_size, 1)
        nn.init.normal_(self.classifier.weight, std=enc.initializer_range)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        lead = input_ids.shape[:-1]
        seq = input_ids.shape[-1]
        out = self.bert(
            input_ids=input_ids.reshape(-1, seq).long(),
            attention_mask=attention_mask.reshape(-1, seq).long(),
        )
        logit = self.classifier(self.dropout(out.pooler_output))
        return logit[:, 0].float().reshape(lead)
