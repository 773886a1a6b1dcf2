"""How a `jaxtpu serve` process stops, and how `--workers`' supervisor keeps its workers:

- `DrainingServer`: uvicorn's server that, on SIGTERM, first drains: `/readyz` answers 503 at
  once (a load balancer or Kubernetes stops routing to it), requests are still answered for
  `--drain-seconds` (those the balancer sends before it notices), then it stops taking
  connections, finishes the requests in flight and exits 0. A second SIGTERM, or SIGINT,
  stops it at once after the requests in flight. (Kubernetes sends SIGTERM and removes the pod
  from its endpoints at the same time: without the drain, requests routed meanwhile would be
  refused.)
- `supervise`: uvicorn's process supervisor, but a dead worker is replaced within a tick, its
  workers drain as above, and a stop ends every worker in bounded time.
"""

from __future__ import annotations

import pickle
import signal
import socket
import sys
import time
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess
from uvicorn.supervisors.multiprocess import Process

# A worker that answers no health ping for this long is hung and replaced (a worker compiling
# its programs answers slowly); one that has died is replaced at once, whatever this is.
HUNG_AFTER = 60.0
# How often the supervisor looks at its workers and its signals.
TICK = 0.25


def state_of(app: Any, name: str) -> Any:
    """`app.state.NAME` of the application under uvicorn's wrappers (each keeps the next as
    `app`), None when none has it."""
    while app is not None:
        found = getattr(getattr(app, "state", None), name, None)
        if found is not None:
            return found
        app = getattr(app, "app", None)
    return None


class DrainingServer(uvicorn.Server):
    """uvicorn's server that drains for `drain_seconds` on its first SIGTERM (module doc)."""

    def __init__(self, config: uvicorn.Config, drain_seconds: float = 0.0) -> None:
        super().__init__(config)
        self.drain_seconds = drain_seconds
        self.drain_until: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = self.drain_until is None and not self.should_exit
        if first and sig == signal.SIGTERM and self.drain_seconds > 0:
            self._captured_signals.append(sig)
            self.drain_until = time.monotonic() + self.drain_seconds
            served = state_of(self.config.loaded_app, "server")
            if served is not None:
                served.draining = True
            print(
                f"draining: /readyz answers 503; requests are answered for "
                f"{self.drain_seconds:g} s more, then those in flight finish (another SIGTERM "
                "or Ctrl-C: at once)",
                file=sys.stderr,
                flush=True,
            )
            return
        self.drain_until = None
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_until is not None and time.monotonic() >= self.drain_until:
            self.should_exit = True
        return await super().on_tick(counter)


class WorkerProcess(Process):
    """A `--workers` process whose server drains (`config.drain_seconds`, set by
    `supervise`)."""

    @property
    def server(self) -> uvicorn.Server:
        if self._server is None:
            drain = float(getattr(self.config, "drain_seconds", 0.0))
            self._server = DrainingServer(self.config, drain)
        return self._server


class Supervisor(Multiprocess):
    """uvicorn's supervisor, its health ping polled in ticks (`supervise`)."""

    def init_processes(self) -> None:
        for _ in range(self.processes_num):
            process = WorkerProcess(self.config, self.sockets)
            process.start()
            self.processes.append(process)

    def keep_subprocess_alive(self) -> None:
        for idx, process in enumerate(self.processes):
            if self.should_exit.is_set() or self._answers(process):
                continue
            process.kill()  # hung, or dead already
            process.join()
            if process.exitcode == STARTUP_FAILURE:
                # it failed before serving: the app is broken, and a new one would be too
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            print(f"worker {process.pid} died; starting another", file=sys.stderr, flush=True)
            self.processes[idx] = WorkerProcess(self.config, self.sockets)
            self.processes[idx].start()

    def _answers(self, process: Any) -> bool:
        """Whether the worker answers a health ping: False at once when it is dead or dies
        while asked, after HUNG_AFTER when it is alive and silent; signals are handled while
        waiting."""
        if not process.process.is_alive():
            return False
        try:
            process.parent_conn.send(b"ping")
            deadline = time.monotonic() + self.config.timeout_worker_healthcheck
            while not process.parent_conn.poll(TICK):
                self.handle_signals()
                if self.should_exit.is_set():
                    return True  # stopping: the stop ends it
                if not process.process.is_alive() or time.monotonic() > deadline:
                    return False
            process.parent_conn.recv()
            return True
        except (OSError, EOFError, pickle.UnpicklingError):  # its end of the pipe is gone
            return False

    def run(self) -> None:
        self.init_processes()
        while not self.should_exit.wait(TICK):
            self.handle_signals()
            self.keep_subprocess_alive()
        self.terminate_all()  # SIGTERM: each worker drains, then finishes its requests
        grace = getattr(self.config, "drain_seconds", 0.0) + (
            self.config.timeout_graceful_shutdown or 30
        )
        deadline = time.monotonic() + grace + 5
        again = False
        while time.monotonic() < deadline and any(p.process.is_alive() for p in self.processes):
            if self.signal_queue and not again:  # a second signal: stop now, not drain
                self.signal_queue.clear()
                again = True
                for p in self.processes:
                    if p.process.is_alive() and p.pid:
                        _signal(p.pid)
            time.sleep(TICK)
        for process in self.processes:
            if process.process.is_alive():  # still compiling, or stuck: ended
                process.kill()
                process.join()


def _signal(pid: int) -> None:
    import os

    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def supervise(config: Any, sock: socket.socket, drain_seconds: float = 0.0) -> bool:
    """Runs `config.workers` worker processes on `sock` until SIGTERM or SIGINT: uvicorn's
    supervisor, but a dead worker is replaced within a tick (uvicorn waited out its whole
    health-ping timeout when a worker died mid-ping, 60 s here, and handled no signal
    meanwhile), each worker drains for `drain_seconds` on the stop, and a stop ends every
    worker: one still running after the drain and uvicorn's graceful shutdown is killed.
    Returns whether a worker could not start."""
    config.drain_seconds = drain_seconds  # pickled with the config into each worker
    supervisor = Supervisor(config, sockets=[sock])
    supervisor.run()
    return any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes)
