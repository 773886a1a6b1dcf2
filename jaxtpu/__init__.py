"""jaxtpu: a JAX/Flax trainer for the Jigsaw toxicity models, data-parallel on TPU.

Importing the package only quiets libtpu on machines without a TPU (see `_quiet_libtpu`) and,
for a command started as `python -m jaxtpu.X` that runs JAX programs, restarts it with malloc on
huge pages before it imports anything (see `_restart_command_early`).
"""

from __future__ import annotations

import os
import sys

from jaxtpu.core import hostmem
from jaxtpu.core.hardware import has_tpu


def _quiet_libtpu() -> None:
    """With libtpu installed (it compiles for TPU topologies in `jaxtpu.preflight`) but no TPU
    on the host, libtpu's start-up prints pages of worker-discovery errors before JAX falls
    back to the CPU, and a second process compiling for a TPU target fails on libtpu's
    one-process lock (which guards TPU chips this host does not have). Telling it this host
    is a single worker silences the errors, and the lock is lifted; on a TPU VM nothing is
    set, and a value the user set is kept."""
    if has_tpu():
        return
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_HOST_BOUNDS", "1,1,1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


_quiet_libtpu()

# The commands that run JAX programs: `python -m` of these restarts with malloc on huge pages.
HUGE_PAGE_COMMANDS = (
    "jaxtpu.train",
    "jaxtpu.predict",
    "jaxtpu.evaluate",
    "jaxtpu.lrfind",
    "jaxtpu.severity",
)


def _restart_command_early() -> None:
    """`python -m jaxtpu.X` of a `HUGE_PAGE_COMMANDS` module restarts once with malloc on
    transparent huge pages (`core.hostmem`) here, when Python imports the package, before the
    command's own imports: a restart from the command's `__main__` block came after them and
    paid for them twice (about 3 s of every command's start). `jaxtpu X` (the console script,
    `jaxtpu.__main__`) restarts before it imports the command."""
    argv = getattr(sys, "orig_argv", [])
    if "-m" in argv[1:-1] and argv[argv.index("-m") + 1] in HUGE_PAGE_COMMANDS:
        hostmem.reexec_with_huge_pages()


_restart_command_early()


def __getattr__(name: str):
    """`jaxtpu.load` (the Python API, `jaxtpu.api`), imported on first use so that `import
    jaxtpu` stays light."""
    if name == "load":
        from jaxtpu.api import load

        return load
    raise AttributeError(f"module 'jaxtpu' has no attribute {name!r}")
