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
from starlette.background import BackgroundTask, BackgroundTasks
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from jaxtpu.core.serving import card, discovery, perspective, suggest
from jaxtpu.core.serving.batch import (
    MAX_CALLS,
    Answer,
    Call,
    batch_response,
    first_call_key,
    parse_batch,
)
from jaxtpu.core.serving.feedback import Record, StoreError
from jaxtpu.core.serving.keys import ApiKey, Quotas
from jaxtpu.core.serving.languages import scored_as
from jaxtpu.core.serving.perspective import ApiError
from jaxtpu.serve import page
from jaxtpu.serve.batcher import Overloaded
from jaxtpu.serve.protocol import HeadLimits
from jaxtpu.serve.server import Options, Server

log = logging.getLogger("jaxtpu.serve")
START_BYTES = 32 * 1024  # a batch's first bytes, where its first call's key is looked for


async def _read_body(
    request: Request,
    options: Options,
    limit: int | None = None,
    check_start: Callable[[bytes], None] | None = None,
) -> bytes:
    """The body, refused (413) when it says or turns out to be larger than `limit` (default
    `max_body`), before more is read; a client that does not finish sending in `read_timeout`
    gets 408, one that goes away is 499 (nothing is sent: nobody is there to read it).
    `check_start` is called once on the body's first `START_BYTES` (or the whole body, when
    shorter) before the rest is read, and may refuse it by raising."""
    limit = options.max_body if limit is None else limit
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise ApiError(400, "Content-Length is not a number.")
        if int(length) > limit:
            raise ApiError(413, f"Request body of {length} bytes; the limit is {limit}.")
    body = bytearray()

    async def read() -> None:
        check = check_start
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limit:
                raise ApiError(413, f"Request body over the limit of {limit} bytes.")
            if check is not None and len(body) >= START_BYTES:
                check(bytes(body))
                check = None
        if check is not None:
            check(bytes(body))

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
Body = Callable[[], Awaitable[bytes]]


@dataclass
class _Batch:
    """What the calls of one batch share: the sentences their spans may still ask for (a
    batch asks for at most as many as one request may), and the work each call left for after
    the answer (the shadow's comparisons)."""

    sentences_left: int = perspective.MAX_SPANS
    after: list[BackgroundTask] = field(default_factory=list)

    def take_sentences(self, n: int) -> None:
        if n > self.sentences_left:
            raise ApiError(
                400,
                f"spanAnnotations: this batch's calls ask for more than {perspective.MAX_SPANS} "
                f"sentences in all; a batch may ask for as many as one request (at most "
                f"{perspective.MAX_SPANS}). Send the rest in another batch.",
            )
        self.sentences_left -= n


@dataclass
class _Call:
    """What one call's handler learned: the key it named (for the per-key counts), and the
    headers its error answer carries (Retry-After); `batch`, when it is a batch's call."""

    key: ApiKey | None = None
    extra_headers: dict[str, str] = field(default_factory=dict)
    batch: _Batch | None = None


class _Routes:
    """The handlers of one server's routes; every response carries the model's version."""

    def __init__(self, server: Server) -> None:
        self.server, self.options = server, server.options
        self.quotas = Quotas()
        # the API's methods, by (HTTP method, path): a batch's calls are dispatched here too
        self.methods = {
            ("POST", f"/{discovery.ANALYZE_PATH}"): ("analyze", self.analyze),
            ("POST", f"/{discovery.SUGGEST_PATH}"): ("suggestscore", self.suggestscore),
        }

    def headers(self, version: str | None = None) -> dict[str, str]:
        """Every answer's: the version of the model that answered (the base's by default)."""
        return {
            "X-Model-Version": version or self.server.version,
            "X-Content-Type-Options": "nosniff",
        }

    def error(self, e: ApiError, **more: str) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.code, headers={**self.headers(), **more})

    async def respond(
        self, route: str, call: _Call, work: Callable[[], Awaitable[Response]]
    ) -> Response:
        """`work`'s response: an `ApiError` answered in Google's shape, anything else a logged
        500 in that shape; counted by route and status (and by the key's name)."""
        try:
            response = await work()
        except ApiError as e:
            response = self.error(e, **call.extra_headers)
        except Exception:  # noqa: BLE001 - a bug: one logged 500, the server goes on
            log.exception("%s failed", route)
            response = self.error(ApiError(500, "The server failed to answer this request."))
        self.count(route, response.status_code, call.key)
        return response

    def endpoint(self, route: str, keyed: bool = True) -> Callable[[Handler], Handler]:
        """A route's handler, the key checked first (`keyed`, when the server has keys), its
        answer as `respond` gives it."""

        def wrap(handler: Callable[[Request, _Call], Awaitable[Response]]) -> Handler:
            @functools.wraps(handler)
            async def answer(request: Request) -> Response:
                call = _Call()

                async def work() -> Response:
                    if keyed:
                        call.key = self.check_key(_key_of(request.query_params, request.headers))
                    return await handler(request, call)

                return await self.respond(route, call, work)

            return answer

        return wrap

    def method(self, name: str) -> Handler:
        """An API method as a route: its body read from the request."""
        _, handler = self.methods[("POST", f"/{discovery.VERSION}/comments:{name}")]

        async def route(request: Request, call: _Call) -> Response:
            return await handler(lambda: _read_body(request, self.options), call)

        return self.endpoint(name)(route)

    def count(self, route: str, code: int, key: ApiKey | None = None) -> None:
        self.server.metrics.requests.labels(route, str(code)).inc()
        if key is not None:
            self.server.metrics.by_key.labels(key.name, str(code)).inc()

    def check_key(self, key: str | None) -> ApiKey | None:
        """The record of a request's key (`?key=` or the `X-Goog-Api-Key` header, as Google's
        APIs take it), found in constant time; 403 when the server has keys and this is none
        of them."""
        keys = self.options.api_keys
        if keys is None:
            return None
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

    async def analyze(self, read: Body, call: _Call) -> Response:
        t0 = time.perf_counter()
        self.take_quota(call)
        if not self.server.ready:
            raise ApiError(503, "The model is still loading; retry shortly.")
        req = perspective.parse_request(await read(), self.server.available, self.server.languages)
        if self.options.log_comments:
            log.info("comment: %r", req.text)
        detection = self.server.detector.detect(req.text)
        if call.batch is not None:
            call.batch.take_sentences(len(req.sentences))
        if req.unsupported:  # languages it lacks, named with dropUnsupportedAttributes
            answer = perspective.dropped_response(req, (detection.top,), detection.languages)
            return JSONResponse(answer, headers=self.headers())
        # a detection never refuses a comment (jaxtpu.core.serving.languages says why)
        languages = scored_as(req.languages, detection, self.server.languages)
        try:
            answer, version = await self.server.analyze(req, languages, detection.languages)
        except Overloaded as e:
            message = f"Too many requests waiting; retry after {e.retry_after} s."
            call.extra_headers["Retry-After"] = str(e.retry_after)
            raise ApiError(429, message) from None
        except Exception:  # noqa: BLE001 - this request's call failed; the server goes on
            log.exception("scoring failed")
            raise ApiError(500, "Scoring this comment failed.") from None
        self.server.metrics.latency.observe(time.perf_counter() - t0)
        shadow = self.in_shadow(req, answer)
        if shadow is not None and call.batch is not None:  # after the batch's answer
            call.batch.after.append(shadow)
            shadow = None
        return JSONResponse(answer, headers=self.headers(version), background=shadow)

    def in_shadow(
        self, req: perspective.AnalyzeRequest, answer: dict[str, Any]
    ) -> BackgroundTask | None:
        """The shadow's comparison of an answer, to run after it is sent (it never waits for
        it); None without a shadow. An answer of a community's own model is counted, not
        compared: the shadow stands beside the base."""
        stats = self.server.shadow_stats
        if stats is None:
            return None
        community = req.community_id
        if self.server.for_community(community) is not self.server.base or self.server.head_of(
            community
        ):
            stats.community += 1
            return None
        scores = answer["attributeScores"]
        primary = {n: v["summaryScore"]["value"] for n, v in scores.items() if "summaryScore" in v}
        return BackgroundTask(self.server.compare_in_shadow, req.text, primary)

    async def shadow_report(self, request: Request, call: _Call) -> Response:
        report = self.server.shadow_report()
        if report is None:
            raise ApiError(
                404,
                "No model in shadow: start the server with --shadow RUN or "
                "--shadow-communities DIR.",
            )
        return JSONResponse(report, headers=self.headers())

    async def suggestscore(self, read: Body, call: _Call) -> Response:
        """A suggestion, checked and kept where --feedback says (nowhere without it)."""
        self.take_quota(call)
        req = suggest.parse_suggest(await read())
        detection = self.server.detector.detect(req.text)
        if self.options.feedback is not None:
            record = Record(
                req.text,
                {name: s.to_dict() for name, s in req.scores.items()},
                req.community_id,
                req.client_token,
                req.session_id,
                req.languages,
                self.server.version,
                time.time(),
                call.key.name if call.key else "",
                bool(call.key and call.key.moderator),
            )
            try:
                await self.server.keep(record)
            except StoreError as e:
                log.error("%s", e)
                raise ApiError(503, "The feedback store is not answering; retry later.") from None
        answer = suggest.suggest_response(req, detection.languages)
        return JSONResponse(answer, headers=self.headers())

    async def batch(self, request: Request, call: _Call) -> Response:
        """Google's batch: each call answered in its part as it would be alone (its key from
        its own URL or headers, else the batch's), all scored together. With keys, a batch
        whose request names no valid key and whose first call names none either is a 403
        before the rest of its body is read; it is parsed off the event loop; a client that
        goes away cancels its calls still waiting."""
        outer = _key_of(request.query_params, request.headers)
        check = None
        if self.options.api_keys is not None:
            if outer is not None:
                self.check_key(outer)  # a wrong key: refused before the body is read
            else:
                check = self.check_first_call_key
        limit = self.options.max_body * MAX_CALLS
        body = await _read_body(request, self.options, limit, check)
        loop = asyncio.get_running_loop()
        kind = request.headers.get("content-type", "")
        calls = await loop.run_in_executor(None, parse_batch, kind, body)
        shared = _Batch()
        answering = asyncio.gather(*(self.batch_call(c, outer, shared) for c in calls))
        answers = await _unless_gone(request, answering)
        kind, payload = batch_response(answers)
        after = BackgroundTasks(shared.after) if shared.after else None
        return Response(payload, media_type=kind, headers=self.headers(), background=after)

    def check_first_call_key(self, start: bytes) -> None:
        """403 unless a batch's first call (in its body's first bytes) names a valid key."""
        key = first_call_key(start)
        if key is None:
            raise ApiError(
                403,
                "The batch request is missing a valid API key: pass it on the batch (?key= or "
                "the X-Goog-Api-Key header) or on its first call's URL.",
            )
        self.check_key(key)

    async def batch_call(self, c: Call, outer_key: str | None, shared: _Batch) -> Answer:
        part = _Call(batch=shared)
        route, handler = self.methods.get((c.method, c.path), ("other", None))

        async def read() -> bytes:
            return c.body

        async def work() -> Response:
            if c.problem:
                raise ApiError(400, c.problem)
            if handler is None:
                raise ApiError(
                    404,
                    f"No such method in a batch: {c.method} {c.path[:100]}. A batch call is "
                    f"POST /{discovery.ANALYZE_PATH} or POST /{discovery.SUGGEST_PATH}.",
                )
            part.key = self.check_key(_key_of(c.query, c.headers) or outer_key)
            if len(c.body) > self.options.max_body:
                raise ApiError(
                    413,
                    f"Request body of {len(c.body)} bytes; the limit is {self.options.max_body}.",
                )
            return await handler(read, part)

        response = await self.respond(route, part, work)
        return Answer(c.content_id, response.status_code, response.headers.items(), response.body)

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
        return JSONResponse(card.public(self.server.card()), headers=self.headers())

    async def healthz(self, request: Request, call: _Call) -> Response:
        return JSONResponse({"status": "ok"}, headers=self.headers())

    async def readyz(self, request: Request, call: _Call) -> Response:
        if self.server.draining:  # stopping: no new traffic, though it still answers
            return JSONResponse({"status": "draining"}, status_code=503, headers=self.headers())
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
            f"POST /{discovery.ANALYZE_PATH} and POST /{discovery.SUGGEST_PATH}.",
            405: f"Method {request.method} is not allowed on {request.url.path}.",
        }.get(code, str(getattr(exc, "detail", "")))
        self.count("other", code)
        return self.error(ApiError(code, message))


async def _unless_gone(request: Request, work: asyncio.Future) -> Any:
    """`work`'s result, or, when the client goes away first, `work` cancelled (its texts
    leave the batcher's queue unscored) and a 499 (nobody is there to read it)."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            await asyncio.sleep(0.05)  # a server that hands out empty bodies: not a busy loop

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():
            work.cancel()
        watch.cancel()
    if not work.done() or work.cancelled():
        raise ApiError(499, "The client closed the connection before its batch was answered.")
    return work.result()


def _key_of(query: Any, headers: Any) -> str | None:
    """A request's key: `?key=`, else the `X-Goog-Api-Key` header (None: neither)."""
    return query.get("key") or headers.get("x-goog-api-key")


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
        Route(f"/{discovery.ANALYZE_PATH}", r.method("analyze"), methods=["POST"]),
        Route(f"/{discovery.SUGGEST_PATH}", r.method("suggestscore"), methods=["POST"]),
        # each call of a batch is keyed on its own (its URL's key, else the batch's)
        Route(
            f"/{discovery.BATCH_PATH}", r.endpoint("batch", keyed=False)(r.batch), methods=["POST"]
        ),
        Route("/$discovery/rest", r.endpoint("discovery")(r.discovery_doc), methods=["GET"]),
        Route("/v1/model", r.endpoint("model")(r.model_card), methods=["GET"]),
        Route("/v1/shadow", r.endpoint("shadow")(r.shadow_report), methods=["GET"]),
        Route("/healthz", r.endpoint("healthz", keyed=False)(r.healthz), methods=["GET"]),
        Route("/readyz", r.endpoint("readyz", keyed=False)(r.readyz), methods=["GET"]),
        Route("/metrics", r.endpoint("metrics")(r.metrics), methods=["GET"]),
        Route("/", r.endpoint("page", keyed=False)(r.page), methods=["GET"]),
    ]
    middleware = [_cors(r, options.cors_origins)] if options.cors_origins else []
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={HTTPException: r.http_error},
        lifespan=lifespan,
    )
    app.state.server = server  # for `lifecycle.DrainingServer`
    app.state.limits = HeadLimits(
        options.max_header_bytes,
        options.max_headers,
        options.read_timeout,
        lambda code: r.count("http", code),
    )
    return app


def _cors(r: _Routes, origins: Sequence[str]) -> Middleware:
    """Starlette's CORS middleware for `origins` (`*`: any): preflights answered (and counted,
    as route `preflight`), CORS headers on every answer to a listed origin; the key travels as
    `?key=` or the `X-Goog-Api-Key` header, no cookies."""
    from starlette.middleware.cors import CORSMiddleware

    class Counted(CORSMiddleware):
        def preflight_response(self, request_headers: Any) -> Response:
            response = super().preflight_response(request_headers)
            r.count("preflight", response.status_code)
            return response

    return Middleware(
        Counted,
        allow_origins=list(origins),
        allow_methods=["GET", "POST"],
        allow_headers=["Content-Type", "X-Goog-Api-Key"],
        expose_headers=["X-Model-Version", "Retry-After"],
        max_age=600,
    )
