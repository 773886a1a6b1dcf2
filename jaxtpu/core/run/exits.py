"""How a command's process ends (framework-free): logging set up, bad input reported as one
line with exit code 2, a NaN loss 1, Ctrl-C 130 with the command that continues the run, and
other exceptions left as the bugs they are, with their tracebacks. Every command's `main`
runs inside `user_errors()`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

from jaxtpu.core.errors import TrainingError, UserError
from jaxtpu.core.files import disk_full, disk_full_message


def setup_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    for noisy in ("absl", "orbax", "jax._src", "httpx", "onnx_ir", "onnxscript", "fsspec"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # gcsfs logs each request that ran out of retries as an ERROR with its traceback; the
    # failure reaches jaxtpu as an exception, and its one line says what failed
    logging.getLogger("gcsfs").setLevel(logging.CRITICAL)


def exit_code(summary: dict[str, Any] | None, module: str) -> int:
    """0 for a finished (or SIGTERM-checkpointed) run; 130 after Ctrl-C, with the command that
    continues the run (`python -m <module>` and the same flags) on stderr."""
    if not summary or summary.get("stopped_by") != "SIGINT":
        return 0
    flags = sys.argv[1:]
    if not any(f == "--workdir" or f.startswith("--workdir=") for f in flags):
        flags += ["--workdir", str(summary["workdir"])]
    if "--resume" not in flags:
        flags.append("--resume")
    print(
        f"interrupted at step {summary['steps']}; the latest state is saved in "
        f"{summary['workdir']}. Continue with: python -m {module} {' '.join(flags)}",
        file=sys.stderr,
    )
    return 130


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Reports bad input as one line on stderr and exits 2; a NaN loss exits 1. Other
    exceptions are bugs and keep their traceback."""
    setup_logging()
    try:
        yield
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        _exit(e, 2)
    except TrainingError as e:
        print(f"error: {e}", file=sys.stderr)
        _exit(e, 1)
    except OSError as e:
        if disk_full(e) is None:
            raise
        print(f"error: {disk_full_message(e.filename or '.', 'a file')}", file=sys.stderr)
        _exit(e, 2)
    except KeyboardInterrupt as e:
        print(
            "interrupted; finished checkpoints are kept (continue with --resume)", file=sys.stderr
        )
        _exit(e, 130)


def _exit(error: BaseException, code: int) -> None:
    """Exits with `code` after freeing what the failed run's frames held, while every module
    is still alive: left to the interpreter's shutdown, the garbage of a torch run stopped
    mid-step (its tensors, the autograd graph) segfaults Python 3.12 as torch's modules go
    (exit 139 after the one-line error, seen on a full disk)."""
    import gc

    error.__traceback__ = None
    gc.collect()
    sys.exit(code)
