"""Hugging Face directories for the torch side: load (encoder + optional head) and save. A
seeded torch init saved here is what both sides start from in parity runs
(`parity_tests.harness.shared_init`)."""

from __future__ import annotations

from pathlib import Path

import torch

from jaxtpu.config import EncoderConfig
from jaxtpu.weights import fit_state_dict, write_hf_dir
from torchxla_ref.models import ToxicityClassifier, model_class


def build_model(
    task: str,
    enc: EncoderConfig,
    head_dropout: float | None,
    model_dir: str | Path | None,
    seed: int,
) -> ToxicityClassifier:
    """The task's model, seeded random init, then filled from `model_dir` (encoder, and head
    if the directory has one) through the same checks as the JAX side
    (`jaxtpu.weights.fit_state_dict`). Encoder dropout comes from `enc` either way."""
    torch.manual_seed(seed)
    model = model_class(task)(enc, head_dropout)
    if model_dir:
        expected = {k.removeprefix("bert."): tuple(v.shape) for k, v in model.state_dict().items()}
        found, _ = fit_state_dict(model_dir, expected)
        tensors = {
            (k if k.startswith("classifier.") else "bert." + k): torch.from_numpy(v)
            for k, v in found.items()
        }
        model.load_state_dict(tensors, strict=False)
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
