"""Host memory: glibc's malloc on transparent huge pages for the command-line processes
(framework-free).

XLA:CPU takes each device call's temporary buffers from malloc, which maps large blocks fresh
with mmap and unmaps them when freed: every 4 KiB page of those buffers faults on first touch,
in every call (a MiniLM step of plain PyTorch on the CPU pays the same kind of cost). glibc
2.35 and later can ask the kernel for transparent huge pages for its mappings (the tunable
`glibc.malloc.hugetlb=1`, which uses madvise): 2 MiB pages, so 512 times fewer faults. The
faults per step and the step time with and without are measured by `python -m
benchmarks.training.worker` (its `page_faults_per_step`; docs/benchmarks.md).

Tunables are read when a process starts, so a command that wants them re-executes itself once
with `GLIBC_TUNABLES` extended (`reexec_with_huge_pages`), before anything else runs. Nothing
happens when the user set the tunable already (either value), set `JAXTPU_HUGEPAGES=0`, or the
machine has no glibc >= 2.35 or no transparent huge pages.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

TUNABLES = "GLIBC_TUNABLES"
HUGE_PAGES = "glibc.malloc.hugetlb=1"
OPT_OUT = "JAXTPU_HUGEPAGES"  # 0 keeps malloc as the system has it
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def glibc_version() -> tuple[int, int] | None:
    """(major, minor) of the C library when it is glibc, else None."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        major, minor = version.split(".")[:2]
        return (int(major), int(minor)) if name == "glibc" else None
    except (AttributeError, ValueError, OSError):
        return None


def thp_mode() -> str | None:
    """The kernel's transparent huge page mode ('always', 'madvise', 'never'), or None."""
    try:
        text = THP_MODE.read_text()
    except OSError:
        return None
    chosen = [w for w in text.split() if w.startswith("[")]
    return chosen[0].strip("[]") if chosen else None


def wanted(environ: Mapping[str, str], glibc: tuple[int, int] | None, thp: str | None) -> bool:
    """Whether a process with `environ` on this C library and kernel should restart with huge
    pages for malloc."""
    if environ.get(OPT_OUT, "1") == "0":
        return False
    if "glibc.malloc.hugetlb" in environ.get(TUNABLES, ""):
        return False  # the user chose, or this process is the restarted one
    return glibc is not None and glibc >= (2, 35) and thp in ("always", "madvise")


def with_huge_pages(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with the tunable added to whatever `GLIBC_TUNABLES` holds."""
    current = environ.get(TUNABLES, "")
    return {**environ, TUNABLES: f"{current}:{HUGE_PAGES}" if current else HUGE_PAGES}


def active() -> bool:
    """Whether this process runs with huge pages for malloc."""
    return HUGE_PAGES in os.environ.get(TUNABLES, "").split(":")


def reexec_with_huge_pages() -> None:
    """Restarts this command (`python -m ...` with the same arguments and the same process
    id) with huge pages for malloc, when `wanted`. Call it first thing under
    `if __name__ == "__main__"`, before threads or devices exist."""
    if not wanted(os.environ, glibc_version(), thp_mode()):
        return
    argv = [sys.executable, *sys.orig_argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, argv, with_huge_pages(os.environ))
    except OSError:
        pass  # go on as started: only slower
