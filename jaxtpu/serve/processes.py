"""How `jaxtpu serve`'s processes come up: the models and application of its flags, the
`--workers` supervisor (uvicorn's) and the worker processes it starts, each building its own
application from the flags the supervisor leaves in the environment."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from jaxtpu.core.errors import ConfigError, UserError
from jaxtpu.core.flags.schema import SCORING
from jaxtpu.serve.backends import load_served

WORKER_ARGS = "JAXTPU_SERVE_ARGS"  # the flags, as JSON, for --workers' processes


def read_api_keys(path: str) -> frozenset[str]:
    """The keys of an --api-keys file: one a line, blank lines and '#' comments skipped."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise UserError(f"--api-keys {path}: cannot read it ({e.strerror or e})") from None
    keys = frozenset(x.split("#", 1)[0].strip() for x in lines) - {""}
    if not keys:
        raise UserError(f"--api-keys {path}: no key in it (one key a line)")
    return keys


def sources(args: argparse.Namespace) -> list[tuple[str, str]]:
    if args.workdir:
        return [("workdir", w) for w in args.workdir]
    if args.onnx:
        return [("onnx", args.onnx)]
    return [("model_dir", args.model_dir)]


def uvicorn_config(app: Any, **more: Any) -> Any:
    import uvicorn

    return uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=30,
        lifespan="on",
        **more,
    )


def serve_workers(args: argparse.Namespace, sock: socket.socket, url: str) -> int:
    """--workers N: uvicorn's process supervisor (it restarts a worker that dies and stops
    them all on SIGTERM, each finishing its requests in flight), each worker loading the
    models itself (`worker_app`) and accepting on the one socket bound here."""
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    os.environ[WORKER_ARGS] = json.dumps(vars(args))
    config = uvicorn_config(
        "jaxtpu.serve.processes:worker_app",
        factory=True,
        workers=args.workers,
        timeout_worker_healthcheck=60,  # a worker compiling its programs answers slowly
    )
    print(
        f"serving {url} from {args.workers} worker processes, each loading the models and "
        "taking connections once its programs are compiled",
        flush=True,
    )
    supervisor = Multiprocess(config, sockets=[sock])
    supervisor.run()
    failed = any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes)
    print("stopped" + (": a worker could not start" if failed else ""), flush=True)
    return 2 if failed else 0


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
    for i, (kind, source) in enumerate(sources(args)):
        say = (lambda *a, **k: None) if quiet else print
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
        )
        names = ", ".join(a.name for a in served.attributes)
        say(f"  {served.model.task.name} model, version {served.version}: {names}", flush=True)
        cal = served.model.scorer.calibration
        say(f"  calibration: {cal.describe() if cal else _uncalibrated(args)}", flush=True)
        models.append(served)
    options = Options(
        api_keys=keys,
        max_body=args.max_body_kb * 1024,
        read_timeout=args.read_timeout,
        log_comments=args.log_comments,
        max_items=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        warm_first=args.workers > 1,
    )
    server = Server(models, options)
    return build_app(server), server.version


def _uncalibrated(args: argparse.Namespace) -> str:
    if args.no_calibration:
        return "off (--no-calibration): scores are the model's sigmoid outputs"
    return "none recorded (a run of an older jaxtpu, or an export without one): uncalibrated"
