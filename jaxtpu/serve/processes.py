"""How `jaxtpu serve`'s processes come up: the models and application of its flags, the
`--workers` supervisor (uvicorn's) and the worker processes it starts, each building its own
application from the flags the supervisor leaves in the environment."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from jaxtpu.core.errors import ConfigError, UserError
from jaxtpu.core.flags.schema import SCORING
from jaxtpu.core.serving.feedback import Store, StoreError
from jaxtpu.core.serving.keys import KeyRing
from jaxtpu.serve.backends import load_served

WORKER_ARGS = "JAXTPU_SERVE_ARGS"  # the flags, as JSON, for --workers' processes


def read_api_keys(path: str) -> KeyRing:
    """The keys of an --api-keys file (`jaxtpu.core.serving.keys`: one a line, `KEY [NAME
    [PER_MINUTE]]`, blank lines and '#' comments skipped)."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(
            f"--api-keys {path}: cannot read it ({getattr(e, 'strerror', None) or e})"
        ) from None
    return KeyRing.parse(text, f"--api-keys {path}")


def sources(args: argparse.Namespace) -> list[tuple[str, str]]:
    if args.workdir:
        return [("workdir", w) for w in args.workdir]
    if args.onnx:
        return [("onnx", args.onnx)]
    return [("model_dir", args.model_dir)]


def uvicorn_config(app: Any, **more: Any) -> Any:
    import uvicorn

    from jaxtpu.serve.protocol import LimitedHttpToolsProtocol

    settings: dict[str, Any] = dict(
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=30,
        lifespan="on",
        http=LimitedHttpToolsProtocol,  # uvicorn's httptools, with limits on the head
        ws="none",
        proxy_headers=False,  # nothing here reads the client's address: trust no header for it
    )
    return uvicorn.Config(app, **{**settings, **more})


def serve_workers(args: argparse.Namespace, sock: socket.socket, url: str) -> int:
    """--workers N: a process supervisor (`supervise`) whose workers each load the models
    themselves (`worker_app`) and accept on the one socket bound here."""
    os.environ[WORKER_ARGS] = json.dumps(vars(args))
    config = uvicorn_config(
        "jaxtpu.serve.processes:worker_app",
        factory=True,
        workers=args.workers,
        timeout_worker_healthcheck=HUNG_AFTER,
    )
    print(
        f"serving {url} from {args.workers} worker processes, each loading the models and "
        "taking connections once its programs are compiled",
        flush=True,
    )
    failed = supervise(config, sock)
    print("stopped" + (": a worker could not start" if failed else ""), flush=True)
    return 2 if failed else 0


# A worker that answers no health ping for this long is hung and replaced (a worker compiling
# its programs answers slowly); one that has died is replaced at once, whatever this is.
HUNG_AFTER = 60.0
# How often the supervisor looks at its workers and its signals.
TICK = 0.25


def supervise(config: Any, sock: socket.socket) -> bool:
    """Runs `config.workers` worker processes on `sock` until SIGTERM or SIGINT: uvicorn's
    supervisor, but a dead worker is replaced within a tick (uvicorn waited out its whole
    health-ping timeout when a worker died mid-ping, 60 s here, and handled no signal
    meanwhile), and a stop ends every worker: each gets SIGTERM, finishes its requests in
    flight (uvicorn's graceful shutdown), and one still running after that is killed.
    Returns whether a worker could not start."""
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    class Supervisor(Multiprocess):
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
                self.processes[idx] = type(process)(self.config, self.sockets)
                self.processes[idx].start()

        def _answers(self, process: Any) -> bool:
            """Whether the worker answers a health ping: False at once when it is dead or
            dies while asked, after HUNG_AFTER when it is alive and silent; signals are
            handled while waiting."""
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
            self.terminate_all()
            grace = time.monotonic() + (self.config.timeout_graceful_shutdown or 30) + 5
            for process in self.processes:
                process.process.join(max(0.0, grace - time.monotonic()))
                if process.process.is_alive():  # still compiling, or stuck: ended
                    process.kill()
                    process.join()

    supervisor = Supervisor(config, sockets=[sock])
    supervisor.run()
    return any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes)


def worker_app() -> Any:
    """The application of one --workers process (uvicorn's factory, called in the worker):
    the models loaded from the flags the supervisor left in the environment. A user error is
    one line and the exit uvicorn's supervisor reads as a worker that cannot start."""
    from uvicorn.config import STARTUP_FAILURE

    args = argparse.Namespace(**json.loads(os.environ[WORKER_ARGS]))
    _end_with_parent()
    try:
        return build(args, quiet=True)[0]
    except (UserError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(STARTUP_FAILURE)


def _end_with_parent() -> None:
    """A worker gets SIGTERM when the supervisor dies, even by SIGKILL (Linux's
    PR_SET_PDEATHSIG), so no worker goes on serving the port without it; elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def build(args: argparse.Namespace, quiet: bool = False) -> tuple[Any, str]:
    """The models of the flags, loaded, and the application answering with them; with the
    server's version. `quiet` (a --workers process): nothing printed, the supervisor having
    said what it serves."""
    from jaxtpu.serve.app import Options, Server, build_app

    keys = read_api_keys(args.api_keys) if args.api_keys else None
    given = list(args.attributes or [])
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    models = []
    say = (lambda *a, **k: None) if quiet else print
    for i, (kind, source) in enumerate(sources(args)):
        say(f"loading --{kind.replace('_', '-')} {source} ...", flush=True)
        served = load_served(
            source,
            kind,
            given[i] if given else "",
            args.languages,
            args.num_devices,
            args.batch_size,
            args.max_len or SCORING.max_len,
            not args.no_calibration,
            threads if kind == "onnx" else 0,
            getattr(args, "graph", None),
        )
        names = ", ".join(a.name for a in served.attributes)
        say(f"  {served.model.task.name} model, version {served.version}: {names}", flush=True)
        cal = served.model.scorer.calibration
        say(f"  calibration: {cal.describe() if cal else _uncalibrated(args)}", flush=True)
        graph = served.card.get("graph")
        if graph:
            t = graph["seconds"]
            say(
                f"  graph: {graph['chosen']} ({graph['comments']} real comments: fp32 "
                f"{t['fp32']:.3f} s, int8 {t['int8']:.3f} s on this CPU; {graph['rule']}; "
                "--onnx DIR/model.onnx or DIR/model_int8.onnx chooses)",
                flush=True,
            )
        models.append(served)
    store = open_feedback(args, say)
    origins = tuple(o.strip() for o in (args.cors_origins or "").split(",") if o.strip())
    options = Options(
        api_keys=keys,
        cors_origins=origins,
        feedback=store,
        feedback_days=args.feedback_days,
        max_body=args.max_body_kb * 1024,
        read_timeout=args.read_timeout,
        max_header_bytes=args.max_header_kb * 1024,
        max_headers=args.max_headers,
        public_url=args.public_url,
        log_comments=args.log_comments,
        max_items=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        warm_first=args.workers > 1,
    )
    server = Server(models, options)
    return build_app(server), server.version


def open_feedback(args: argparse.Namespace, say: Any = print) -> Store | None:
    """The --feedback store, opened (its table made) so a bad URL is said at start; and the
    start-up line saying where suggestions go."""
    if args.feedback_days is not None and not args.feedback:
        raise ConfigError("--feedback-days drops kept suggestions: it goes with --feedback")
    if not args.feedback:
        say(
            "feedback: not kept (no --feedback): comments:suggestscore is answered, and "
            "nothing is stored",
            flush=True,
        )
        return None
    try:
        store = Store(args.feedback)
    except StoreError as e:
        raise UserError(f"--feedback: {e}") from None
    days = f", dropped after {args.feedback_days:g} days" if args.feedback_days else ""
    say(
        f"feedback: comments:suggestscore's suggestions kept in {store.describe()}{days}",
        flush=True,
    )
    return store


def _uncalibrated(args: argparse.Namespace) -> str:
    if args.no_calibration:
        return "off (--no-calibration): scores are the model's sigmoid outputs"
    return "none recorded (a run of an older jaxtpu, or an export without one): uncalibrated"
