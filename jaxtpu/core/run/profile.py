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

    def __init__(
        self, spec: str, workdir: Path, backend: Any, start: int = 0, total: int | None = None
    ) -> None:
        """`start`: the step the run continues from; `total`: its last step. A range that
        holds none of the steps the run will take is said at once (nothing would be traced)."""
        # process 0 only: it alone writes the run directory
        self.range = profile_range(spec) if backend.primary else None
        self.directory = workdir / "profile"
        self.backend, self.active, self.last = backend, False, start
        if (
            self.range
            and total is not None
            and not (start < self.range[1] and self.range[0] <= total)
        ):
            log.warning(
                "--profile-steps %s: this run takes steps %d to %d, none of them in the range; "
                "nothing will be profiled",
                spec,
                start + 1,
                total,
            )
            self.range = None

    def before(self, call: Call) -> None:
        if self.range is None or self.active:
            return
        first = call.end - len(call.batches) + 1
        if first <= self.range[1] and call.end >= self.range[0]:
            self.backend.profile_start(self.directory)
            self.active = True

    def after(self, call: Call, pending: list) -> None:
        """Stops after the call that reaches B, once its steps are done."""
        self.last = call.end
        if self.active and self.range and call.end >= self.range[1]:
            self.backend.fetch(pending)  # the trace holds the steps, not only their dispatch
            self._stop(self.range[1])

    def _stop(self, last: int) -> None:
        self.backend.profile_stop()
        self.active = False
        log.info(
            "profile of steps %d-%d written to %s (TensorBoard's profile tab, Perfetto)",
            self.range[0],
            last,
            self.directory,
        )

    def __enter__(self) -> Profile:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.active:  # the run ended (or stopped) inside the range: keep what was traced
            self._stop(self.last)
