"""`--profile-steps A:B` (framework-free): the backend's profiler traces the device calls that
hold steps A to B into RUN/profile/."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from jaxtpu.core.flags.schema import profile_range
from jaxtpu.core.run.plan import Call

log = logging.getLogger("jaxtpu")


class Profile:
    """`--profile-steps A:B`: the backend's profiler traces the device calls that hold steps A
    to B (whole calls: with --steps-per-call K, a little more), into RUN/profile/."""

    def __init__(self, spec: str, workdir: Path, backend: Any) -> None:
        # process 0 only: it alone writes the run directory
        self.range = profile_range(spec) if backend.primary else None
        self.directory = workdir / "profile"
        self.backend, self.active = backend, False

    def before(self, call: Call) -> None:
        if self.range is None or self.active:
            return
        first = call.end - len(call.batches) + 1
        if first <= self.range[1] and call.end >= self.range[0]:
            self.backend.profile_start(self.directory)
            self.active = True

    def after(self, call: Call, pending: list) -> None:
        """Stops after the call that reaches B, once its steps are done."""
        if self.active and self.range and call.end >= self.range[1]:
            self.backend.fetch(pending)  # the trace holds the steps, not only their dispatch
            self.backend.profile_stop()
            self.active = False
            log.info(
                "profile of steps %d-%d written to %s (TensorBoard's profile tab, Perfetto)",
                *self.range,
                self.directory,
            )

    def __enter__(self) -> Profile:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.active:  # the run ended (or stopped) inside the range: keep what was traced
            self.backend.profile_stop()
            self.active = False
