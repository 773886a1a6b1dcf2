"""Tokenization with Hugging Face fast tokenizers, cached on disk (framework-free).

The tokenizer is always loaded from a local directory, never from a model hub. Token ids are
cached by a hash of the texts, the tokenizer's content and the length, so a second run over
the same data skips tokenization and any change to one of them tokenizes again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core.errors import DataError
from jaxtpu.core.files import TMP_SUFFIX, atomic_write, remove_stale_temporaries

log = logging.getLogger(__name__)


def cache_root() -> Path:
    """Where jaxtpu keeps what it can rebuild (token ids, compiled programs): $JAXTPU_CACHE,
    default ~/.cache/jaxtpu."""
    return Path(os.environ.get("JAXTPU_CACHE", Path.home() / ".cache" / "jaxtpu"))


def default_cache_dir() -> Path:
    return cache_root() / "tokens"


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A content hash of a Hugging Face fast tokenizer (vocab, normalizer, special tokens)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        spec = repr(tokenizer)
    else:
        # Truncation/padding settings change with every call: not part of the identity.
        state = json.loads(backend.to_str())
        state.pop("truncation", None)
        state.pop("padding", None)
        spec = json.dumps(state, sort_keys=True)
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def encode_texts(texts: list[str], tokenizer: Any, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask), int32 (len(texts), max_len): truncated and padded to
    `max_len`, with no cache (`tokenize` caches)."""
    enc = tokenizer(
        texts, truncation=True, max_length=max_len, padding="max_length", return_tensors="np"
    )
    return enc["input_ids"].astype(np.int32), enc["attention_mask"].astype(np.int32)


def tokenize(
    texts: list[str], tokenizer: Any, max_len: int, cache_dir: str | os.PathLike | None = None
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Tokenizes with truncation and padding to `max_len`, cached on disk.

    The cache key is a hash of the texts, the tokenizer's content and `max_len`, so any change
    to one of them tokenizes again.

    Returns:
      (input_ids, attention_mask, cache_hit): int32 arrays of shape (len(texts), max_len).
    """
    h = hashlib.sha256()
    h.update(f"{tokenizer_fingerprint(tokenizer)}|{max_len}|{len(texts)}|".encode())
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    path = cache / f"{h.hexdigest()[:32]}.npz"
    if path.exists():
        try:
            with np.load(path) as z:
                return z["input_ids"], z["attention_mask"], True
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            path.unlink(missing_ok=True)
            log.warning(
                "token cache entry %s is damaged (%s); dropped, tokenizing again", path,
                type(e).__name__,
            )  # fmt: skip
    if cache.is_dir():
        remove_stale_temporaries(cache)  # of runs killed while writing an entry
    ids, mask = encode_texts(texts, tokenizer, max_len)
    try:
        with atomic_write(path, "wb") as f:  # a killed run never leaves half a cache file
            np.savez(f, input_ids=ids, attention_mask=mask)
    except OSError as e:
        log.warning("could not write token cache in %s (%s); continuing without it", cache, e)
    return ids, mask, False


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
)


def load_tokenizer(path: str | os.PathLike) -> Any:
    """Loads a Hugging Face fast tokenizer from a local directory (never from a hub)."""
    p = Path(path)
    if not p.is_dir():
        raise DataError(f"tokenizer directory {p} does not exist")
    if not any((p / f).exists() for f in TOKENIZER_VOCABS):
        raise DataError(
            f"{p}: no tokenizer found (one of {', '.join(TOKENIZER_VOCABS)}); "
            "pass --tokenizer-dir with a Hugging Face tokenizer directory"
        )
    from transformers import AutoTokenizer  # lazy: heavy, and only needed here

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return AutoTokenizer.from_pretrained(str(p), use_fast=True)


def save_tokenizer(tokenizer: Any, directory: Path) -> None:
    """Writes `tokenizer` as `directory` (a run's `tokenizer/`), replacing what was there, in
    one rename: a run killed or refused meanwhile leaves the old copy or none, never a mix. A
    full disk is one line naming the path and the space left."""
    from jaxtpu.core.rundir import disk_full, disk_full_message

    directory = Path(directory)
    tmp = directory.with_name(f".{directory.name}.{os.getpid()}{TMP_SUFFIX}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tokenizer.save_pretrained(str(tmp))
        if directory.exists():
            shutil.rmtree(directory)
        os.rename(tmp, directory)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if disk_full(e) is None:
            raise
        raise DataError(disk_full_message(directory, "the tokenizer")) from None
