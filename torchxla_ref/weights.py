"""Hugging Face directories for the torch side: load (encoder + optional head) and save. A
seeded torch init saved here is what both sides start from in parity runs
(`parity_tests.harness.shared_init`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import BertModel

from jaxtpu.config import EncoderConfig
from jaxtpu.weights import HEAD_FILE, HEAD_META, TOKENIZER_FILES, CheckpointError
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
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    encoder = {k: v.detach().cpu().contiguous() for k, v in model.bert.state_dict().items()}
    save_file(encoder, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.bert.config.to_dict()
    enc = EncoderConfig.from_hf_dict(config)
    (out / "config.json").write_text(json.dumps(enc.to_hf_dict(), indent=2, sort_keys=True))
    head = {
        f"classifier.{k}": v.detach().cpu().contiguous()
        for k, v in model.classifier.state_dict().items()
    }
    save_file(head, str(out / HEAD_FILE), metadata={"format": "pt"})
    (out / HEAD_META).write_text(json.dumps(head_meta or {}, indent=2, sort_keys=True))
    if tokenizer_dir:
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_dir) / name
            if src.exists():
                (out / name).write_bytes(src.read_bytes())
    return out
