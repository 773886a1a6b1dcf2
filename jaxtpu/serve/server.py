"""The state one `jaxtpu serve` application's routes share (`Server`): its model sets (the
base, each community's, the shadow), the communities' heads (`--communities DIR`, read again
every `HEADS_EVERY` seconds), its readiness, language detection, the feedback store
and the metrics; and the options it answers with (`Options`, the command's flags)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jaxtpu.core.errors import ConfigError
from jaxtpu.core.serving import perspective
from jaxtpu.core.serving.card import model_version
from jaxtpu.core.serving.feedback import Record, Store, StoreError
from jaxtpu.core.serving.heads import Head, HeadDir
from jaxtpu.core.serving.keys import KeyRing
from jaxtpu.core.serving.languages import Detector
from jaxtpu.core.serving.shadow import ShadowStats
from jaxtpu.serve.backends import Served
from jaxtpu.serve.batcher import Batcher, Overloaded
from jaxtpu.serve.metrics import Metrics
from jaxtpu.serve.models import ModelSet

log = logging.getLogger("jaxtpu.serve")
SHADOW_QUEUE = 32  # the shadow's requests waiting at most; beyond, it drops what comes
HEADS_EVERY = 2.0  # seconds between two looks at --communities DIR for heads added or replaced


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
      cors_origins: the origins whose pages may call the server (`("*",)`: any); () none.
      feedback: where suggestscore's suggestions are kept; None: nowhere (still answered).
      feedback_days: suggestions older than this are dropped (at start, then hourly).
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
    cors_origins: tuple[str, ...] = ()
    feedback: Store | None = None
    feedback_days: float | None = None
    log_comments: bool = False
    max_items: int = 64
    max_wait_ms: float = 5.0
    max_queue: int = 256
    warm_first: bool = False


class Server:
    """The model sets served (the base, each community's, the shadow) and the state the routes
    share (readiness, language detection, the feedback store, metrics)."""

    def __init__(
        self,
        models: Sequence[Served],
        options: Options,
        communities: Mapping[str, Sequence[Served]] | None = None,
        shadow: Sequence[Served] | None = None,
        heads: str | None = None,
        shadow_heads: str | None = None,
    ) -> None:
        self.options = options
        limits = (options.max_items, options.max_wait_ms, options.max_queue)
        self.base = ModelSet(models, *limits)
        self.communities = {c: ModelSet(m, *limits) for c, m in (communities or {}).items()}
        for community, models_of in self.communities.items():
            missing = [a for a in self.base.available if a not in models_of.available]
            if missing:
                raise ConfigError(
                    f"--community {community}: its model does not answer {', '.join(missing)} "
                    f"(the base model answers {', '.join(self.base.available)}); a community's "
                    "model answers what the base does, for that community's requests"
                )
        # the shadow: scored after each answer, when it keeps up; never answering
        self.shadow = (
            ModelSet(shadow, options.max_items, options.max_wait_ms, SHADOW_QUEUE)
            if shadow
            else None
        )
        self.shadow_stats = (
            ShadowStats(self.base.version, self.shadow.version) if self.shadow else None
        )
        # the communities' heads on the base (`--communities DIR`), checked against it
        self.heads = HeadDir(heads, self._refusal) if heads else None
        # candidates (`--shadow-communities DIR`): compared with what answers, never answering
        self.shadow_heads = HeadDir(shadow_heads, self._refusal) if shadow_heads else None
        self.head_shadow: dict[str, ShadowStats] = {}  # by community
        self._watching: asyncio.Task | None = None
        self.models = self.base.models
        self.available = self.base.available
        self.languages = self.base.languages
        self.version = self.base.version
        self.ready = False
        self.draining = False  # set on SIGTERM (`lifecycle.DrainingServer`): /readyz says 503
        self._warming: asyncio.Task | None = None
        self._purging: asyncio.Task | None = None
        self.detector = Detector()
        # the feedback store's calls block: one thread of their own, in arrival order
        self.store_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="feedback")
        self.metrics = Metrics(self)

    def sets(self) -> list[ModelSet]:
        """Every model set: the base, the communities', the shadow."""
        shadow = [self.shadow] if self.shadow else []
        return [self.base, *self.communities.values(), *shadow]

    @property
    def batchers(self) -> dict[int, Batcher]:
        """The batchers of the sets that answer (the shadow's apart)."""
        answering = [self.base, *self.communities.values()]
        return {k: b for s in answering for k, b in s.batchers.items()}

    def for_community(self, community: str | None) -> ModelSet:
        """The set answering a request naming `community`: its own, else the base."""
        return self.communities.get(community or "", self.base)

    def head_of(self, community: str | None) -> Head | None:
        """The head answering for `community` on the base (None: the base's own scores)."""
        if self.heads is None or not community or community in self.communities:
            return None
        return self.heads.heads.get(community)

    def _head_dirs(self) -> list[HeadDir]:
        return [d for d in (self.heads, self.shadow_heads) if d is not None]

    def _refusal(self, head: Head) -> str | None:
        """Why the base cannot serve `head` (None: it can)."""
        r = head.record
        owner = self.base.owner.get(r.attribute)
        if owner is None:
            return f"answers {r.attribute}, which the base model does not"
        if owner.version != r.base_version:
            return (
                f"trained on model {r.base_version}, and this server's is {owner.version} (another "
                "model, or its --attributes or --no-calibration differ): train it again on this "
                f"one (jaxtpu head {owner.source} ...)"
            )
        if tuple(owner.columns) != r.columns:
            return (
                f"reads columns {', '.join(r.columns)}; the base scores {', '.join(owner.columns)}"
            )
        return None

    async def _watch_heads(self) -> None:
        """Reads --communities DIR again every `HEADS_EVERY` seconds (in a thread): a head
        added or replaced answers from the next request, a broken one is said and the old one
        keeps serving."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(HEADS_EVERY)
            for folder in self._head_dirs():
                try:
                    lines = await loop.run_in_executor(None, folder.refresh)
                except OSError as e:  # the directory went away: the heads read keep serving
                    log.error("%s: %s; the heads already read keep serving", folder.path, e)
                    continue
                for line in lines:
                    log.info("heads: %s", line)

    async def start(self) -> None:
        """Starts the batchers, and compiles each model's programs in the background: the
        server answers /healthz at once, /readyz and the API once they are compiled (with
        `warm_first`, before it takes a connection)."""
        for s in self.sets():
            await s.start()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self.detector.detect, "loads the detector's model")
        for folder in self._head_dirs():
            for line in folder.refresh():
                log.info("heads: %s", line)
            log.info("heads: %d communities from %s", len(folder.heads), folder.path)
        if self._head_dirs():
            self._watching = asyncio.create_task(self._watch_heads())
        if self.options.feedback is not None and self.options.feedback_days is not None:
            self._purging = asyncio.create_task(self._purge_hourly())
        self._warming = asyncio.create_task(self._warm_up())
        if self.options.warm_first:
            await self._warming

    async def _purge_hourly(self) -> None:
        """Drops the suggestions older than --feedback-days, now and every hour."""
        store, days = self.options.feedback, self.options.feedback_days
        assert store is not None and days is not None
        loop = asyncio.get_running_loop()
        while True:
            try:
                n = await loop.run_in_executor(self.store_pool, store.purge, days)
                if n:
                    log.info("feedback: dropped %d suggestion(s) older than %g days", n, days)
            except StoreError as e:
                log.error("%s", e)
            await asyncio.sleep(3600)

    async def keep(self, record: Record) -> None:
        """Keeps a suggestion in the feedback store (StoreError when it does not answer)."""
        assert self.options.feedback is not None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.store_pool, self.options.feedback.put, record)
        self.metrics.feedback.inc()

    async def _warm_up(self) -> None:
        try:
            for s in self.sets():
                await s.warm_up()
        except Exception:  # noqa: BLE001 - reported, and the server stays not ready
            log.exception("compiling the model's programs failed; the server is not ready")
            return
        self.ready = True

    async def stop(self) -> None:
        self.ready = False
        for task in (self._warming, self._purging, self._watching):
            if task and not task.done():
                task.cancel()
        self.store_pool.shutdown(wait=True)  # a suggestion being written is kept
        for s in self.sets():
            await s.stop()

    def card(self) -> dict[str, Any]:
        card = self.base.card()
        if self.communities or self.shadow:
            card = {**card}
            if self.communities:
                card["communities"] = {c: s.card() for c, s in self.communities.items()}
            if self.shadow:
                card["shadow"] = self.shadow.card()
        if self.heads is not None:
            card = {**card, "heads": self.heads.card()}
        if self.shadow_heads is not None:
            card = {**card, "shadow_heads": self.shadow_heads.card()}
        return card

    async def analyze(
        self,
        request: perspective.AnalyzeRequest,
        languages: Sequence[str] = (),
        detected: Sequence[str] = (),
    ) -> tuple[dict[str, Any], str]:
        """The answer to a checked request and the version that gave it: the comment (and its
        sentences when spans are asked for) through the request's community's models (else
        the base's); `languages` the comment was scored as, and those `detected`."""
        answering = self.for_community(request.community_id)
        head = self.head_of(request.community_id)
        candidate = self.candidate_of(request.community_id)
        compared: dict[str, float] = {}
        spans = list(request.sentences)
        texts = [request.text] + [s for _, _, s in spans]
        names = [r.name for r in request.attributes]
        per_text = await answering.scores(texts, names, head, candidate, compared)
        span_scores = [(b, e, per_text[i + 1]) for i, (b, e, _) in enumerate(spans)]
        answer = perspective.response(
            request, per_text[0], span_scores, languages or answering.languages, detected
        )
        version = answering.version
        if head is not None:
            version = model_version({"base": answering.version, "head": head.version})
        if candidate is not None and compared:
            community = request.community_id or ""
            self._compare_head(community, version, candidate, per_text[0], compared)
        return answer, version

    def candidate_of(self, community: str | None) -> Head | None:
        """The head in shadow for `community` (`--shadow-communities`), None without one."""
        if self.shadow_heads is None or not community or community in self.communities:
            return None
        return self.shadow_heads.heads.get(community)

    def _compare_head(
        self,
        community: str,
        version: str,
        candidate: Head,
        answered: Mapping[str, float],
        compared: Mapping[str, float],
    ) -> None:
        """A head in shadow's score of a comment beside what answered it (the head in service,
        or the base), from the same pass; counted afresh when either changes."""
        stats = self.head_shadow.get(community)
        if stats is None or (stats.primary, stats.shadow) != (version, candidate.version):
            stats = self.head_shadow[community] = ShadowStats(version, candidate.version)
        stats.add({k: answered[k] for k in compared if k in answered}, compared)

    def shadow_report(self) -> dict[str, Any] | None:
        """`GET /v1/shadow`: the model in shadow's report, and each community's head in shadow
        under `communities`; None when nothing is in shadow."""
        if self.shadow_stats is None and self.shadow_heads is None:
            return None
        report = self.shadow_stats.report() if self.shadow_stats is not None else {}
        if self.shadow_heads is not None:
            report["communities"] = {c: s.report() for c, s in sorted(self.head_shadow.items())}
        return report

    async def compare_in_shadow(self, text: str, primary: Mapping[str, float]) -> None:
        """The shadow's scores of a comment beside the answer's (`primary`), kept in its
        stats; dropped (and counted) when the shadow or the answering models are behind."""
        assert self.shadow is not None and self.shadow_stats is not None
        names = [n for n in primary if n in self.shadow.available]
        if not names:
            return
        if self.base.waiting or self.shadow.waiting >= SHADOW_QUEUE:
            self.shadow_stats.dropped += 1
            return
        try:
            (theirs,) = await self.shadow.scores([text], names)
        except Overloaded:
            self.shadow_stats.dropped += 1
            return
        except Exception:  # noqa: BLE001 - the shadow's failure never touches an answer
            log.exception("the shadow model failed to score a comment")
            self.shadow_stats.failed += 1
            return
        self.shadow_stats.add(primary, theirs)
