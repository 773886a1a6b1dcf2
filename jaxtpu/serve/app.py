"""The HTTP application of `jaxtpu serve` (Starlette, on uvicorn): Perspective's
`POST /v1alpha1/comments:analyze`, the discovery document Google's client reads, the model's
card (`GET /v1/model`), `/healthz`, `/readyz`, `/metrics` (Prometheus) and a page for people
(`GET /`). Every response carries the model's version in `X-Model-Version`; every error is
Google's JSON shape, an unexpected one too (a 500, logged), and every answer is counted in
`/metrics` by route and status. With keys, every route that shows the model or its traffic
needs one (`?key=` or the `X-Goog-Api-Key` header); `/healthz`, `/readyz` and the static page
do not. No comment text is logged unless `log_comments`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from jaxtpu.core.serving import discovery, perspective
from jaxtpu.core.serving.attributes import Attribute, merge
from jaxtpu.core.serving.card import model_version
from jaxtpu.core.serving.keys import ApiKey, KeyRing, Quotas
from jaxtpu.core.serving.perspective import ApiError
from jaxtpu.serve import page
from jaxtpu.serve.backends import Served
from jaxtpu.serve.batcher import Batcher, Overloaded
from jaxtpu.serve.protocol import HeadLimits

log = logging.getLogger("jaxtpu.serve")


@dataclass(frozen=True)
class Options:
    """How the server answers (the command's flags).

    Attributes:
      api_keys: the keys a request's `?key=` or `X-Goog-Api-Key` must be one of, with their
        names and limits; None: no key needed.
      max_body: request bodies larger than this (bytes) are refused before they are read.
      read_timeout: seconds a client has to send its request's head, and again its body.
      max_header_bytes, max_headers: a request's head at most (bytes; header lines).
      public_url: the server's address as clients reach it (the discovery document's root);
        None: the address the connection came in on (never the request's Host header).
      log_comments: log each request's comment text (off: never).
      max_items: texts per model call at most (the dynamic batch).
      max_wait_ms: how long a batch waits for more requests.
      max_queue: requests waiting at most; beyond, 429 with Retry-After.
      warm_first: compile before taking connections (--workers: processes sharing a socket
        take connections only once they can score, so none answers 503 beside a ready one).
    """

    api_keys: KeyRing | None = None
    max_body: int = 256 * 1024
    read_timeout: float = 10.0
    max_header_bytes: int = 16 * 1024
    max_headers: int = 100
    public_url: str | None = None
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
        spans = list(request.sentences)
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
        self.by_key = Counter(
            "jaxtpu_key_requests",
            "Requests that named a valid key, by the key's name and status code.",
            ["key", "code"],
            registry=self.registry,
        )
        waiting = Gauge(
            "jaxtpu_queue_requests", "Requests waiting to be scored.", registry=self.registry
        )
        waiting.set_function(lambda: sum(b.waiting for b in server.batchers.values()))
        peak = Gauge(
            "jaxtpu_queue_peak_requests",
            "The most requests that have waited at once (at most --max-queue).",
            registry=self.registry,
        )
        peak.set_function(lambda: max(b.stats.peak_waiting for b in server.batchers.values()))
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
    more is read; a client that does not finish sending in `read_timeout` gets 408, one that
    goes away is 499 (nothing is sent: nobody is there to read it)."""
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
    except ClientDisconnect:
        raise ApiError(499, "The client closed the connection before sending its body.") from None
    return bytes(body)


Handler = Callable[[Request], Awaitable[Response]]


@dataclass
class _Call:
    """What one request's handler learned: the key it named (for the per-key counts)."""

    key: ApiKey | None = None
    extra_headers: dict[str, str] = field(default_factory=dict)


class _Routes:
    """The handlers of one server's routes; every response carries the model's version."""

    def __init__(self, server: Server) -> None:
        self.server, self.options = server, server.options
        self.quotas = Quotas()

    def headers(self) -> dict[str, str]:
        return {"X-Model-Version": self.server.version, "X-Content-Type-Options": "nosniff"}

    def error(self, e: ApiError, **more: str) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.code, headers={**self.headers(), **more})

    def endpoint(self, route: str, keyed: bool = True) -> Callable[[Handler], Handler]:
        """A route's handler, wrapped: the key checked first (`keyed`, when the server has
        keys), an `ApiError` answered in Google's shape, anything else a logged 500 in that
        shape, and every answer counted by route and status (and by the key's name)."""

        def wrap(handler: Callable[[Request, _Call], Awaitable[Response]]) -> Handler:
            @functools.wraps(handler)
            async def answer(request: Request) -> Response:
                call = _Call()
                try:
                    if keyed:
                        call.key = self.check_key(request)
                    response = await handler(request, call)
                except ApiError as e:
                    response = self.error(e, **call.extra_headers)
                except Exception:  # noqa: BLE001 - a bug: one logged 500, the server goes on
                    log.exception("%s %s failed", request.method, request.url.path)
                    response = self.error(
                        ApiError(500, "The server failed to answer this request.")
                    )
                self.count(route, response.status_code, call.key)
                return response

            return answer

        return wrap

    def count(self, route: str, code: int, key: ApiKey | None = None) -> None:
        self.server.metrics.requests.labels(route, str(code)).inc()
        if key is not None:
            self.server.metrics.by_key.labels(key.name, str(code)).inc()

    def check_key(self, request: Request) -> ApiKey | None:
        """The request's key (`?key=` or the `X-Goog-Api-Key` header, as Google's APIs take
        it), found in constant time; 403 when the server has keys and this is none of them."""
        keys = self.options.api_keys
        if keys is None:
            return None
        key = request.query_params.get("key") or request.headers.get("x-goog-api-key")
        if key is None:
            raise ApiError(
                403,
                "The request is missing a valid API key (pass ?key=YOUR_API_KEY or the "
                "X-Goog-Api-Key header).",
            )
        found = keys.find(key)
        if found is None:
            raise ApiError(403, "API key not valid. Please pass a valid API key.")
        return found

    def take_quota(self, call: _Call) -> None:
        """429 in Google's shape when the call's key is over its requests a minute."""
        if call.key is None:
            return
        wait = self.quotas.take(call.key)
        if wait:
            call.extra_headers["Retry-After"] = str(wait)
            raise quota_exceeded(call.key, wait)

    async def analyze(self, request: Request, call: _Call) -> Response:
        t0 = time.perf_counter()
        self.take_quota(call)
        if not self.server.ready:
            raise ApiError(503, "The model is still loading; retry shortly.")
        body = await _read_body(request, self.options)
        req = perspective.parse_request(body, self.server.available, self.server.languages)
        if self.options.log_comments:
            log.info("comment: %r", req.text)
        try:
            answer = await self.server.analyze(req)
        except Overloaded as e:
            message = f"Too many requests waiting; retry after {e.retry_after} s."
            call.extra_headers["Retry-After"] = str(e.retry_after)
            raise ApiError(429, message) from None
        except Exception:  # noqa: BLE001 - this request's call failed; the server goes on
            log.exception("scoring failed")
            raise ApiError(500, "Scoring this comment failed.") from None
        self.server.metrics.latency.observe(time.perf_counter() - t0)
        return JSONResponse(answer, headers=self.headers())

    def root_url(self, request: Request) -> str:
        """The discovery document's root: `--public-url`, else the address this connection
        came in on (the socket's, which a client cannot forge as it can a Host header)."""
        if self.options.public_url:
            return self.options.public_url.rstrip("/") + "/"
        host, port = request.scope.get("server") or ("127.0.0.1", 80)
        shown = f"[{host}]" if ":" in str(host) else host
        return f"http://{shown}:{port}/"

    async def discovery_doc(self, request: Request, call: _Call) -> Response:
        version = request.query_params.get("version", discovery.VERSION)
        if version != discovery.VERSION:
            raise ApiError(404, f"No API version {version}; this server has {discovery.VERSION}.")
        return JSONResponse(discovery.document(self.root_url(request)), headers=self.headers())

    async def model_card(self, request: Request, call: _Call) -> Response:
        return JSONResponse(self.server.card(), headers=self.headers())

    async def healthz(self, request: Request, call: _Call) -> Response:
        return JSONResponse({"status": "ok"}, headers=self.headers())

    async def readyz(self, request: Request, call: _Call) -> Response:
        if not self.server.ready:
            return JSONResponse({"status": "loading"}, status_code=503, headers=self.headers())
        body = {"status": "ready", "version": self.server.version}
        return JSONResponse(body, headers=self.headers())

    async def metrics(self, request: Request, call: _Call) -> Response:
        body, kind = self.server.metrics.render()
        return Response(body, media_type=kind, headers=self.headers())

    async def page(self, request: Request, call: _Call) -> Response:
        return HTMLResponse(page.PAGE, headers={**self.headers(), **page.HEADERS})

    async def http_error(self, request: Request, exc: Exception) -> Response:
        code = getattr(exc, "status_code", 500)
        message = {
            404: f"No such method: {request.method} {request.url.path}. This server answers "
            f"POST /{discovery.ANALYZE_PATH}.",
            405: f"Method {request.method} is not allowed on {request.url.path}.",
        }.get(code, str(getattr(exc, "detail", "")))
        self.count("other", code)
        return self.error(ApiError(code, message))


def quota_exceeded(key: ApiKey, wait: int) -> ApiError:
    """Perspective's 429 for a key over its quota: RESOURCE_EXHAUSTED with an ErrorInfo whose
    reason is RATE_LIMIT_EXCEEDED, naming the key's limit (never the key)."""
    return ApiError(
        429,
        f"Quota exceeded for key {key.name}: {key.per_minute} requests a minute; retry after "
        f"{wait} s.",
        [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "RATE_LIMIT_EXCEEDED",
                "domain": "googleapis.com",
                "metadata": {
                    "service": "commentanalyzer.googleapis.com",
                    "quota_limit": "RequestsPerMinutePerKey",
                    "quota_limit_value": str(key.per_minute),
                    "consumer": key.name,
                },
            }
        ],
    )


def build_app(server: Server) -> Starlette:
    """The ASGI application answering for `server` (started and stopped with the app)."""
    r = _Routes(server)
    options = server.options

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await server.start()
        try:
            yield
        finally:
            await server.stop()

    routes = [
        Route(f"/{discovery.ANALYZE_PATH}", r.endpoint("analyze")(r.analyze), methods=["POST"]),
        Route("/$discovery/rest", r.endpoint("discovery")(r.discovery_doc), methods=["GET"]),
        Route("/v1/model", r.endpoint("model")(r.model_card), methods=["GET"]),
        Route("/healthz", r.endpoint("healthz", keyed=False)(r.healthz), methods=["GET"]),
        Route("/readyz", r.endpoint("readyz", keyed=False)(r.readyz), methods=["GET"]),
        Route("/metrics", r.endpoint("metrics")(r.metrics), methods=["GET"]),
        Route("/", r.endpoint("page", keyed=False)(r.page), methods=["GET"]),
    ]
    app = Starlette(
        routes=routes, exception_handlers={HTTPException: r.http_error}, lifespan=lifespan
    )
    app.state.limits = HeadLimits(
        options.max_header_bytes,
        options.max_headers,
        options.read_timeout,
        lambda code: r.count("http", code),
    )
    return app
