"""jaxtpu: a JAX/Flax trainer for the Jigsaw toxicity models, data-parallel on TPU.

Importing the package only quiets libtpu on machines without a TPU (see `_quiet_libtpu`).
"""

from __future__ import annotations

import os

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


def __getattr__(name: str):
    """`jaxtpu.load` (the Python API, `jaxtpu.api`), imported on first use so that `import
    jaxtpu` stays light."""
    if name == "load":
        from jaxtpu.api import load

        return load
    raise AttributeError(f"module 'jaxtpu' has no attribute {name!r}")
