"""Which tokenizer class `AutoTokenizer` chose for a directory, remembered (framework-free).

`AutoTokenizer.from_pretrained` decides the class from the directory's `config.json`, which
it reads through transformers' configuration classes, and those import torch where it is
installed: seconds of every JAX-side process that loads a tokenizer, for a choice that
depends only on the directory's settings. So the first load of a directory asks
`AutoTokenizer` and writes down the class it chose, keyed by everything the choice reads
(the path where it is relative, the names of the directory's files, the content of its
`.json` files, and the transformers version); a later load of a directory with the same key
loads that class directly, with the arguments `AutoTokenizer` passes on. Anything unreadable
or changed is a miss, which asks `AutoTokenizer` again: the memo can make a load faster,
never different.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
from pathlib import Path
from typing import Any

from jaxtpu.core.files import cache_root, write_text

log = logging.getLogger(__name__)


def choice_key(directory: Path, transformers_version: str) -> str:
    """A hash of everything `AutoTokenizer`'s class choice for `directory` reads. Of the path,
    only a relative one counts: transformers matches the name it was given against a few hub
    ids (patterns like `deepseek-ai/deepseek-coder-*`), which no absolute path matches, so
    directories of the same content share their entry."""
    given = "" if directory.is_absolute() else str(directory)
    digest = hashlib.sha256(f"{transformers_version}\0{given}".encode())
    for name in sorted(os.listdir(directory)):
        digest.update(f"\0{name}".encode())
        if name.endswith(".json") and (directory / name).is_file():
            digest.update((directory / name).read_bytes())
    return digest.hexdigest()[:32]


def memo_path(key: str) -> Path:
    return cache_root() / "tokenizer-classes" / key


def remembered(key: str) -> type | None:
    """The class written down for `key`, or None (none yet, or it no longer imports)."""
    try:
        module, _, name = memo_path(key).read_text().strip().partition(":")
        return getattr(importlib.import_module(module), name)
    except (OSError, ImportError, AttributeError, ValueError):
        return None


def remember(key: str, cls: type) -> None:
    """Writes down `cls` for `key`; a cache that cannot be written is only a slower next load."""
    try:
        write_text(memo_path(key), f"{cls.__module__}:{cls.__qualname__}\n")
    except OSError as e:
        log.debug("tokenizer class not remembered (%s)", e)


def from_pretrained(directory: Path) -> Any:
    """The fast tokenizer in `directory` of the class `AutoTokenizer` chooses for it."""
    import transformers

    key = choice_key(directory, transformers.__version__)
    cls = remembered(key)
    if cls is not None:  # what AutoTokenizer calls, once it has chosen
        return cls.from_pretrained(str(directory), _from_auto=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory), use_fast=True)
    remember(key, type(tokenizer))
    return tokenizer
