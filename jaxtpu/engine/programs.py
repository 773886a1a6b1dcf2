"""Compiled programs saved on one machine and run on another (`preflight --save-programs DIR`,
`train --programs DIR`), as MaxText's `train_compile.py` ships them: compile a run for a TPU
topology on a CPU host, copy DIR to the TPU VM, train there without compiling.

DIR holds `programs.json` (what the programs were compiled for, and one line per program) and
one file per program, JAX's executable serialization (`jax.experimental.serialize_executable`)
of each train-call length and each eval length of the run.

What makes a saved program usable, checked before one is loaded:
- the environment: platform, device kind and count, jax / jaxlib / libtpu versions and the XLA
  flags (`environment`) must be equal; and
- the program itself: the hash of the lowered (StableHLO) program this run would compile must
  be the one saved. Anything in the configuration that changes the program (the model, batch,
  precision, placement, the optimizer and its schedule's length, ...) changes that hash; a
  flag that does not (the run directory, logging intervals) does not.
A mismatch is refused in one line that names what differs; a saved program is never run for
another program. Only load programs you made: unpickling an executable can run code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import jax
from jax.experimental import serialize_executable

from jaxtpu.core import files, storage
from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.schema import OUTSIDE_PROGRAMS, Config, changed_flags
from jaxtpu.core.versions import installed

log = logging.getLogger("jaxtpu")

MANIFEST = "programs.json"
FORMAT = 1
# the virtual CPU device count jaxtpu sets itself; the device count is checked on its own
_DEVICE_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=\d+\s*")


def environment(devices: list[Any]) -> dict[str, Any]:
    """What a compiled program is bound to besides the program: where it runs, the compiler
    that built it and that compiler's flags."""
    return {
        "platform": devices[0].platform,
        "device_kind": devices[0].device_kind,
        "devices": len(devices),
        "device_ids": [d.id for d in devices],
        "jax": jax.__version__,
        "jaxlib": installed("jaxlib"),
        "libtpu": installed("libtpu") if devices[0].platform == "tpu" else "-",
        "XLA_FLAGS": _DEVICE_COUNT_FLAG.sub("", os.environ.get("XLA_FLAGS", "")).strip(),
        "LIBTPU_INIT_ARGS": os.environ.get("LIBTPU_INIT_ARGS", "").strip(),
    }


_FUNC = re.compile(r"  func\.func (?:public |private )?@([\w.$-]+)\(")
_SYMBOL = re.compile(r"@([\w.$-]+)")


def program_hash(lowered: Any) -> str:
    """A SHA-256 of a lowered program's StableHLO text (no debug locations) that two
    processes agree on: JAX names a module's private functions (`_where_6`) and shares or
    repeats their bodies depending on what the process lowered before, so each function is
    hashed with the hashes of the functions it calls in place of their names (a Merkle hash
    from `main`), and the module's other lines as they are."""
    funcs: dict[str, list[str]] = {}
    rest: list[str] = []
    current = None
    for line in lowered.as_text().splitlines():
        start = _FUNC.match(line)
        if start:
            current = start.group(1)
            funcs[current] = [line]
        elif current is not None:
            funcs[current].append(line)
            current = None if line == "  }" else current
        else:
            rest.append(line)
    memo: dict[str, str] = {}

    def digest(name: str) -> str:
        if name not in memo:

            def symbol(m: re.Match) -> str:
                s = m.group(1)
                if s == name:
                    return "@self"
                return f"@{digest(s)}" if s in funcs else m.group(0)

            body = _SYMBOL.sub(symbol, "\n".join(funcs[name]))
            memo[name] = hashlib.sha256(body.encode()).hexdigest()
        return memo[name]

    return hashlib.sha256("\n".join([*rest, digest("main")]).encode()).hexdigest()


def _name(kind: str, key: Any) -> str:
    """A readable file name for a program: its kind and its inputs' shapes."""
    dims = "_".join("x".join(map(str, shape)) for _, shape, _ in key)
    return f"{kind}-{hashlib.sha256(repr(key).encode()).hexdigest()[:12]}-{dims[:80]}.bin"


def describe(kind: str, key: Any) -> str:
    """'train call of length 128' / 'eval of length 64' from a program's input shapes."""
    shape = dict((k, s) for k, s, _ in key).get("input_ids") or key[0][1]
    return f"{'train call' if kind == 'train' else 'eval'} of length {shape[-1]}"


def _diff(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """'name now (saved: then)' for every entry of the environment that differs."""
    return [
        f"{k} {now.get(k)!r} (saved: {saved.get(k)!r})"
        for k in sorted(set(saved) | set(now))
        if saved.get(k) != now.get(k)
    ]


# flags that name where a run writes or how it reports, never what it computes
def save(
    directory: Path,
    programs: dict[Any, tuple[Any, Any]],
    devices: list[Any],
    config: dict[str, Any],
) -> list[Path]:
    """Writes each (lowered, compiled) program of `programs` (keyed by (kind, input shapes),
    `parallel.Strategy`'s keys) and the manifest into `directory`. Returns the files written."""
    entries, written = [], []
    for (kind, key), (lowered, compiled) in programs.items():
        blob, _, _ = serialize_executable.serialize(compiled)
        path = directory / _name(kind, key)
        files.write_bytes(path, blob)
        written.append(path)
        entries.append(
            {
                "kind": kind,
                "inputs": [[k, list(s), d] for k, s, d in key],
                "file": path.name,
                "hash": program_hash(lowered),
                "describe": describe(kind, key),
            }
        )
    manifest = {
        "format": FORMAT,
        "environment": environment(devices),
        "config": config,
        "programs": entries,
    }
    files.write_text(directory / MANIFEST, json.dumps(manifest, indent=2))
    for old in directory.glob("*.bin"):  # an earlier save's programs: never loaded again
        if old not in written:
            old.unlink()
    return [*written, directory / MANIFEST]


class SavedPrograms:
    """The programs of `--programs DIR`, checked against this run before any is loaded."""

    def __init__(self, directory: str | Path, devices: list[Any], config: Config) -> None:
        """`directory`: a path, or a bucket URL (read from a local copy)."""
        self.directory = Path(storage.local_input(directory, "--programs"))
        self.devices = devices
        self.config = config
        path = self.directory / MANIFEST
        try:
            manifest = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(
                f"--programs {directory}: no {MANIFEST}; make it with python -m "
                "jaxtpu.preflight --save-programs DIR and this run's flags"
            ) from None
        except (OSError, ValueError) as e:
            raise ConfigError(f"--programs {directory}: cannot read {MANIFEST} ({e})") from None
        if manifest.get("format") != FORMAT:
            raise ConfigError(
                f"--programs {directory}: format {manifest.get('format')!r}, this jaxtpu "
                f"reads {FORMAT}; save them again with this version"
            )
        differs = _diff(manifest["environment"], environment(devices))
        if differs:
            raise ConfigError(
                f"--programs {directory}: compiled for another environment ("
                + "; ".join(differs)
                + "); save them again on this jax/libtpu and XLA flags for these devices"
            )
        self.saved_config = manifest.get("config", {})
        self.entries = {
            (e["kind"], tuple((k, tuple(s), d) for k, s, d in e["inputs"])): e
            for e in manifest["programs"]
        }

    def config_differs(self) -> list[str]:
        """The flags (besides where the run writes) that differ from the saved run's."""
        return [
            f"--{name.replace('_', '-')} {now!r} (saved: {then!r})"
            for name, then, now in changed_flags(self.saved_config, self.config)
            if name not in OUTSIDE_PROGRAMS
        ]

    def load(self, kind: str, key: Any, lowered: Any) -> Any:
        """The saved program for `lowered` (this run's `kind` program with inputs `key`), or
        None when none was saved for those inputs and the flags are the saved ones (the
        caller compiles it). Raises ConfigError when the saved program is another program."""
        entry = self.entries.get((kind, key))
        what = describe(kind, key)
        if entry is None or entry["hash"] != program_hash(lowered):
            differs = self.config_differs()
            if entry is None and not differs:
                return None
            reason = (
                "flags differ: " + "; ".join(differs[:6]) + ("; ..." if len(differs) > 6 else "")
                if differs
                else "the flags agree, so the data differ (e.g. another number of training "
                "examples changes the schedule's length)"
            )
            state = "was not saved" if entry is None else "was compiled for another program"
            raise ConfigError(
                f"--programs {self.directory}: the {what} {state} ({reason}); save them again "
                "with python -m jaxtpu.preflight --save-programs and this run's flags"
            )
        path = self.directory / entry["file"]
        try:
            blob = path.read_bytes()
        except OSError as e:
            raise ConfigError(
                f"--programs {self.directory}: cannot read {path.name} ({e})"
            ) from None
        try:
            compiled = serialize_executable.deserialize_and_load(
                blob,
                lowered.in_tree,
                lowered.out_tree,
                backend=self.devices[0].client,
                execution_devices=self.devices,
            )
        except Exception as e:  # a damaged file, or one these devices cannot run
            first = (str(e).splitlines() or [type(e).__name__])[0][:200]
            raise ConfigError(
                f"--programs {self.directory}: cannot load {path.name} on these devices "
                f"({first}); save them again"
            ) from None
        log.info("loaded the %s from %s (not compiled)", what, path)
        return compiled
