"""Hugging Face checkpoint directories, framework-free: reading a state dict, fitting it to a
model's tensors (one check for both sides), and writing a directory both sides load.

A directory written here holds the encoder as its family's plain model (`BertModel`,
`RobertaModel`, ... in `model.safetensors`, loadable by `transformers.AutoModel.from_pretrained`
with no missing or unexpected keys), the Dense head in `head.safetensors` (`classifier.weight`,
`classifier.bias`, as `nn.Linear(hidden, outputs)`), `jaxtpu_head.json` saying which task,
dropout and pooling the head belongs to, and the tokenizer files. Flax's side of the mapping
is `jaxtpu.engine.weights`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core.errors import CheckpointError
from jaxtpu.core.hf.encoder import HEAD_META, EncoderConfig
from jaxtpu.core.hf.heads import JAXTPU_HEAD, HeadLayout, architecture, hf_head, is_classifier
from jaxtpu.core.hf.statedict import (
    IGNORED,
    anchored,
    encoder_keys,
    read_notebook_checkpoint,
    read_torch_file,
)
from jaxtpu.core.hf.tokenizer_dir import export_tokenizer

log = logging.getLogger("jaxtpu")


HEAD_FILE = "head.safetensors"


def read_state_dict(model_dir: str | Path) -> dict[str, np.ndarray]:
    """The encoder parameters of a Hugging Face directory as fp32 numpy arrays, in the keys of
    the family's plain model: the prefix of a task model (`bert.`, `roberta.`, `deberta.`,
    ... of `*ForSequenceClassification` or `*ForMaskedLM`) is removed and the tensors outside
    it (its task head) left out, as are buffers such as `position_ids`."""
    return read_checkpoint(model_dir)[0]


def read_checkpoint(model_dir: str | Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(encoder, task head) of a Hugging Face directory: the encoder as `read_state_dict`
    gives it, and the tensors outside the task model's encoder prefix (the classification
    head of a `*ForSequenceClassification` checkpoint, in its own keys; {} for a plain
    encoder)."""
    d = Path(model_dir)
    st, binf = d / "model.safetensors", d / "pytorch_model.bin"
    if st.exists():
        from safetensors.numpy import load_file

        try:
            raw = load_file(str(st))
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{st}: unreadable safetensors file ({e})") from None
    elif binf.exists():
        raw = read_torch_file(binf)
    else:
        raise CheckpointError(f"{d}: no model.safetensors or pytorch_model.bin")
    prefixes = set(anchored(raw))
    prefix = prefixes.pop() if len(prefixes) == 1 else ""
    head = {
        k: np.asarray(v, np.float32)
        for k, v in raw.items()
        if prefix and not k.startswith(prefix) and not IGNORED.match(k)
    }
    return encoder_keys(raw, prefix), head


def fit_state_dict(
    model_dir: str | Path,
    expected: Mapping[str, tuple[int, ...]],
    head_required: bool = False,
    layout: HeadLayout = JAXTPU_HEAD,
) -> tuple[dict[str, np.ndarray], list[str]]:
    """The tensors of a Hugging Face directory (encoder, and head if present) or of a training
    notebook's state-dict file (`read_notebook_checkpoint`) that a model needs, checked
    against its shapes. Framework-free: both sides load through this.

    Args:
      model_dir: the checkpoint directory, or a notebook's `.bin` / `.pt` / Lightning `.ckpt`.
      expected: the model's tensors, Hugging Face keys (no `bert.` prefix; head as
        `classifier.*`) -> shape in Hugging Face (torch) orientation.
      head_required: fail if the directory has no head (loading a fine-tuned model).
      layout: the model's head (`jaxtpu.core.hf.heads.head_layout`). jaxtpu's reads
        `head.safetensors`; the family's own (`--head hf`) reads the head of a
        `*ForSequenceClassification` checkpoint. A head of the other kind is left out, and
        the log says so.
    Returns:
      (found, kept): the expected tensors present in the directory (numpy fp32), and the
      expected keys that are not (the head of a plain BertModel, a missing pooler), which keep
      their initial value.
    Raises:
      CheckpointError: naming the first tensor whose shape does not fit, or when more than a
      pooler of the encoder is missing.
    """
    d = Path(model_dir)
    sd = _tensors(d, head_required, layout)
    output = layout.output + ".weight"
    head_w, want = sd.get(output), expected.get(output)
    if head_w is not None and want is not None and head_w.shape[0] != want[0]:
        raise CheckpointError(
            f"{d}: its head scores {head_w.shape[0]} outputs per comment "
            f"({_head_kind(head_w.shape[0])}), this run's task {_head_kind(want[0])}; train "
            f"with the task it was exported from (--task), or use its encoder alone (drop "
            f"{HEAD_FILE} / the head tensors)"
        )
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
    unused = sorted(k for k in sd if k not in expected)
    if unused and all(k.startswith("pooler.") for k in unused):
        # a pooler the model has no use for: RoBERTa's own classifier reads the first token
        log.info("%s: its pooler is not used (the head reads the first token)", d)
        unused = []
    if unused:
        raise CheckpointError(
            f"{d}: {len(unused)} tensor(s) the model has no place for (first: {unused[0]}): the "
            "checkpoint holds more than its config.json describes (e.g. more layers than "
            "num_hidden_layers); fix config.json so that every tensor is used"
        )
    encoder_kept = [k for k in kept if not layout.holds(k)]
    if len(encoder_kept) > 2:  # a pooler may be missing; a whole encoder may not
        raise CheckpointError(
            f"{d}: {len(encoder_kept)} encoder tensors missing (first: {encoder_kept[0]}); "
            "not a checkpoint of this family and shape (check config.json)"
        )
    return found, kept


def _tensors(d: Path, head_required: bool, layout: HeadLayout) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint directory or notebook file, with the head that fits
    `layout` (`_fitting_head`, `_token_head`), Hugging Face keys."""
    if d.is_file():
        notebook = read_notebook_checkpoint(d)
        sd = {**notebook.encoder, **notebook.head}
        if head_required and (not notebook.head or layout.kind == "hf"):
            what = "a family's classification head" if notebook.head else "Linear(hidden, 1) head"
            raise CheckpointError(f"{d}: no {what} beside the encoder")
        if notebook.head and layout.kind == "hf":
            log.warning("%s: its Linear head is not a transformers head; --head hf starts one", d)
            sd = dict(notebook.encoder)
    else:
        sd, task_head = read_checkpoint(d)
        fitted = _fitting_head(d, task_head, layout, head_required and not layout.answers)
        if layout.answers:
            fitted = _token_head(d, sd, task_head, layout, fitted, head_required)
        sd.update(fitted)
    return sd


def _fitting_head(
    d: Path, task_head: dict[str, np.ndarray], layout: HeadLayout, required: bool
) -> dict[str, np.ndarray]:
    """The head tensors of directory `d` a model with head `layout` loads: jaxtpu's
    `head.safetensors`, or a `*ForSequenceClassification` checkpoint's own head; one of the
    other kind is left out, said in the log."""
    jaxtpu_head = d / HEAD_FILE
    if layout.kind == "hf":
        if task_head and _is_classifier_dir(d):
            return task_head
        if jaxtpu_head.exists():
            log.warning(
                "%s: its head (%s) is jaxtpu's, not a transformers class; --head hf starts "
                "its own head",
                d,
                HEAD_FILE,
            )
        if required:
            raise CheckpointError(
                f"{d}: no classification head of its family (not a *ForSequenceClassification "
                "checkpoint)"
            )
        return {}
    if task_head and _is_classifier_dir(d):
        log.warning(
            "%s: its classification head is left out (--head jaxtpu starts a new one); "
            "--head hf keeps it",
            d,
        )
    if jaxtpu_head.exists():
        from safetensors.numpy import load_file

        return load_file(str(jaxtpu_head))
    if required:
        raise CheckpointError(f"{d}: no {HEAD_FILE}; not a fine-tuned jaxtpu export")
    return {}


def _is_classifier_dir(d: Path) -> bool:
    try:
        return is_classifier(json.loads((d / "config.json").read_text()))
    except (OSError, ValueError):
        return False


def _head_kind(outputs: int) -> str:
    return "one score: toxicity or ranking" if outputs == 1 else f"{outputs}: e.g. multilabel"


def save_tensors(tensors: dict[str, np.ndarray], path: str | Path) -> Path:
    """`tensors` as a safetensors file at `path`, readable as any file the process writes:
    safetensors creates its files 0600, which left an export's weights unreadable to another
    account (a server's, a shared team directory) while the rest of it was 0644."""
    from safetensors.numpy import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)
    return Path(path)


def write_hf_dir(
    out_dir: str | Path,
    enc: EncoderConfig,
    encoder: dict[str, np.ndarray],
    head: dict[str, np.ndarray],
    tokenizer_dir: str | Path | None = None,
    head_meta: dict[str, Any] | None = None,
    classifier: dict[str, Any] | None = None,
) -> Path:
    """Writes state dicts (numpy, Hugging Face keys) as a Hugging Face directory; both sides
    save through here, so their exports have one format. With `classifier` (the config.json
    keys of `jaxtpu.core.hf.heads.classifier_fields`) the head is the family's own and the
    directory a `*ForSequenceClassification` checkpoint: one `model.safetensors` of the
    encoder under its prefix and the head, in the keys transformers' class has."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = enc.to_hf_dict()
    if classifier is not None:
        head_of = hf_head(enc.model_type)
        tensors = {f"{head_of.prefix}.{k}": v for k, v in encoder.items()}
        tensors.update(head)
        config.update(classifier)
        config["architectures"] = [architecture(enc.model_type, enc.family.architecture)]
        save_tensors(tensors, out / "model.safetensors")
    else:
        save_tensors(encoder, out / "model.safetensors")
        if head:
            save_tensors(head, out / HEAD_FILE)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    if head:
        (out / HEAD_META).write_text(json.dumps(head_meta or {}, indent=2, sort_keys=True))
    if tokenizer_dir:
        export_tokenizer(tokenizer_dir, out)
    return out


def _token_head(
    d: Path,
    encoder: Mapping[str, np.ndarray],
    task_head: Mapping[str, np.ndarray],
    layout: Any,
    fitted: dict[str, np.ndarray],
    head_required: bool,
) -> dict[str, np.ndarray]:
    """--token-head's head: a trained one (`fitted`, when the head is required: a run's
    export), else one started from the LM head (`answer_head`); a classifier checkpoint's
    own head to start from is refused, since it has no LM head."""
    if fitted and not head_required:
        raise CheckpointError(
            f"{d}: a *ForSequenceClassification checkpoint (its own "
            f"{layout.output}.weight, no language-model head): --token-head starts the "
            "score from a *ForCausalLM checkpoint's LM head; drop --token-head to train "
            "this classifier's head as it is"
        )
    return fitted or answer_head(d, encoder, task_head, layout)


def answer_head(
    d: Path, encoder: Mapping[str, np.ndarray], task_head: Mapping[str, np.ndarray], layout: Any
) -> dict[str, np.ndarray]:
    """--token-head: the output layer of a decoder's classification head as the log-odds of
    its two answer tokens: the row of the yes token of its language-model head minus the row
    of the no token (`lm_head.weight`, or the token embeddings when the config ties them), so
    the score at the last token is logit(yes) - logit(no)."""
    weight = task_head.get("lm_head.weight")
    if weight is None:
        config = json.loads((d / "config.json").read_text()) if (d / "config.json").exists() else {}
        if config.get("tie_word_embeddings"):
            weight = encoder.get("embed_tokens.weight")
    if weight is None:
        raise CheckpointError(
            f"{d}: no language-model head (lm_head.weight, or tied embeddings) to start "
            "--token-head from; give a *ForCausalLM checkpoint, or drop --token-head"
        )
    yes, no = layout.answers
    row = (np.asarray(weight[yes], np.float32) - np.asarray(weight[no], np.float32))[None, :]
    log.info("%s: --token-head: the score starts as logit(%d) - logit(%d)", d, yes, no)
    return {f"{layout.output}.weight": row}
