"""Parsers of the flag values that name another room's things (framework-free): `--buckets`
edges (read by `core.data.buckets`), `--tracker` names (opened by `core.run.trackers`) and
whether --init-from names a jaxtpu run directory, checked here so that the schema can refuse
a bad value before any work.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from jaxtpu.core.errors import ConfigError


def parse_buckets(flag: str, max_len: int) -> str | tuple[int, ...] | None:
    """`--buckets` -> 'auto', None (no buckets) or ascending edges.

    Raises ConfigError naming what is wrong. Edges above --max-len are refused; comments
    longer than the last edge go to a --max-len bucket."""
    text = flag.strip().lower()
    if text in ("auto", "none"):
        return None if text == "none" else "auto"
    try:
        edges = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(
            f"--buckets {flag!r}: expected auto, none or ascending token lengths such as 32,64,128"
        ) from None
    if any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
        raise ConfigError(f"--buckets {flag}: edges must be strictly ascending")
    if edges[0] < 1 or edges[-1] > max_len:
        raise ConfigError(f"--buckets {flag}: edges must be in 1..--max-len {max_len}")
    return edges


TRACKERS = ("tensorboard", "wandb")
INSTALL = {"tensorboard": "pip install tensorboardX", "wandb": "pip install 'jaxtpu[wandb]'"}
MODULE = {"tensorboard": "tensorboardX", "wandb": "wandb"}


def parse_trackers(spec: str) -> tuple[str, ...]:
    """`--tracker` as names, each known and installed: one line naming what is missing and
    how to install it (checked with the flags, before anything is created)."""
    names = tuple(n.strip() for n in spec.split(",") if n.strip() and n.strip() != "none")
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"--tracker {name!r}: choose from {', '.join(TRACKERS)} (or none)")
        if importlib.util.find_spec(MODULE[name]) is None:
            raise ConfigError(
                f"--tracker {name}: its client {MODULE[name]} is not installed: {INSTALL[name]}"
            )
    return names


def is_run_dir(path: str | None) -> bool:
    """Whether `path` is a local jaxtpu run directory (a `config.json` with a `config`
    section): --init-from RUN (`jaxtpu.core.flags.fromrun`)."""
    if not path or "://" in path:  # a run in a bucket is not read here
        return False
    record = Path(path) / "config.json"
    if not record.is_file():
        return False
    try:
        recorded = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(recorded, dict) and isinstance(recorded.get("config"), dict)
