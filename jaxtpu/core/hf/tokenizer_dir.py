"""The files of a Hugging Face tokenizer directory, read without loading the tokenizer
(framework-free): which files it holds, its separator and answer token ids, text pairs' token
types, and copying it into an export with jaxtpu's whitespace rule in its normalizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from jaxtpu.core.errors import CheckpointError

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
    at the ends: `jaxtpu.core.data.templates.normalize_text`) as the first steps of its
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
