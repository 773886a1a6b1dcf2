"""State dicts as numpy, framework-free (torch only to read a torch file): an encoder found
by its token embedding table and its keys made the family's plain model's, a `torch.save` file
read as tensors only, and a training notebook's checkpoint (a module holding a BERT encoder
and a `Linear(hidden, 1)` head) split into the encoder and the head."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core.errors import CheckpointError

# The output widths a task's head has (`Task.outputs`): one score, or the six labels.
HEAD_OUTPUTS = (1, 6)

# Old TF-converted checkpoints name LayerNorm parameters gamma/beta.
_LEGACY = {"LayerNorm.gamma": "LayerNorm.weight", "LayerNorm.beta": "LayerNorm.bias"}

# Every encoder has exactly one token embedding table (BERT's layer kind's name, ModernBERT's,
# EuroBERT's); what precedes it is its prefix.
ENCODER_ANCHORS = (
    "embeddings.word_embeddings.weight",
    "embeddings.tok_embeddings.weight",
    "embed_tokens.weight",
)


def anchored(keys) -> dict[str, str]:
    """{prefix: anchor} of the token embedding tables among state-dict `keys`."""
    return {k[: -len(a)]: a for k in keys for a in ENCODER_ANCHORS if k.endswith(a)}


# Checkpoint keys that are not part of the encoder and are safely ignored.
IGNORED = re.compile(r"^(cls\.|.*position_ids$)")


def encoder_keys(raw: Mapping[str, Any], prefix: str) -> dict[str, np.ndarray]:
    """Plain-model keys of the tensors under `prefix` (legacy names fixed, buffers dropped)."""
    out = {}
    for k, v in raw.items():
        if not k.startswith(prefix):
            continue
        k = k.removeprefix(prefix)
        if IGNORED.match(k):
            continue
        for old, new in _LEGACY.items():
            k = k.replace(old, new)
        out[k] = np.asarray(v, np.float32) if v.dtype != np.float32 else v
    return out


def read_torch_file(path: str | Path) -> dict[str, np.ndarray]:
    """The tensors of a `torch.save` file as fp32 numpy: a state dict, or the `state_dict` of a
    Lightning checkpoint. Loaded with `weights_only=True`: a file that pickles other objects is
    refused with a way out, never executed."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such file")
    try:
        import torch
    except ImportError:
        raise CheckpointError(
            f"{path}: reading a PyTorch file needs torch; install jaxtpu[torch] or convert the "
            "checkpoint to model.safetensors"
        ) from None
    with path.open("rb") as f:
        magic = f.read(4)
    # torch.save writes a zip archive (since 1.6) or, in the legacy format, a pickle
    if not (magic.startswith(b"PK\x03\x04") or magic[:1] == b"\x80"):
        what = "an empty file" if not magic else "not a torch.save file (no zip or pickle header)"
        raise CheckpointError(
            f"{path}: {what}, so not a PyTorch checkpoint; give the file the notebook wrote "
            "with torch.save(model.state_dict(), ...) or a Lightning .ckpt"
        )
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError, RuntimeError (not a torch file), EOFError, ...
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise CheckpointError(
            f"{path}: not loadable as tensors only ({reason}). If the file is a checkpoint you "
            "trust that pickles other objects, keep only its weights first: torch.save("
            "torch.load(FILE, weights_only=False)['state_dict'], 'weights.pt')"
        ) from None
    if isinstance(obj, Mapping) and isinstance(obj.get("state_dict"), Mapping):
        obj = obj["state_dict"]  # Lightning: {'state_dict': ..., 'epoch': ..., ...}
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{path}: holds a {type(obj).__name__}, not a state dict")
    tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise CheckpointError(f"{path}: no tensors; not a state dict or Lightning checkpoint")
    return {k: v.detach().float().cpu().numpy() for k, v in tensors.items()}


@dataclass
class NotebookCheckpoint:
    """A training notebook's `state_dict()`, split into the encoder (`BertModel` keys) and a
    `Linear(hidden, 1)` head (as `classifier.*`)."""

    encoder: dict[str, np.ndarray]
    head: dict[str, np.ndarray]
    encoder_prefix: str  # 'bert.' (BERTBaseUncased), 'model.' (Lightning), '' (bare BertModel)
    head_name: str | None  # 'fc1', 'fc', 'out', ...; None without a head


def read_notebook_checkpoint(path: str | Path) -> NotebookCheckpoint:
    """Reads a `torch.save(model.state_dict())` file or Lightning checkpoint of a module that
    holds a BERT encoder and scores `head(dropout(pooler_output))` (the PyTorch/XLA Jigsaw
    notebook's `BERTBaseUncased`: `bert`, `bert_drop`, `fc1`).

    Raises:
      CheckpointError: no encoder or several; tensors outside the encoder that are not one
        `Linear(hidden, 1)`; a head over another width than the encoder's hidden size.
    """
    path = Path(path)
    sd = read_torch_file(path)
    anchors = anchored(sd)
    prefixes = sorted(anchors)
    if len(prefixes) != 1:
        found = f"several: {', '.join(p or '(none)' for p in prefixes)}" if prefixes else "none"
        raise CheckpointError(
            f"{path}: expected one encoder (a tensor *{', *'.join(ENCODER_ANCHORS)}), found {found}"
        )
    prefix = prefixes[0]
    encoder = encoder_keys(sd, prefix)
    hidden = encoder[anchors[prefix]].shape[1]
    modules: dict[str, dict[str, np.ndarray]] = {}
    for k, v in sd.items():
        if not k.startswith(prefix):
            module, _, leaf = k.rpartition(".")
            modules.setdefault(module, {})[leaf] = v
    heads = [
        m
        for m, t in modules.items()
        if set(t) == {"weight", "bias"}
        and t["weight"].ndim == 2
        and t["weight"].shape[0] in HEAD_OUTPUTS
    ]
    other = sorted(f"{m}.{leaf}" for m, t in modules.items() if m not in heads[:1] for leaf in t)
    if other:
        raise CheckpointError(
            f"{path}: tensors besides the encoder {prefix}* and one Linear(hidden, 1) head, "
            f"which jaxtpu's model (pooler output -> dropout -> Linear(hidden, 1)) cannot hold: "
            f"{', '.join(other[:4])}{' ...' if len(other) > 4 else ''}"
        )
    head, head_name = {}, None
    if heads:
        head_name = heads[0]
        w, b = modules[head_name]["weight"], modules[head_name]["bias"]
        if w.shape[1] != hidden:
            raise CheckpointError(
                f"{path}: head {head_name} is Linear({w.shape[1]}, 1) but the encoder's hidden "
                f"size is {hidden}; jaxtpu's head reads the pooler output ({hidden} features), "
                "a head over concatenated poolings is not supported"
            )
        head = {"classifier.weight": w, "classifier.bias": b}
    return NotebookCheckpoint(encoder, head, prefix, head_name)


def notebook_state_dict(
    encoder: Mapping[str, np.ndarray],
    head: Mapping[str, np.ndarray],
    encoder_prefix: str = "bert",
    head_name: str = "fc1",
) -> dict[str, np.ndarray]:
    """The reverse of `read_notebook_checkpoint`: one state dict with the encoder under
    `encoder_prefix.` and the head as `head_name.weight/bias`."""
    out = {(f"{encoder_prefix}." if encoder_prefix else "") + k: v for k, v in encoder.items()}
    for k, v in head.items():
        out[f"{head_name}.{k.removeprefix('classifier.')}"] = v
    return out
