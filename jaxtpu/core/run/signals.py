"""Stopping on request (framework-free): SIGTERM (what a TPU VM gets before preemption) or
Ctrl-C sets a flag the loop reads after each device call, agreed on by every process.

With several JAX processes (`jax.distributed`), SIGTERM is left to JAX's own preemption
notifier: when any host gets it, `jax.experimental.multihost_utils.reached_preemption_sync_point`
turns true on every host at the same device call (the backend's `preemption_point`), so all of
them save the same step within a call of the notice, with no collective of ours per call.
Ctrl-C, and SIGTERM when JAX's preemption service is off, are agreed at logging calls
(`Backend.any_process`)."""

from __future__ import annotations

import logging
import signal
from typing import Any

from jaxtpu.core.run.plan import Call
from jaxtpu.core.run.protocol import Backend

log = logging.getLogger("jaxtpu")


class StopFlag:
    """Set by SIGTERM (what a TPU VM gets before preemption) or a first Ctrl-C (SIGINT): the
    loop saves the latest state at the end of the current call and stops. A second Ctrl-C
    stops at once (KeyboardInterrupt; finished checkpoints are kept)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(
        self,
        signals: tuple[int, ...] = SIGNALS,
        pending: StopFlag | None = None,
        preemption_service: bool = False,
    ) -> None:
        """`signals`: the ones it handles; `pending`: an earlier flag whose signal, if one
        came, this one starts with (`early`), and whose `preemption_service` it keeps;
        `preemption_service`: JAX's preemption notifier has SIGTERM (multi-process runs)."""
        self.preemption_service = preemption_service or bool(
            pending is not None and pending.preemption_service
        )
        if self.preemption_service:
            signals = tuple(s for s in signals if s != signal.SIGTERM)
        self.signals = signals
        self.signal: int | None = pending.signal if pending is not None else None
        self.calls = 0  # device calls asked about: the preemption sync point's step ids
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopFlag:
        try:
            self._old = {s: signal.signal(s, self._handle) for s in self.signals}
        except ValueError:  # not the main thread
            self._old = {}
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.signal is not None:
            raise KeyboardInterrupt  # the second Ctrl-C
        self.signal = signum
        if signum == signal.SIGINT:
            log.warning(
                "Ctrl-C: saving the latest state after this step (Ctrl-C again to quit now)"
            )

    @property
    def name(self) -> str | None:
        return None if self.signal is None else signal.Signals(self.signal).name

    def requested(self, backend: Backend, call: Call) -> bool:
        """Whether to stop after this call; with several processes all agree: at the
        preemption sync point for SIGTERM (JAX's service), at log calls otherwise."""
        if backend.num_processes == 1:
            return self.signal is not None
        self.calls += 1
        if self.preemption_service and backend.preemption_point(self.calls):
            self.signal = self.signal or signal.SIGTERM
            return True
        return call.log and backend.any_process(self.signal is not None)

    def __exit__(self, *exc: Any) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)


def early(preemption_service: bool = False) -> StopFlag:
    """SIGTERM from the moment a run starts (its data, model and programs are made before the
    loop's own flag): recorded, so that the run stops before its first step with the
    documented message and exit, instead of dying at once with the default handler (which
    XLA's own replaces with `RAW: Raising signal 15 with default behavior`, exit -15).
    Ctrl-C is left as it is there: nothing is saved before the first step, so it stops at
    once. `preemption_service`: JAX's notifier has SIGTERM (the loop asks it; nothing is
    installed here)."""
    return StopFlag(signals=(signal.SIGTERM,), preemption_service=preemption_service)
