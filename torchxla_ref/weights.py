"""Hugging Face directories for the torch side: load (encoder + optional head) and save. A
seeded torch init saved here is what both sides start from in parity runs
(`parity_tests.harness.shared_init`)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import BertModel

from jaxtpu.config import EncoderConfig
from jaxtpu.weights import HEAD_FILE, CheckpointError, write_hf_dir
from torchxla_ref.models import ToxicityClassifier, hf_config, model_class


def build_model(
    task: str,
    enc: EncoderConfig,
    head_dropout: float | None,
    model_dir: str | Path | None,
    seed: int,
) -> ToxicityClassifier:
    """The task's model from `model_dir` (encoder, and head if the directory has one), or a
    seeded random init. Encoder dropout comes from `enc` either way."""
    torch.manual_seed(seed)
    bert = None
    if model_dir:
        bert, info = BertModel.from_pretrained(
            str(model_dir), config=hf_config(enc), output_loading_info=True
        )
        missing = [k for k in info["missing_keys"] if not k.startswith("pooler.")]
        if missing or info["mismatched_keys"]:
            raise CheckpointError(
                f"{model_dir}: does not fit the model (missing {missing[:3]}, "
                f"mismatched {list(info['mismatched_keys'])[:3]})"
            )
    model = model_class(task)(enc, head_dropout, bert)
    head = Path(model_dir or "") / HEAD_FILE
    if model_dir and head.exists():
        model.load_state_dict(load_file(str(head)), strict=False)
    return model


def save_hf(
    model: ToxicityClassifier,
    out_dir: str | Path,
    tokenizer_dir: str | Path | None,
    head_meta: dict | None = None,
) -> Path:
    """Writes encoder (BertModel keys), head and tokenizer as a Hugging Face directory."""

    def numpy(sd: dict, prefix: str = "") -> dict:
        return {prefix + k: v.detach().float().cpu().numpy() for k, v in sd.items()}

    enc = EncoderConfig.from_hf_dict(model.bert.config.to_dict())
    encoder = numpy(model.bert.state_dict())
    head = numpy(model.classifier.state_dict(), "classifier.")
    return write_hf_dir(out_dir, enc, encoder, head, tokenizer_dir, head_meta)
