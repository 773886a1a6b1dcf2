"""`jaxtpu serve` (`python -m jaxtpu.serve`): answers Perspective API's `comments:analyze` with
the best model of a run (or an export), on uvicorn. Loads the model, binds the address, then
compiles its programs while `/healthz` already answers; `/readyz` says when it can score.
SIGTERM or Ctrl-C stops taking connections, finishes the requests in flight and exits.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from jaxtpu.core.errors import ConfigError, UserError
from jaxtpu.core.flags.commands import check_command_flags, command_parser
from jaxtpu.core.flags.schema import SCORING
from jaxtpu.core.run.exits import user_errors
from jaxtpu.serve.backends import load_served

log = logging.getLogger("jaxtpu.serve")


def main(argv: Sequence[str] | None = None) -> int:
    p = command_parser(
        "serve",
        "Serve a jaxtpu model as Perspective API: POST /v1alpha1/comments:analyze takes "
        "Perspective's requests and answers its responses; GET /$discovery/rest?version="
        "v1alpha1 is the discovery document Google's API client reads; GET /v1/model the "
        "model's card and version; /healthz, /readyz, /metrics; GET / a page for people.",
        epilog="Example: jaxtpu serve --workdir runs/a   (then: curl -s "
        '\'http://127.0.0.1:8080/v1alpha1/comments:analyze\' -d \'{"comment": {"text": '
        '"you are an idiot"}, "requestedAttributes": {"TOXICITY": {}}}\')',
    )
    args = p.parse_args(argv)
    with user_errors():
        return serve(args)


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


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: a free one), or one line saying why not."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise UserError(
            f"--host {host} --port {port}: cannot listen there ({e.strerror or e})"
        ) from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def serve(args: argparse.Namespace) -> int:
    """`main` once the flags are parsed."""
    check_command_flags("serve", args)
    sources = (
        [("workdir", w) for w in args.workdir] if args.workdir else [("model_dir", args.model_dir)]
    )
    given = list(args.attributes or [])
    if given and len(given) != len(sources):
        raise ConfigError(
            f"--attributes gives {len(given)} value(s) for {len(sources)} model(s): one per "
            "model, in order ('' keeps a model's default)"
        )
    keys = read_api_keys(args.api_keys) if args.api_keys else None
    if keys is None and not _is_loopback(args.host):
        print(
            f"warning: --host {args.host} without --api-keys: anyone who reaches this address "
            "can score comments",
            file=sys.stderr,
        )
    sock = _bind(args.host, args.port)  # before the model loads: a taken port is said at once

    import uvicorn

    from jaxtpu.serve.app import Options, Server, build_app

    models = []
    for i, (kind, source) in enumerate(sources):
        print(f"loading --{kind.replace('_', '-')} {source} ...", flush=True)
        served = load_served(
            source,
            kind,
            given[i] if given else "",
            args.languages,
            args.num_devices,
            args.batch_size,
            args.max_len or SCORING.max_len,
            not args.no_calibration,
        )
        names = ", ".join(a.name for a in served.attributes)
        print(f"  {served.model.task.name} model, version {served.version}: {names}", flush=True)
        cal = served.model.scorer.calibration
        print(f"  calibration: {cal.describe() if cal else _uncalibrated(args)}", flush=True)
        models.append(served)
    options = Options(
        api_keys=keys,
        max_body=args.max_body_kb * 1024,
        read_timeout=args.read_timeout,
        log_comments=args.log_comments,
        max_items=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
    )
    server = Server(models, options)
    app = build_app(server)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(
        f"serving http://{shown}:{port}/v1alpha1/comments:analyze (model version "
        f"{server.version}; compiling, /readyz says when it is ready)",
        flush=True,
    )
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, timeout_graceful_shutdown=30, lifespan="on"
    )
    stopped_by: list[int] = []
    # uvicorn finishes the requests in flight on SIGTERM, then raises the signal again for the
    # handler it found: this one, so the process ends as a finished server (exit 0), not as
    # one killed by the signal
    signal.signal(signal.SIGTERM, lambda signum, frame: stopped_by.append(signum))
    uvicorn.Server(config).run(sockets=[sock])
    print("stopped" + (" on SIGTERM" if stopped_by else ""), flush=True)
    return 0


def _uncalibrated(args: argparse.Namespace) -> str:
    if args.no_calibration:
        return "off (--no-calibration): scores are the model's sigmoid outputs"
    return "none recorded (a run of an older jaxtpu, or an export without one): uncalibrated"
