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
from jaxtpu.core.serving.feedback import Store, StoreError
from jaxtpu.core.serving.keys import KeyRing
from jaxtpu.serve.backends import load_served
from jaxtpu.serve.lifecycle import HUNG_AFTER, supervise
from jaxtpu.serve.onnxmodel import META

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
    failed = supervise(config, sock, args.drain_seconds)
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
    say = (lambda *a, **k: None) if quiet else print
    heads = getattr(args, "communities", None)
    shadow_heads = getattr(args, "shadow_communities", None)
    models = [
        _load(args, kind, source, given[i] if given else "", say, bool(heads or shadow_heads))
        for i, (kind, source) in enumerate(sources(args))
    ]
    communities = {}
    for item in getattr(args, "community", None) or []:
        community, eq, run = item.partition("=")
        if not eq or not community.strip() or not run.strip():
            raise ConfigError(
                f"--community {item!r}: expected ID=RUN, e.g. Coral:https://news.example/=runs/news"
            )
        say(f"community {community}:", flush=True)
        communities[community.strip()] = [_load(args, _kind_of(run), run.strip(), "", say)]
    shadow = None
    if getattr(args, "shadow", None):
        say("in shadow (scored after each answer, never answering):", flush=True)
        shadow = [_load(args, _kind_of(args.shadow), args.shadow, "", say)]
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
    server = Server(models, options, communities, shadow, heads, shadow_heads)
    return build_app(server), server.version


def _kind_of(path: str) -> str:
    """A community's or the shadow's model: an ONNX export (its jaxtpu_onnx.json), else a run."""
    where = Path(path.strip())
    return "onnx" if (where / META).is_file() or where.suffix == ".onnx" else "workdir"


def _load(
    args: argparse.Namespace,
    kind: str,
    source: str,
    attributes: str,
    say: Any,
    pooled: bool = False,
) -> Any:
    """One model of the flags, loaded (`load_served`; `pooled`: giving each comment's vector
    too, for the communities' heads), and what it is, said."""
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    say(f"loading --{kind.replace('_', '-')} {source} ...", flush=True)
    served = load_served(
        source,
        kind,
        attributes,
        args.languages,
        args.num_devices,
        args.batch_size,
        args.max_len or SCORING.max_len,
        not args.no_calibration,
        threads if kind == "onnx" else 0,
        getattr(args, "graph", None) if source == args.onnx else None,
        pooled,
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
    return served


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
