"""Hugging Face checkpoint directories, framework-free: reading a state dict, fitting it to a
model's tensors (one check for both sides), and writing a directory both sides load.

A directory written here holds the encoder as a plain `BertModel` (`model.safetensors`,
loadable by `transformers.AutoModel.from_pretrained` with no missing or unexpected keys), the
Dense head in `head.safetensors` (`classifier.weight`, `classifier.bias`, as
`nn.Linear(hidden, outputs)`), `jaxtpu_head.json` saying which task and dropout the head
belongs to, and the tokenizer files. Flax's side of the mapping is `jaxtpu.weights`.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core.config import EncoderConfig
from jaxtpu.core.errors import CheckpointError

HEAD_FILE = "head.safetensors"
HEAD_META = "jaxtpu_head.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)
# Old TF-converted checkpoints name LayerNorm parameters gamma/beta.
_LEGACY = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}
# Checkpoint keys that are not part of BertModel and are safely ignored.
_IGNORED = re.compile(r"^(cls\.|.*position_ids$)")


def read_state_dict(model_dir: str | Path) -> dict[str, np.ndarray]:
    """The parameters of a Hugging Face directory as fp32 numpy arrays, keys without `bert.`
    (buffers such as `position_ids` and pre-training heads `cls.*` are left out)."""
    d = Path(model_dir)
    st, binf = d / "model.safetensors", d / "pytorch_model.bin"
    if st.exists():
        from safetensors.numpy import load_file

        try:
            raw = load_file(str(st))
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{st}: unreadable safetensors file ({e})") from None
    elif binf.exists():
        try:
            import torch
        except ImportError:
            raise CheckpointError(
                f"{binf}: reading pytorch_model.bin needs torch; install jaxtpu[torch] "
                "or convert the checkpoint to model.safetensors"
            ) from None
        sd = torch.load(str(binf), map_location="cpu", weights_only=True)
        raw = {k: v.float().numpy() for k, v in sd.items()}
    else:
        raise CheckpointError(f"{d}: no model.safetensors or pytorch_model.bin")
    out = {}
    for k, v in raw.items():
        k = k.removeprefix("bert.")
        if _IGNORED.match(k):
            continue
        for old, new in _LEGACY.items():
            k = k.replace(old, new)
        out[k] = np.asarray(v, np.float32) if v.dtype != np.float32 else v
    return out


def fit_state_dict(
    model_dir: str | Path, expected: Mapping[str, tuple[int, ...]], head_required: bool = False
) -> tuple[dict[str, np.ndarray], list[str]]:
    """The tensors of a Hugging Face directory (encoder, and head if present) that a model
    needs, checked against its shapes. Framework-free: both sides load through this.

    Args:
      model_dir: the checkpoint directory.
      expected: the model's tensors, Hugging Face keys (no `bert.` prefix; head as
        `classifier.*`) -> shape in Hugging Face (torch) orientation.
      head_required: fail if the directory has no head (loading a fine-tuned model).
    Returns:
      (found, kept): the expected tensors present in the directory (numpy fp32), and the
      expected keys that are not (the head of a plain BertModel, a missing pooler), which keep
      their initial value.
    Raises:
      CheckpointError: naming the first tensor whose shape does not fit, or when more than a
      pooler of the encoder is missing.
    """
    d = Path(model_dir)
    sd = read_state_dict(d)
    head = d / HEAD_FILE
    if head.exists():
        from safetensors.numpy import load_file

        sd.update(load_file(str(head)))
    elif head_required:
        raise CheckpointError(f"{d}: no {HEAD_FILE}; not a fine-tuned jaxtpu export")
    found, kept = {}, []
    for key, shape in sorted(expected.items()):  # the same first mismatch on both sides
        if key not in sd:
            kept.append(key)
        elif tuple(sd[key].shape) != tuple(shape):
            raise CheckpointError(
                f"{d}: tensor {key} has shape {tuple(sd[key].shape)}, the model expects "
                f"{tuple(shape)}; the checkpoint is of another model size (check config.json)"
            )
        else:
            found[key] = sd[key]
    encoder_kept = [k for k in kept if not k.startswith("classifier.")]
    if len(encoder_kept) > 2:  # a pooler may be missing; a whole encoder may not
        raise CheckpointError(
            f"{d}: {len(encoder_kept)} encoder tensors missing (first: {encoder_kept[0]}); "
            "not a BERT checkpoint of this shape"
        )
    return found, kept


def write_hf_dir(
    out_dir: str | Path,
    enc: EncoderConfig,
    encoder: dict[str, np.ndarray],
    head: dict[str, np.ndarray],
    tokenizer_dir: str | Path | None = None,
    head_meta: dict[str, Any] | None = None,
) -> Path:
    """Writes state dicts (numpy, Hugging Face keys) as a Hugging Face directory; both sides
    save through here, so their exports have one format."""
    from safetensors.numpy import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(encoder, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(enc.to_hf_dict(), indent=2, sort_keys=True))
    if head:
        save_file(head, str(out / HEAD_FILE), metadata={"format": "pt"})
        (out / HEAD_META).write_text(json.dumps(head_meta or {}, indent=2, sort_keys=True))
    if tokenizer_dir:
        for name in TOKENIZER_FILES:
            src = Path(tokenizer_dir) / name
            if src.exists():
                shutil.copy2(src, out / name)
    return out
