"""`jaxtpu serve` (`python -m jaxtpu.serve`): answers Perspective API's `comments:analyze` with
the best model of a run (or an export), on uvicorn. Loads the model, binds the address, then
compiles its programs while `/healthz` already answers; `/readyz` says when it can score.
SIGTERM drains (`/readyz` 503, requests answered for --drain-seconds), then stops taking
connections, finishes the requests in flight and exits 0; a second SIGTERM or Ctrl-C skips
the drain.
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
from jaxtpu.core.run.exits import user_errors
from jaxtpu.serve.onnxmodel import pick_graph
from jaxtpu.serve.processes import (
    build,
    open_feedback,
    read_api_keys,
    serve_workers,
    sources,
    uvicorn_config,
)

log = logging.getLogger("jaxtpu.serve")


def main(argv: Sequence[str] | None = None) -> int:
    p = command_parser(
        "serve",
        "Serve a jaxtpu model as Perspective API: POST /v1alpha1/comments:analyze takes "
        "Perspective's requests and answers its responses; POST /v1alpha1/comments:suggestscore "
        "takes a client's corrections (kept with --feedback); POST /batch answers Google's "
        "batch requests; GET /$discovery/rest?version=v1alpha1 is the discovery document "
        "Google's API client reads; GET /v1/model the model's card and version; /healthz, "
        "/readyz, /metrics; GET / a page for people.",
        epilog="Example: jaxtpu serve --workdir runs/a   (then: curl -s "
        '\'http://127.0.0.1:8080/v1alpha1/comments:analyze\' -d \'{"comment": {"text": '
        '"you are an idiot"}, "requestedAttributes": {"TOXICITY": {}}}\')',
    )
    args = p.parse_args(argv)
    with user_errors():
        return serve(args)


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (port 0: a free one), or one line saying why not. It is
    bound before the model loads, so a taken port is said at once, and listens only once the
    server can answer (uvicorn's `listen` when it starts serving): until then a connection is
    refused at once instead of hanging, so a liveness probe fails fast."""
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
    named = sources(args)
    given = list(args.attributes or [])
    if given and len(given) != len(named):
        raise ConfigError(
            f"--attributes gives {len(given)} value(s) for {len(named)} model(s): one per "
            "model, in order ('' keeps a model's default)"
        )
    if args.threads and not args.onnx:
        raise ConfigError("--threads sets onnxruntime's threads: it goes with --onnx")
    if args.onnx and args.max_len:
        raise ConfigError(
            "--max-len: an ONNX export is scored at its run's --max-len (its jaxtpu_onnx.json)"
        )
    keys = read_api_keys(args.api_keys) if args.api_keys else None  # said before a worker starts
    if keys is None and not _is_loopback(args.host):
        print(
            f"warning: --host {args.host} without --api-keys: anyone who reaches this address "
            "can score comments",
            file=sys.stderr,
        )
    if args.workers > 1:  # each worker opens it; a bad --feedback is said once, here
        store = open_feedback(args)
        if store is not None:
            store.close()
    sock = _bind(args.host, args.port)  # before the model loads: a taken port is said at once

    from jaxtpu.serve.lifecycle import DrainingServer

    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/v1alpha1/comments:analyze"
    stopped_by: list[int] = []
    if args.workers == 1:
        app, version = build(args)
        print(
            f"serving {url} (model version {version}; compiling, /readyz says when it is ready)",
            flush=True,
        )
        # uvicorn finishes the requests in flight on SIGTERM, then raises the signal again for
        # the handler it found: this one, so the process ends as a finished server (exit 0),
        # not as one killed by the signal
        signal.signal(signal.SIGTERM, lambda signum, frame: stopped_by.append(signum))
        DrainingServer(uvicorn_config(app), args.drain_seconds).run(sockets=[sock])
        print("stopped" + (" on SIGTERM" if stopped_by else ""), flush=True)
        return 0
    if args.onnx and Path(args.onnx).is_dir():  # one graph for every worker, timed once
        model, args.graph = pick_graph(args.onnx, args.batch_size, threads=args.threads)
        args.onnx = str(model.trained.onnx_file)
        if args.graph:
            t = args.graph["seconds"]
            print(f"graph: {args.graph['chosen']} (fp32 {t['fp32']:.3f} s, int8 {t['int8']:.3f} s "
                  f"on {args.graph['comments']} real comments here; {args.graph['rule']})",
                  flush=True)  # fmt: skip
    return serve_workers(args, sock, url)
