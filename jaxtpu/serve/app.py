"""The HTTP application of `jaxtpu serve` (Starlette, on uvicorn): Perspective's
`POST /v1alpha1/comments:analyze`, the discovery document Google's client reads, the model's
card (`GET /v1/model`), `/healthz`, `/readyz`, `/metrics` (Prometheus) and a page for people
(`GET /`). Every response carries the model's version in `X-Model-Version`; every error is
Google's JSON shape. No comment text is logged unless `log_comments`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from jaxtpu.core.serving import discovery, perspective
from jaxtpu.core.serving.attributes import Attribute, merge
from jaxtpu.core.serving.card import model_version
from jaxtpu.core.serving.perspective import ApiError
from jaxtpu.core.serving.spans import sentence_spans
from jaxtpu.serve.backends import Served
from jaxtpu.serve.batcher import Batcher, Overloaded
from jaxtpu.serve.page import PAGE

log = logging.getLogger("jaxtpu.serve")


@dataclass(frozen=True)
class Options:
    """How the server answers (the command's flags).

    Attributes:
      api_keys: the keys a request's `?key=` must be one of; None: no key needed.
      max_body: request bodies larger than this (bytes) are refused before they are read.
      read_timeout: seconds a client has to send its whole body.
      log_comments: log each request's comment text (off: never).
      max_items: texts per model call at most (the dynamic batch).
      max_wait_ms: how long a batch waits for more requests.
      max_queue: requests waiting at most; beyond, 429 with Retry-After.
      warm_first: compile before taking connections (--workers: processes sharing a socket
        take connections only once they can score, so none answers 503 beside a ready one).
    """

    api_keys: frozenset[str] | None = None
    max_body: int = 256 * 1024
    read_timeout: float = 10.0
    log_comments: bool = False
    max_items: int = 64
    max_wait_ms: float = 5.0
    max_queue: int = 256
    warm_first: bool = False


class Server:
    """The models served and the state the routes share (batchers, readiness, metrics)."""

    def __init__(self, models: Sequence[Served], options: Options) -> None:
        self.models, self.options = list(models), options
        owner = merge([m.attributes for m in models], [m.source for m in models])
        self.owner = {name: self.models[i] for name, i in owner.items()}
        self.attribute = {a.name: a for m in models for a in m.attributes}
        self.available = list(owner)
        self.languages = sorted({x for m in models for x in m.languages})
        self.version = (
            models[0].version
            if len(models) == 1
            else model_version({f"model{i}": m.version for i, m in enumerate(models)})
        )
        self.batchers = {
            id(m): Batcher(
                m.probabilities,
                options.max_items,
                options.max_wait_ms,
                options.max_queue,
                bucket_of=m.buckets,  # used only where calls have fixed rows
                rows=m.call_rows,
            )
            for m in models
        }
        self.ready = False
        self._warming: asyncio.Task | None = None
        self.metrics = _Metrics(self)

    async def start(self) -> None:
        """Starts the batchers, and compiles each model's programs in the background: the
        server answers /healthz at once, /readyz and the API once they are compiled (with
        `warm_first`, before it takes a connection)."""
        for b in self.batchers.values():
            await b.start()
        self._warming = asyncio.create_task(self._warm_up())
        if self.options.warm_first:
            await self._warming

    async def _warm_up(self) -> None:
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        try:
            for m in self.models:
                n = await loop.run_in_executor(self.batchers[id(m)].pool, m.warm_up)
                log.info("%s: %d length bucket(s) compiled", m.source, n)
        except Exception:  # noqa: BLE001 - reported, and the server stays not ready
            log.exception("compiling the model's programs failed; the server is not ready")
            return
        self.ready = True
        log.info("ready in %.1f s (model version %s)", time.perf_counter() - t0, self.version)

    async def stop(self) -> None:
        self.ready = False
        if self._warming and not self._warming.done():
            self._warming.cancel()
        for b in self.batchers.values():
            await b.stop()

    def card(self) -> dict[str, Any]:
        if len(self.models) == 1:
            return self.models[0].card
        return {"version": self.version, "models": [m.card for m in self.models]}

    async def analyze(self, request: perspective.AnalyzeRequest) -> dict[str, Any]:
        """The scores of a checked request: the comment (and its sentences when spans are
        asked for) through each model that owns a requested attribute."""
        spans = sentence_spans(request.text) if request.spans else []
        texts = [request.text] + [s for _, _, s in spans]
        wanted: dict[int, list[Attribute]] = {}
        for r in request.attributes:
            wanted.setdefault(id(self.owner[r.name]), []).append(self.attribute[r.name])
        by_model = {id(m): m for m in self.models}
        jobs = []
        for key, attrs in wanted.items():
            model = by_model[key]
            jobs.append((model, attrs, self.batchers[key].submit(model.inputs(texts, attrs))))
        results = await asyncio.gather(*(j[2] for j in jobs))
        per_text: list[dict[str, float]] = [{} for _ in texts]
        for (model, attrs, _), out in zip(jobs, results, strict=True):
            for i, scores in enumerate(model.scores(texts, attrs, out)):
                per_text[i].update(scores)
        span_scores = [(b, e, per_text[i + 1]) for i, (b, e, _) in enumerate(spans)]
        return perspective.response(request, per_text[0], span_scores, self.languages)


class _Metrics:
    """Prometheus metrics of one server, in a registry of its own."""

    def __init__(self, server: Server) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter(
            "jaxtpu_requests",
            "Requests answered, by route and status code.",
            ["route", "code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "jaxtpu_analyze_seconds",
            "Latency of comments:analyze, reading to answer.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        waiting = Gauge(
            "jaxtpu_queue_requests", "Requests waiting to be scored.", registry=self.registry
        )
        waiting.set_function(lambda: sum(b.waiting for b in server.batchers.values()))
        batches = Gauge("jaxtpu_batches", "Model calls made.", registry=self.registry)
        batches.set_function(lambda: sum(b.stats.batches for b in server.batchers.values()))
        items = Gauge("jaxtpu_batched_texts", "Texts scored.", registry=self.registry)
        items.set_function(lambda: sum(b.stats.items for b in server.batchers.values()))
        ready = Gauge("jaxtpu_ready", "1 once the programs are compiled.", registry=self.registry)
        ready.set_function(lambda: float(server.ready))

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


async def _read_body(request: Request, options: Options) -> bytes:
    """The body, refused (413) when it says or turns out to be larger than `max_body`, before
    more is read; a client that does not finish sending in `read_timeout` gets 408."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise ApiError(400, "Content-Length is not a number.")
        if int(length) > options.max_body:
            raise ApiError(413, f"Request body of {length} bytes; the limit is {options.max_body}.")
    body = bytearray()

    async def read() -> None:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > options.max_body:
                raise ApiError(413, f"Request body over the limit of {options.max_body} bytes.")

    try:
        await asyncio.wait_for(read(), options.read_timeout)
    except TimeoutError:
        raise ApiError(
            408, f"The request body did not arrive within {options.read_timeout} s."
        ) from None
    return bytes(body)


class _Routes:
    """The handlers of one server's routes; every response carries the model's version."""

    def __init__(self, server: Server) -> None:
        self.server, self.options = server, server.options

    def headers(self) -> dict[str, str]:
        return {"X-Model-Version": self.server.version}

    def error(self, e: ApiError, **more: str) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.code, headers={**self.headers(), **more})

    def check_key(self, request: Request) -> None:
        keys = self.options.api_keys
        if keys is None:
            return
        key = request.query_params.get("key")
        if key is None:
            raise ApiError(403, "The request is missing a valid API key (pass ?key=YOUR_API_KEY).")
        if key not in keys:
            raise ApiError(403, "API key not valid. Please pass a valid API key.")

    async def analyze(self, request: Request) -> Response:
        t0 = time.perf_counter()
        try:
            self.check_key(request)
            if not self.server.ready:
                raise ApiError(503, "The model is still loading; retry shortly.")
            body = await _read_body(request, self.options)
            req = perspective.parse_request(body, self.server.available, self.server.languages)
            if self.options.log_comments:
                log.info("comment: %r", req.text)
            response = await self._score(req)
        except ApiError as e:
            response = self.error(e)
        self.server.metrics.requests.labels("analyze", str(response.status_code)).inc()
        if response.status_code == 200:
            self.server.metrics.latency.observe(time.perf_counter() - t0)
        return response

    async def _score(self, req: perspective.AnalyzeRequest) -> Response:
        try:
            answer = await self.server.analyze(req)
        except Overloaded as e:
            message = f"Too many requests waiting; retry after {e.retry_after} s."
            return self.error(ApiError(429, message), **{"Retry-After": str(e.retry_after)})
        except Exception:  # noqa: BLE001 - this batch failed; the server goes on
            log.exception("scoring failed")
            return self.error(ApiError(500, "Scoring this comment failed."))
        return JSONResponse(answer, headers=self.headers())

    async def discovery_doc(self, request: Request) -> Response:
        version = request.query_params.get("version", discovery.VERSION)
        if version != discovery.VERSION:
            message = f"No API version {version}; this server has {discovery.VERSION}."
            return self.error(ApiError(404, message))
        return JSONResponse(discovery.document(str(request.base_url)), headers=self.headers())

    async def model_card(self, request: Request) -> Response:
        return JSONResponse(self.server.card(), headers=self.headers())

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"}, headers=self.headers())

    async def readyz(self, request: Request) -> Response:
        if not self.server.ready:
            return JSONResponse({"status": "loading"}, status_code=503, headers=self.headers())
        body = {"status": "ready", "version": self.server.version}
        return JSONResponse(body, headers=self.headers())

    async def metrics(self, request: Request) -> Response:
        body, kind = self.server.metrics.render()
        return Response(body, media_type=kind, headers=self.headers())

    async def page(self, request: Request) -> Response:
        return HTMLResponse(PAGE, headers=self.headers())

    async def http_error(self, request: Request, exc: Exception) -> Response:
        code = getattr(exc, "status_code", 500)
        message = {
            404: f"No such method: {request.method} {request.url.path}. This server answers "
            f"POST /{discovery.ANALYZE_PATH}.",
            405: f"Method {request.method} is not allowed on {request.url.path}.",
        }.get(code, str(getattr(exc, "detail", "")))
        self.server.metrics.requests.labels("other", str(code)).inc()
        return self.error(ApiError(code, message))


def build_app(server: Server) -> Starlette:
    """The ASGI application answering for `server` (started and stopped with the app)."""
    r = _Routes(server)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await server.start()
        try:
            yield
        finally:
            await server.stop()

    routes = [
        Route(f"/{discovery.ANALYZE_PATH}", r.analyze, methods=["POST"]),
        Route("/$discovery/rest", r.discovery_doc, methods=["GET"]),
        Route("/v1/model", r.model_card, methods=["GET"]),
        Route("/healthz", r.healthz, methods=["GET"]),
        Route("/readyz", r.readyz, methods=["GET"]),
        Route("/metrics", r.metrics, methods=["GET"]),
        Route("/", r.page, methods=["GET"]),
    ]
    return Starlette(
        routes=routes, exception_handlers={HTTPException: r.http_error}, lifespan=lifespan
    )
