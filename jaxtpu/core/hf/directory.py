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
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core.errors import CheckpointError
from jaxtpu.core.hf.encoder import HEAD_META, EncoderConfig
from jaxtpu.core.hf.heads import JAXTPU_HEAD, HeadLayout, architecture, hf_head, is_classifier

log = logging.getLogger("jaxtpu")

# The files a Hugging Face tokenizer directory holds its vocabulary in: the fast tokenizer's
# own, WordPiece's, byte-level BPE's, or a SentencePiece model (DeBERTa-v3's spm.model, XLM-R's
# sentencepiece.bpe.model), which transformers converts to a fast tokenizer.
TOKENIZER_VOCABS = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spm.model",
    "sentencepiece.bpe.model",
)
# Everything of a tokenizer directory that a copy of it (a run's `tokenizer/`, an export) carries:
# the vocabulary files, byte-level BPE's merges and the tokenizer's own settings.
TOKENIZER_FILES = (
    *TOKENIZER_VOCABS,
    "merges.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",  # transformers >= 4.43 writes a chat template beside the config
    "chat_template.json",
)

HEAD_FILE = "head.safetensors"
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


def _anchored(keys) -> dict[str, str]:
    """{prefix: anchor} of the token embedding tables among state-dict `keys`."""
    return {k[: -len(a)]: a for k in keys for a in ENCODER_ANCHORS if k.endswith(a)}


# Checkpoint keys that are not part of the encoder and are safely ignored.
_IGNORED = re.compile(r"^(cls\.|.*position_ids$)")


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
    prefixes = set(_anchored(raw))
    prefix = prefixes.pop() if len(prefixes) == 1 else ""
    head = {
        k: np.asarray(v, np.float32)
        for k, v in raw.items()
        if prefix and not k.startswith(prefix) and not _IGNORED.match(k)
    }
    return _encoder_keys(raw, prefix), head


def _encoder_keys(raw: Mapping[str, Any], prefix: str) -> dict[str, np.ndarray]:
    """Plain-model keys of the tensors under `prefix` (legacy names fixed, buffers dropped)."""
    out = {}
    for k, v in raw.items():
        if not k.startswith(prefix):
            continue
        k = k.removeprefix(prefix)
        if _IGNORED.match(k):
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
    anchors = _anchored(sd)
    prefixes = sorted(anchors)
    if len(prefixes) != 1:
        found = f"several: {', '.join(p or '(none)' for p in prefixes)}" if prefixes else "none"
        raise CheckpointError(
            f"{path}: expected one encoder (a tensor *{', *'.join(ENCODER_ANCHORS)}), found {found}"
        )
    prefix = prefixes[0]
    encoder = _encoder_keys(sd, prefix)
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


# What `str.split()` splits on (jaxtpu's `normalize_text`), as the tokenizers library's regex:
# Unicode White_Space, plus the four separators U+001C..U+001F Python counts as whitespace.
WHITESPACE = r"[\s\x{1c}-\x{1f}]+"
COLLAPSE = [
    {"type": "Replace", "pattern": {"Regex": WHITESPACE}, "content": " "},
    {"type": "Strip", "strip_left": True, "strip_right": True},
]


def export_tokenizer(tokenizer_dir: str | Path, out: str | Path, collapse: bool = True) -> bool:
    """Copies a run's tokenizer files into an export, its `tokenizer.json` given the
    whitespace rule jaxtpu applies before tokenizing (every run of whitespace one space, none
    at the ends: `jaxtpu.core.data.readers.normalize_text`) as the first steps of its
    normalizer, so that transformers' pipeline() and an onnxruntime user scoring raw text see
    the tokens jaxtpu trained and scores on. Not with `collapse` False: a run that read
    prompts (`--prompt-template`) tokenized their newlines and the chat template's as they
    are, and so must its export. Returns False when there is no tokenizer.json to carry the
    rule (a slow tokenizer's files alone, or `collapse` False)."""
    out = Path(out)
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / name
        if src.exists():
            shutil.copy2(src, out / name)
    path = out / "tokenizer.json"
    if not path.exists() or not collapse:
        return False
    spec = json.loads(path.read_text(encoding="utf-8"))
    spec["normalizer"] = collapsing_whitespace(spec.get("normalizer"))
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return True


def collapsing_whitespace(normalizer: dict[str, Any] | None) -> dict[str, Any]:
    """A tokenizer.json normalizer that collapses whitespace (`COLLAPSE`) first, then does
    what `normalizer` did; one that does so already is returned as it is (an export of a
    run trained from an export)."""
    if normalizer is None:
        return {"type": "Sequence", "normalizers": list(COLLAPSE)}
    if normalizer.get("type") == "Sequence" and normalizer["normalizers"][:2] == COLLAPSE:
        return normalizer
    return {"type": "Sequence", "normalizers": [*COLLAPSE, normalizer]}


def separator_id(tokenizer_dir: str | Path) -> int:
    """The id of a tokenizer directory's separator token (`sep_token` of its
    tokenizer_config.json or special_tokens_map.json, '[SEP]' when neither names one), read from
    its files without loading the tokenizer: the token after which a text pair's second text
    has token type 1 (`segment_types`)."""
    d = Path(tokenizer_dir)
    name: Any = None
    for settings in ("tokenizer_config.json", "special_tokens_map.json"):
        if name is None and (d / settings).exists():
            name = json.loads((d / settings).read_text(encoding="utf-8")).get("sep_token")
    name = (name.get("content") if isinstance(name, dict) else name) or "[SEP]"
    if (d / "tokenizer.json").exists():
        spec = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
        for token in spec.get("added_tokens") or []:
            if token.get("content") == name:
                return int(token["id"])
        vocab = (spec.get("model") or {}).get("vocab")
        if isinstance(vocab, dict) and name in vocab:
            return int(vocab[name])
    if (d / "vocab.txt").exists():
        words = (d / "vocab.txt").read_text(encoding="utf-8").splitlines()
        if name in words:
            return words.index(name)
    raise CheckpointError(
        f"{d}: no id for its separator token {name!r} in its tokenizer files; text pairs "
        "(--task rules) need one to give the second text its token type"
    )


def segment_types(ids: Any, mask: Any, sep: int) -> Any:
    """The token types of text pairs encoded as BERT's tokenizers encode them (`[CLS] a [SEP]
    b [SEP]`): 1 for every real token after the first `sep`, else 0 (padding 0), as the
    tokenizer's own `token_type_ids`. Written once for numpy, jax.numpy and torch arrays: the
    model of each side derives the types from the ids it is given, so no other input exists."""
    is_sep = (ids == sep) * 1  # an integer array in all three
    after = is_sep.cumsum(-1) - is_sep  # separators strictly before each token
    return (after > 0) * (mask > 0)


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


def answer_ids(tokenizer_dir: str | Path, answers: str) -> tuple[int, int]:
    """The token ids of --answer-tokens 'YES,NO' in a tokenizer directory's tokenizer.json,
    each refused in one line unless it is exactly one token."""
    from tokenizers import Tokenizer  # the Rust tokenizer alone: no transformers import

    path = Path(tokenizer_dir) / "tokenizer.json"
    words = [w for w in answers.split(",")]
    if len(words) != 2 or not all(words):
        raise CheckpointError(f"--answer-tokens {answers!r}: expected two answers, YES,NO")
    if not path.exists():
        raise CheckpointError(f"{tokenizer_dir}: no tokenizer.json to find --answer-tokens in")
    tok = Tokenizer.from_file(str(path))
    ids = []
    for word in words:
        found = tok.encode(word, add_special_tokens=False).ids
        if len(found) != 1:
            raise CheckpointError(
                f"--answer-tokens: {word!r} is {len(found)} tokens of {tokenizer_dir}'s "
                "tokenizer; each answer must be one token"
            )
        ids.append(found[0])
    if ids[0] == ids[1]:
        raise CheckpointError(f"--answer-tokens {answers!r}: both answers are token {ids[0]}")
    return ids[0], ids[1]
