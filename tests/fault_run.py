"""Test helper: `python tests/fault_run.py FAULT [jaxtpu.train flags]` runs `jaxtpu.train` and
SIGKILLs itself at one chosen moment, to prove that resume survives a kill anywhere.

FAULT is `call:N` (as the N-th training call starts), `eval:N` (inside the N-th evaluation
batch), `save:N` (inside the N-th checkpoint write: orbax has written the temporary
directory and is about to rename it into place), `commit:N` (inside the N-th write of the
latest state to a bucket: its objects written, its step's commit marker not yet) or
`committed:N` (the moment the N-th write of the latest state to a bucket has its commit
marker, before the run does anything else).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxtpu import train  # noqa: E402
from jaxtpu.engine import backend


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(kind: str, n: float) -> None:
    count = [0]

    def tick() -> None:
        count[0] += 1
        if count[0] == n:
            die()

    if kind == "slow":
        import time

        steps = backend.JaxBackend.train_steps

        def waiting(self, *args, **kwargs):
            time.sleep(n)
            return steps(self, *args, **kwargs)

        backend.JaxBackend.train_steps = waiting
        return
    if kind in ("commit", "committed"):
        from orbax.checkpoint._src.path import atomicity

        finalize = atomicity.CommitFileTemporaryPath.finalize

        async def finalizing(self, *args, **kwargs):
            path = str(self.get()).rstrip("/")
            latest = "/latest/" in path and path.rsplit("/", 1)[-1].isdigit()  # a latest step's
            if latest and kind == "commit":
                tick()
            done = await finalize(self, *args, **kwargs)
            if latest and kind == "committed":
                tick()
            return done

        atomicity.CommitFileTemporaryPath.finalize = finalizing
        return
    if kind == "save":
        rename = os.rename

        def renaming(src, dst, *args, **kwargs):
            if "orbax-checkpoint-tmp" in str(src):
                tick()
            return rename(src, dst, *args, **kwargs)

        os.rename = renaming
        return
    method = {"call": "train_steps", "eval": "eval_batch"}[kind]
    original = getattr(backend.JaxBackend, method)

    def hooked(self, *args, **kwargs):
        tick()
        return original(self, *args, **kwargs)

    setattr(backend.JaxBackend, method, hooked)


if __name__ == "__main__":
    kind, n = sys.argv[1].split(":")
    arm(kind, float(n))
    sys.argv = ["jaxtpu.train", *sys.argv[2:]]
    sys.exit(train.main())
