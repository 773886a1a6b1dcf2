"""Hugging Face BERT checkpoint directory <-> Flax params, one mapping table, both directions.

A Hugging Face directory written here holds the encoder as a plain `BertModel`
(`model.safetensors`, loadable by `transformers.AutoModel.from_pretrained` with no missing or
unexpected keys), the Dense(1) head in `head.safetensors` (`classifier.weight`,
`classifier.bias`, as `nn.Linear(hidden, 1)`), `jaxtpu_head.json` saying which task and
dropout the head belongs to, and the tokenizer files.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.config import EncoderConfig, UserError

HEAD_FILE = "head.safetensors"
HEAD_META = "jaxtpu_head.json"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)

# The mapping table: Flax leaf name -> (Hugging Face leaf name, transpose?). Module paths map
# one to one, except that Flax's `layer_3` is Hugging Face's `layer.3`.
LEAVES = {
    "kernel": ("weight", True),  # nn.Dense (in, out) <-> nn.Linear (out, in)
    "embedding": ("weight", False),
    "scale": ("weight", False),  # LayerNorm
    "bias": ("bias", False),
}
# Old TF-converted checkpoints name LayerNorm parameters gamma/beta.
_LEGACY = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}
# Checkpoint keys that are not part of BertModel and are safely ignored.
_IGNORED = re.compile(r"^(cls\.|.*position_ids$)")


class CheckpointError(UserError):
    """A checkpoint directory does not fit the model; the message names the tensor."""


def hf_key(path: tuple[str, ...]) -> str:
    """Flax param path (('bert', 'encoder', 'layer_0', ..., 'kernel')) -> HF state-dict key."""
    *modules, leaf = path
    parts = [re.sub(r"^layer_(\d+)$", r"layer.\1", m) for m in modules]
    return ".".join(parts + [LEAVES[leaf][0]])


def _flatten(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple, Any]:
    out = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(_flatten(v, prefix + (k,)))
        else:
            out[prefix + (k,)] = v
    return out


def _unflatten(flat: Mapping[tuple, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for path, v in flat.items():
        node = tree
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = v
    return tree


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


def load_params(
    model_dir: str | Path, template: Mapping[str, Any], head_required: bool = False
) -> tuple[dict[str, Any], list[str]]:
    """Fills a Flax param tree from a Hugging Face directory (see `fit_state_dict`).

    Args:
      model_dir: the checkpoint directory.
      template: the model's param tree (arrays or ShapeDtypeStructs) giving paths and shapes;
        leaves not found in the checkpoint keep the template's value.
      head_required: fail if the directory has no head (loading a fine-tuned model).
    Returns:
      (params, kept): the filled tree (numpy fp32) and the HF keys left at their initial value.
    """
    leaves = {
        hf_key(path[1:] if path[0] == "bert" else path): (path, leaf)
        for path, leaf in _flatten(template).items()
    }

    def hf_shape(path: tuple[str, ...], leaf: Any) -> tuple[int, ...]:
        return tuple(leaf.shape[::-1] if LEAVES[path[-1]][1] else leaf.shape)

    expected = {key: hf_shape(path, leaf) for key, (path, leaf) in leaves.items()}
    found, kept = fit_state_dict(model_dir, expected, head_required)
    flat = {}
    for key, (path, leaf) in leaves.items():
        if key in found:
            value = found[key].T if LEAVES[path[-1]][1] else found[key]
            flat[path] = np.ascontiguousarray(value, np.float32)
        else:
            flat[path] = np.asarray(leaf) if isinstance(leaf, np.ndarray) else leaf
    return _unflatten(flat), kept


def to_state_dicts(
    params: Mapping[str, Any],
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Flax params -> (encoder state dict as BertModel keys, head state dict)."""
    encoder, head = {}, {}
    for path, leaf in _flatten(params).items():
        value = np.asarray(leaf, np.float32)
        value = np.ascontiguousarray(value.T if LEAVES[path[-1]][1] else value)
        if path[0] == "bert":
            encoder[hf_key(path[1:])] = value
        else:
            head[hf_key(path)] = value
    return encoder, head


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


def save_hf(
    params: Mapping[str, Any],
    enc: EncoderConfig,
    out_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    head_meta: dict[str, Any] | None = None,
) -> Path:
    """Writes Flax params as a Hugging Face directory (see the module docstring)."""
    encoder, head = to_state_dicts(params)
    return write_hf_dir(out_dir, enc, encoder, head, tokenizer_dir, head_meta)
