"""Tokenization with Hugging Face fast tokenizers, cached on disk (framework-free).

The tokenizer is always loaded from a local directory, never from a model hub. Token ids are
cached by a hash of the texts, the tokenizer's content and the length, so a second run over
the same data skips tokenization and any change to one of them tokenizes again.

Memory: texts are encoded `CHUNK` at a time (the fast tokenizer's batch call, on every core),
so the tokenizer's per-text objects of one chunk are all that exists besides the int32 result.
A cache entry is one `.npy` file of shape (texts, 2, length), each text's ids beside its mask,
written chunk by chunk and then mapped (`np.load(mmap_mode="r")`): a run reads from it only the
rows its batches take, and the processes of one host share the pages.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core.data import prompts
from jaxtpu.core.data.buckets import real_lengths
from jaxtpu.core.errors import DataError
from jaxtpu.core.files import (
    TMP_SUFFIX,
    atomic_write,
    cache_root,
    disk_full,
    disk_full_message,
    remove_stale_temporaries,
)
from jaxtpu.core.hf import tokenizer_class
from jaxtpu.core.hf.tokenizer_dir import TOKENIZER_VOCABS
from jaxtpu.core.textformat import COMMENT, PAIR, PROMPT

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    return cache_root() / "tokens"


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A content hash of a Hugging Face fast tokenizer: everything that shapes its padded
    arrays (vocab, normalizer, special tokens, chat template, and the pad id and side, which
    `_padded` writes and the backend's own padding state does not say)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        described = repr(tokenizer)
    else:
        # Truncation/padding settings change with every call: not part of the fingerprint.
        state = json.loads(backend.to_str())
        state.pop("truncation", None)
        state.pop("padding", None)
        chat = getattr(tokenizer, "chat_template", None)
        if chat:  # a prompt's tokens are the chat template's
            state["chat_template"] = chat
        described = json.dumps(state, sort_keys=True)
    pad = getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "padding_side", None)
    described += f"|pad={pad[0]}|side={pad[1]}"
    return hashlib.sha256(described.encode()).hexdigest()[:16]


def pad_with(tokenizer: Any, pad_id: int | None, where: str) -> Any:
    """`tokenizer`, padding with `pad_id`: a decoder's config `pad_token_id`, the id its
    classifier pools by (the last token that is not it, transformers' rule), so padding and
    pooling agree; a tokenizer without a pad token (Llama 3's) pads with it, as transformers'
    classifiers are documented to. One line says so when it changes anything; None (an
    encoder) leaves the tokenizer as it is."""
    if pad_id is None or tokenizer.pad_token_id == pad_id:
        return tokenizer
    if not 0 <= pad_id < len(tokenizer):
        raise DataError(
            f"{where}: the model's pad_token_id {pad_id} is not a token of its tokenizer "
            f"({len(tokenizer)} tokens); give the tokenizer of this checkpoint"
        )
    token = tokenizer.convert_ids_to_tokens(pad_id)
    if tokenizer.pad_token_id is None:
        log.info(
            "%s: the tokenizer has no pad token; padding with the model's pad_token_id %d (%r), "
            "as transformers' classifiers do",
            where,
            pad_id,
            token,
        )
    else:
        log.warning(
            "%s: the tokenizer pads with id %d (%r) but the model's config.json says "
            "pad_token_id %d (%r), the token its classifier pools before; padding with %d",
            where,
            tokenizer.pad_token_id,
            tokenizer.pad_token,
            pad_id,
            token,
            pad_id,
        )
    tokenizer.pad_token = token
    if tokenizer.pad_token_id != pad_id:  # a token string that maps elsewhere
        raise DataError(
            f"{where}: the model's pad_token_id {pad_id} ({token!r}) cannot be the tokenizer's "
            f"pad token (it reads as id {tokenizer.pad_token_id})"
        )
    return tokenizer


CHUNK = 8192  # texts per tokenizer call: its objects for 8192 texts are a few tens of MB


def _chunks(
    texts: Sequence[Any], tokenizer: Any, max_len: int, form: str = COMMENT
) -> Iterator[tuple[int, np.ndarray]]:
    """(start, (k, 2, max_len) int32 ids and mask) of each chunk of `texts` in `form`
    (`jaxtpu.core.textformat`): texts, text pairs (the rules task), whose second text is
    truncated, never the first (the callers' `check_fit` has refused a first text that leaves
    no room), or prompts (`prompts.prompt_ids`: their comment is truncated, never the
    instructions)."""
    chunks = FORMS[form][0]
    for start in range(0, len(texts), CHUNK):
        yield start, chunks(texts[start : start + CHUNK], tokenizer, max_len)


def _prompt_chunk(part: Sequence[Any], tokenizer: Any, max_len: int) -> np.ndarray:
    if tokenizer.pad_token_id is None:
        raise DataError("the tokenizer has no pad token: prompts cannot be batched")
    ids = prompts.prompt_ids(part, tokenizer, max_len)
    return _padded(ids, max_len, tokenizer.pad_token_id, tokenizer.padding_side == "left")


def _text_chunk(part: Sequence[Any], tokenizer: Any, max_len: int, pairs: bool = False) -> Any:
    backend = _backend(tokenizer, max_len, "only_second" if pairs else "longest_first")
    if backend is None:
        args = ([a for a, _ in part], [b for _, b in part]) if pairs else (part,)
        enc = tokenizer(
            *args,
            truncation="only_second" if pairs else True,
            max_length=max_len,
            padding="max_length",
            return_tensors="np",
        )
        return np.stack([enc["input_ids"], enc["attention_mask"]], 1).astype(np.int32)
    return _padded(
        [e.ids for e in backend.encode_batch(part, add_special_tokens=True)],
        max_len,
        tokenizer.pad_token_id,
        tokenizer.padding_side == "left",
    )


def _pair_chunk(part: Sequence[Any], tokenizer: Any, max_len: int) -> np.ndarray:
    return _text_chunk(part, tokenizer, max_len, pairs=True)


def check_fit(texts: Sequence[Any], tokenizer: Any, max_len: int, form: str = COMMENT) -> None:
    """Refuses text pairs or prompts whose fixed part leaves no room for the comment
    (`check_pairs_fit`, `prompts.check_prompts_fit`); texts always fit."""
    fits = FORMS[form][1]
    if fits is not None and len(texts):
        fits(texts, tokenizer, max_len)


def check_pairs_fit(pairs: Sequence[tuple[str, str]], tokenizer: Any, max_len: int) -> None:
    """Refuses text pairs whose first text (the rule, with what the template puts beside it)
    leaves fewer than 8 tokens of `max_len` for the second (the comment), which is the one
    truncated: one line naming the longest first text's length."""
    firsts = sorted({a for a, _ in pairs})
    special = tokenizer.num_special_tokens_to_add(pair=True)
    lengths = [len(ids) for ids in tokenizer(firsts, add_special_tokens=False)["input_ids"]]
    worst = int(np.argmax(lengths))
    if lengths[worst] + special + 8 > max_len:
        raise DataError(
            f"the first text of a pair takes {lengths[worst]} tokens (+{special} special) of "
            f"--max-len {max_len}, leaving under 8 for the comment, which is the one truncated: "
            f"raise --max-len or shorten --rule-template (the longest: {firsts[worst][:80]!r})"
        )


# How each form of `jaxtpu.core.textformat` is tokenized: (a chunk's ids and mask, the check
# that its fixed part leaves the comment room, or None). A new form is a row here.
FORMS: dict[str, tuple[Callable[..., np.ndarray], Callable[..., None] | None]] = {
    COMMENT: (_text_chunk, None),
    PAIR: (_pair_chunk, check_pairs_fit),
    PROMPT: (_prompt_chunk, prompts.check_prompts_fit),
}


def _padded(ids: list[list[int]], max_len: int, pad_id: int, left: bool) -> np.ndarray:
    """(k, 2, max_len) ids and mask of `k` truncated, unpadded id lists, padded as the
    tokenizer pads (its pad id, on its side): one flat conversion of the real ids, no list of
    `max_len` ints per text."""
    k = len(ids)
    lens = np.fromiter(map(len, ids), np.int64, count=k)
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, count=int(lens.sum()))
    out = np.zeros((k, 2, max_len), np.int32)
    out[:, 0] = pad_id
    rows = np.repeat(np.arange(k), lens)
    cols = np.arange(flat.size) - np.repeat(np.cumsum(lens) - lens, lens)
    if left:
        cols += (max_len - lens)[rows]
    out[rows, 0, cols] = flat
    out[rows, 1, cols] = 1
    return out


def _backend(tokenizer: Any, max_len: int, strategy: str = "longest_first") -> Any:
    """The `tokenizers.Tokenizer` under a Hugging Face fast tokenizer, set to truncate to
    `max_len` as `tokenizer(..., truncation=True, padding="max_length")` sets it (`strategy`
    'only_second' as `truncation="only_second"` does, for text pairs): what that call runs,
    without its conversion of every padded id to a Python list and back (`_padded` pads);
    None when the tokenizer is not a fast one or has no pad token (the call then says why)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "pad_token", None) is None:
        return None
    backend.enable_truncation(
        max_len, stride=0, strategy=strategy, direction=tokenizer.truncation_side
    )
    backend.no_padding()  # `_padded` pads, as the tokenizer would
    return backend


def encode_texts(
    texts: Sequence[Any], tokenizer: Any, max_len: int, form: str = COMMENT
) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask), int32 (len(texts), max_len) of texts, text pairs or
    prompts (`form`, `jaxtpu.core.textformat`): truncated and padded to `max_len`, with no
    cache (`tokenize` caches)."""
    check_fit(texts, tokenizer, max_len, form)
    both = np.empty((len(texts), 2, max_len), np.int32)
    for start, chunk in _chunks(texts, tokenizer, max_len, form):
        both[start : start + len(chunk)] = chunk
    return both[:, 0], both[:, 1]


def _read_entry(path: Path, shape: tuple[int, int, int]) -> np.ndarray:
    """The mapped cache entry; ValueError when it is not a whole entry of this shape (a
    truncated file fails to map, and is never read)."""
    both = np.load(path, mmap_mode="r", allow_pickle=False)
    if both.shape != shape or both.dtype != np.int32:
        raise ValueError(f"holds {both.dtype} {both.shape}, expected int32 {shape}")
    return both


def _write_entry(
    path: Path, texts: list[Any], tokenizer: Any, max_len: int, form: str = COMMENT
) -> np.ndarray:
    """Tokenizes `texts` into the `.npy` file `path`, chunk by chunk (a killed run leaves a
    temporary file, never half an entry), and each text's length beside it (`_lengths_file`).
    Returns the lengths."""
    header = {"descr": "<i4", "fortran_order": False, "shape": (len(texts), 2, max_len)}
    lengths = np.zeros(len(texts), np.int32)
    with atomic_write(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        for start, chunk in _chunks(texts, tokenizer, max_len, form):
            f.write(np.ascontiguousarray(chunk, "<i4").tobytes())
            lengths[start : start + len(chunk)] = real_lengths(chunk[:, 1])
    _save_lengths(path, lengths)
    return lengths


def _lengths_file(path: Path) -> Path:
    """Beside each entry, its texts' lengths (`buckets.real_lengths` of the mask): what the
    length buckets need, read without touching the entry's pages."""
    return path.with_suffix(".lengths")


def _save_lengths(path: Path, lengths: np.ndarray) -> None:
    with atomic_write(_lengths_file(path), "wb") as f:
        np.save(f, lengths, allow_pickle=False)


def _read_lengths(path: Path, mask: np.ndarray) -> np.ndarray:
    """The entry's lengths; computed from the mask (and saved again) when their file is
    missing or damaged."""
    try:
        lengths = np.load(_lengths_file(path), allow_pickle=False)
        if lengths.shape == mask.shape[:1] and lengths.dtype == np.int32:
            return lengths
    except (OSError, ValueError, EOFError):
        pass
    lengths = real_lengths(mask).astype(np.int32)
    with contextlib.suppress(OSError):
        _save_lengths(path, lengths)
    return lengths


@dataclass(frozen=True)
class Tokens:
    """Texts tokenized to one length: ids and mask (N, L) int32, read-only views of the mapped
    cache entry (in memory when there is no cache), and each text's length (N,)."""

    ids: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    cache_hit: bool


def digest_texts(texts: Iterable[str]) -> np.ndarray:
    """(N, 16) uint8: a 128-bit BLAKE2b digest of each text. The token cache is keyed by these
    (with the tokenizer and length), so a run that has them (`jaxtpu.core.data.taskdata`'s file
    cache) finds its tokens without holding, or even reading, the texts."""
    return np.frombuffer(
        b"".join(hashlib.blake2b(t.encode(), digest_size=16).digest() for t in texts), np.uint8
    ).reshape(-1, 16)


def digest_pairs(first: Iterable[str], second: Iterable[str]) -> np.ndarray:
    """(N, 16) uint8: the digest of each text pair (the rules task's rule and comment), never
    equal to a single text's."""
    return digest_texts(f"\x00pair\x00{a}\x00{b}" for a, b in zip(first, second, strict=True))


def tokenize(
    texts: list[str], tokenizer: Any, max_len: int, cache_dir: str | os.PathLike | None = None
) -> tuple[np.ndarray, np.ndarray, bool]:
    """(input_ids, attention_mask, cache_hit) of `cached_tokens` for texts in hand."""
    t = cached_tokens(lambda: texts, digest_texts(texts), tokenizer, max_len, cache_dir)
    return t.ids, t.mask, t.cache_hit


def cached_tokens(
    texts: Callable[[], Sequence[str]],
    digests: np.ndarray,
    tokenizer: Any,
    max_len: int,
    cache_dir: str | os.PathLike | None = None,
    form: str = COMMENT,
) -> Tokens:
    """Tokenizes with truncation and padding to `max_len`, cached on disk.

    Args:
      texts: gives the texts; called only when the cache does not hold them.
      digests: `digest_texts` of those texts, the cache key with the tokenizer's content and
        `max_len` (any change to one of them tokenizes again).
      form: the texts' form (`jaxtpu.core.textformat`): texts, text pairs or prompts.
    """
    n = digests.shape[0]
    h = hashlib.sha256()
    h.update(f"{tokenizer_fingerprint(tokenizer)}|{max_len}|{n}|".encode())
    h.update(np.ascontiguousarray(digests, np.uint8).tobytes())
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    path = cache / f"{h.hexdigest()[:32]}.npy"
    shape = (n, 2, max_len)
    try:
        cache.mkdir(parents=True, exist_ok=True)
        lock = os.open(cache / f".{path.stem}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        log.warning("token cache %s cannot be used (%s); tokenizing without it", cache, e)
        return _in_memory(list(texts()), tokenizer, max_len, form)
    # One process of a host tokenizes an entry; the others wait for it and map it.
    with _held(lock):
        if path.exists():
            try:
                both = _read_entry(path, shape)
                return Tokens(both[:, 0], both[:, 1], _read_lengths(path, both[:, 1]), True)
            except (OSError, ValueError, EOFError) as e:
                path.unlink(missing_ok=True)
                log.warning(
                    "token cache entry %s is damaged (%s); dropped, tokenizing again",
                    path,
                    type(e).__name__,
                )
        remove_stale_temporaries(cache)  # of runs killed while writing an entry
        listed = list(texts())
        if len(listed) != n:
            raise DataError(f"{len(listed)} texts to tokenize, {n} digests: they must match")
        check_fit(listed, tokenizer, max_len, form)  # first: a refusal is not a failed cache
        try:
            lengths = _write_entry(path, listed, tokenizer, max_len, form)
            both = _read_entry(path, shape)
        except (OSError, ValueError) as e:
            log.warning("could not write token cache in %s (%s); continuing without it", cache, e)
            return _in_memory(listed, tokenizer, max_len, form)
    return Tokens(both[:, 0], both[:, 1], lengths, False)


def _in_memory(texts: list[Any], tokenizer: Any, max_len: int, form: str = COMMENT) -> Tokens:
    ids, mask = encode_texts(texts, tokenizer, max_len, form)
    return Tokens(ids, mask, real_lengths(mask).astype(np.int32), False)


@contextlib.contextmanager
def _held(fd: int) -> Iterator[None]:
    """An exclusive lock on the open (empty, kept) lock file `fd`, closed after; the kernel
    drops the lock when its process dies, so a killed run never blocks the next."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def load_tokenizer(path: str | os.PathLike, pad_id: int | None = None) -> Any:
    """Loads a Hugging Face fast tokenizer from a local directory (never from a hub), padding
    with `pad_id` when given (`pad_with`: a decoder's, `RunSpec.pad_id`)."""
    p = Path(path)
    if not p.is_dir():
        raise DataError(f"tokenizer directory {p} does not exist")
    if not any((p / f).exists() for f in TOKENIZER_VOCABS):
        raise DataError(
            f"{p}: no tokenizer found (one of {', '.join(TOKENIZER_VOCABS)}); "
            "pass --tokenizer-dir with a Hugging Face tokenizer directory"
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return pad_with(tokenizer_class.from_pretrained(p), pad_id, str(p))


def save_tokenizer(tokenizer: Any, directory: Path) -> None:
    """Writes `tokenizer` as `directory` (a run's `tokenizer/`), replacing what was there, in
    one rename: a run killed or refused meanwhile leaves the old copy or none, never a mix. A
    full disk is one line naming the path and the space left."""
    directory = Path(directory)
    tmp = directory.with_name(f".{directory.name}.{os.getpid()}{TMP_SUFFIX}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tokenizer.save_pretrained(str(tmp))
        if directory.exists():
            shutil.rmtree(directory)
        os.rename(tmp, directory)
    except Exception as e:  # the Rust writer's errors are plain Exceptions ("os error 28")
        shutil.rmtree(tmp, ignore_errors=True)
        if disk_full(e) is None:
            raise
        # written when a run starts (or resumes), before any step: nothing of it is lost
        advice = "free some space and run the same command again"
        raise DataError(disk_full_message(directory, "the tokenizer", advice)) from None
