"""What compiling a program for a TPU target told preflight, remembered on disk.

JAX's persistent compilation cache keeps loadable executables, and one compiled for a TPU
topology without its chips cannot be loaded back ('PjRtCompiler must be constructed with a
Client'): every preflight of a TPU target compiled afresh, minutes for a large model, for an
answer that depends only on the program and the compiler. Preflight reads three things from a
compilation: the memory accounting, the cost analysis and (for the roofline) the optimised
program's text. `compile_facts` remembers them, and a refusal (a program that does not fit),
beside JAX's cache (`<its directory>/jaxtpu-preflight/`, so `JAXTPU_COMPILE_CACHE=0` and
`JAX_COMPILATION_CACHE_DIR` govern both), keyed by everything the compilation depends on: the
lowered program with its shardings, the devices (kind, ids, coordinates), the jax, jaxlib and
libtpu versions, and the XLA flags (but the host CPU's own) and libtpu flags of the
environment. A changed program, compiler or flag is another key: the memo makes a preflight
faster, never different. Programs for the host's own devices go through JAX's cache as they
always did.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from jaxtpu.core.files import write_bytes

log = logging.getLogger("jaxtpu")

VERSION = 1  # of the entries' layout: a new layout is a new key


@dataclass(frozen=True)
class Memory:
    """The compiler's memory accounting of one executable, per device (bytes), under the
    names of XLA's `memory_analysis()`."""

    argument_size_in_bytes: int = 0
    output_size_in_bytes: int = 0
    alias_size_in_bytes: int = 0
    temp_size_in_bytes: int = 0


@dataclass(frozen=True)
class Facts:
    """What preflight reads from one compilation. `error`: the compiler's refusal (the program
    does not fit), the rest empty. `compile_s`: how long the compilation took when it ran;
    `remembered`: read from the memo (nothing compiled now)."""

    memory: Memory = field(default_factory=Memory)
    cost: dict[str, float] = field(default_factory=dict)
    text: str = ""  # the optimised program (asked for with text=True)
    compile_s: float = 0.0
    error: str = ""
    remembered: bool = False


def refused(e: BaseException) -> bool:
    """Whether a compilation error is the TPU compiler refusing a program that cannot fit."""
    text = str(e)
    return "RESOURCE_EXHAUSTED" in text or "memory" in text.lower()


def memo_dir() -> Path | None:
    """Where entries are kept: beside JAX's persistent compilation cache when it is a local
    directory; None (nothing remembered) without one."""
    import jax

    directory = jax.config.jax_compilation_cache_dir
    if not directory or "://" in directory:
        return None
    return Path(directory) / "jaxtpu-preflight"


def key_of(lowered: Any, devices: list[Any]) -> str:
    """A hash of everything the compilation of `lowered` for `devices` depends on."""
    import jax
    import jaxlib

    parts = [
        f"v{VERSION}",
        lowered.as_text(),
        repr([(d.device_kind, d.id, getattr(d, "coords", None)) for d in devices]),
        jax.__version__,
        jaxlib.__version__,
        _libtpu_version(),
        _flags(os.environ.get("XLA_FLAGS", "")),
        os.environ.get("LIBTPU_INIT_ARGS", ""),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:40]


def _flags(xla_flags: str) -> str:
    """XLA_FLAGS less those of the host's CPU backend (`--xla_cpu_...`), which no compilation
    for another device reads (torch_xla, imported beside JAX, sets one)."""
    return " ".join(f for f in xla_flags.split() if not f.startswith("--xla_cpu_"))


def _libtpu_version() -> str:
    for name in ("libtpu", "libtpu-nightly"):
        try:
            return f"{name}=={metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return ""


def compile_facts(lowered: Any, devices: list[Any], text: bool = False) -> Facts:
    """Compiles `lowered` for `devices` and returns what preflight reads (`text`: the optimised
    program too), or the compiler's refusal as `Facts.error`; for a device set other than the
    host's, from the memo when an earlier preflight compiled the same program (see the module
    docstring). Any other compiler error is raised."""
    foreign = devices[0].platform != "cpu"
    directory = memo_dir() if foreign else None
    path = directory / f"{key_of(lowered, devices)}.json.gz" if directory else None
    known = _read(path) if path else None
    if known is not None and (known.text or known.error or not text):
        return known
    t0 = time.perf_counter()
    try:
        with no_cache_writes(foreign):
            compiled = lowered.compile()
    except Exception as e:
        if not refused(e):
            raise
        facts = Facts(
            compile_s=round(time.perf_counter() - t0, 1), error=str(e).splitlines()[0][:300]
        )
    else:
        facts = _facts_of(compiled, time.perf_counter() - t0, text)
    if path:
        _write(path, facts)
    return facts


def _facts_of(compiled: Any, seconds: float, text: bool) -> Facts:
    mem = compiled.memory_analysis()
    memory = Memory(**{name: int(getattr(mem, name)) for name in Memory.__dataclass_fields__})
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):  # older jax: one dict per program
        cost = cost[0] if cost else {}
    numbers = {k: float(v) for k, v in cost.items() if isinstance(v, (int, float))}
    return Facts(memory, numbers, compiled.as_text() if text else "", round(seconds, 1))


def _read(path: Path) -> Facts | None:
    """The entry at `path`, or None (none yet, or unreadable: then it is compiled again)."""
    try:
        raw = json.loads(gzip.decompress(path.read_bytes()))
        raw["memory"] = Memory(**raw["memory"])
        return Facts(**{**raw, "remembered": True})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as e:
        log.warning("preflight memo %s unreadable (%s): compiling again", path, e)
        return None


def _write(path: Path, facts: Facts) -> None:
    """Keeps `facts` at `path` (atomically); a memo that cannot be written is only a slower
    next preflight."""
    raw = asdict(facts)
    raw.pop("remembered")
    try:
        write_bytes(path, gzip.compress(json.dumps(raw).encode(), compresslevel=6))
    except OSError as e:
        log.warning("preflight memo not written to %s (%s)", path, e)


@contextmanager
def no_cache_writes(active: bool) -> Iterator[None]:
    """No entries in JAX's persistent compilation cache (when one is set up): an executable
    compiled for a TPU topology without its devices cannot be loaded back from it."""
    import jax

    if not active:
        yield
        return
    before = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
    try:
        yield
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before)
