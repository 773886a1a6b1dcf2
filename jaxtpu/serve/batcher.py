"""Dynamic batching: the texts of concurrent requests scored together, in one call of the
model, up to `max_items` texts or `max_wait_ms` after the oldest arrived, whichever comes
first.

A request's texts (its comment, and each sentence when it asks for spans) are its parts. At
most `max_queue` requests wait to be scored: a request counts from the moment it is admitted
(before its texts are tokenized) until its first text enters a model call, and one more is
refused at once (`Overloaded`, the server's 429 with a Retry-After from the measured drain
rate), so memory and latency stay bounded under a flood. The model runs in one thread beside
the event loop (a device is driven by one caller at a time), while the loop keeps reading
requests. A call that fails fails the requests it held only; the next is scored as if nothing
happened. A text's score does not depend on the call it shares (`jaxtpu.engine.scoring.
Scorer` pads every call to one shape and groups texts by fixed length buckets), so batching
changes latency, never a score.

Fair between requests: a call takes the first waiting text of every request before the
second of any, so a request of many texts (a long comment's sentences) is scored across
several calls while the texts of requests that arrive meanwhile go into the next call,
instead of waiting for all of it.

For a model that pads every call to `rows` texts of one length bucket (the JAX backend), the
texts are grouped by bucket (`bucket_of`): a bucket is scored as soon as it fills whole calls,
and what is left of it waits at most `max_wait_ms` (from its oldest text) for more texts of
its length, then goes as it is. Under load every call is then full, as offline scoring's are;
a request whose texts fall in several buckets is answered when the last of them is scored. A
model without buckets is one bucket whose whole call is `max_items` texts.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import concurrent.futures
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# a bucket's remainder is never held back for fuller ones longer than this many waits
STARVE = 20
RECENT = 50  # the calls whose texts and seconds give the drain rate (Retry-After)


class Overloaded(Exception):
    """The queue is full: the request is refused, to be retried after `retry_after` s."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"the server is at capacity; retry after {retry_after} s")
        self.retry_after = retry_after


@dataclass(eq=False)
class _Job:
    items: list[Any]
    future: asyncio.Future
    seq: int
    queued: float = field(default_factory=time.perf_counter)
    results: list[Any] = field(default_factory=list)
    left: int = 0
    waiting: bool = True  # counted in `Batcher.waiting` until a text of it enters a call


@dataclass(eq=False)
class _Part:
    """One text of a job, waiting in its bucket; `order` places it: (its rank among its
    job's texts of this bucket, the job's arrival), so every job's first text comes before
    any job's second."""

    job: _Job
    index: int
    order: tuple[int, int]


@dataclass
class BatchStats:
    """What the batcher has done, for /metrics and the tests."""

    batches: int = 0
    items: int = 0
    failed_batches: int = 0
    refused: int = 0
    peak_waiting: int = 0
    last_sizes: list[int] = field(default_factory=list)


class Batcher:
    """Scores lists of items with `score(items) -> (N, ...) array`, batching concurrent calls.

    Args:
      score: the model's scoring function (blocking; run in one worker thread).
      max_items: texts per model call at most; a request of more is scored over several
        calls, interleaved with other requests' texts.
      max_wait_ms: how long the oldest waiting text waits for a fuller call.
      max_queue: requests waiting at most; beyond it `submit` raises `Overloaded`.
      bucket_of: each item's length bucket, for a model whose calls are `rows` items of one
        bucket (None: one bucket, calls of up to `max_items` in fair arrival order).
      rows: the items of one call of such a model.
    """

    def __init__(
        self,
        score: Callable[[list[Any]], np.ndarray],
        max_items: int = 64,
        max_wait_ms: float = 5.0,
        max_queue: int = 256,
        bucket_of: Callable[[list[Any]], Sequence[int]] | None = None,
        rows: int = 0,
    ) -> None:
        self.score, self.max_items = score, max_items
        self.bucket_of, self.rows = (bucket_of, rows) if rows > 0 else (None, max_items)
        self.max_wait = max_wait_ms / 1000
        self.max_queue = max_queue
        self.stats = BatchStats()
        self.waiting = 0  # requests admitted whose texts have not begun to be scored
        self._pending: dict[int, list[_Part]] = {}  # each bucket's parts, in `order`
        self._served: dict[int, float] = {}  # when each bucket last went into a call
        self._arrived: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._seq = itertools.count()
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="score")
        self._seconds_per_item: float | None = None  # measured over the last calls
        self._recent: collections.deque[tuple[int, float]] = collections.deque(maxlen=RECENT)

    @property
    def queued_texts(self) -> int:
        return sum(len(parts) for parts in self._pending.values())

    async def start(self) -> None:
        self._arrived = asyncio.Event()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.pool.shutdown(wait=True)

    def retry_after(self) -> int:
        """Seconds until the texts waiting now have been scored at the rate the last `RECENT`
        calls scored theirs, all their seconds over all their texts (a call padded around a
        lone text counts as one text's worth, not as the rate; at least 1 s; before any call,
        one second per `max_items` texts)."""
        rate = self._seconds_per_item or 1 / self.max_items
        return max(1, math.ceil(self.queued_texts * rate))

    async def submit(self, items: Sequence[Any]) -> np.ndarray:
        """The scores of `items`, scored in a batch with whatever else is waiting.

        Raises:
          Overloaded: `max_queue` requests are already waiting.
          Exception: whatever scoring one of this request's calls raised.
        """
        assert self._arrived is not None, "Batcher.start() first"
        if self.waiting >= self.max_queue:  # counted before any await: the bound holds
            self.stats.refused += 1
            raise Overloaded(self.retry_after())
        self.waiting += 1
        self.stats.peak_waiting = max(self.stats.peak_waiting, self.waiting)
        loop = asyncio.get_running_loop()
        job = _Job(list(items), loop.create_future(), next(self._seq))
        job.results, job.left = [None] * len(job.items), len(job.items)
        try:
            if self.bucket_of:  # tokenized off the event loop
                buckets = await loop.run_in_executor(None, self.bucket_of, job.items)
            else:
                buckets = [0] * len(job.items)
            ranks: dict[int, int] = {}
            for i, bucket in enumerate(buckets):
                rank = ranks[int(bucket)] = ranks.get(int(bucket), -1) + 1
                bisect.insort(
                    self._pending.setdefault(int(bucket), []),
                    _Part(job, i, (rank, job.seq)),
                    key=lambda p: p.order,
                )
            self._arrived.set()
            return await job.future
        finally:
            self._started(job)  # answered, failed or gone before a call took it

    def _started(self, job: _Job) -> None:
        if job.waiting:
            job.waiting = False
            self.waiting -= 1

    async def _run(self) -> None:
        """A bucket whose oldest text has waited `STARVE` waits first, whatever else is full;
        then whole calls of a bucket as soon as it fills them; a bucket's remainder once its
        oldest text has waited `max_wait`, in a call of its own."""
        assert self._arrived is not None
        loop = asyncio.get_running_loop()
        while True:
            self._drop_gone()
            if not self._pending:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            starved = self._starved()
            parts = self._take(starved, self.max_items) if starved is not None else []
            parts = parts or self._whole_calls()
            if not parts:
                bucket, wait = self._next_partial()
                if wait > 0:
                    self._arrived.clear()
                    try:
                        await asyncio.wait_for(self._arrived.wait(), wait)
                    except TimeoutError:
                        pass
                    continue
                parts = self._take(bucket, self.max_items)
            await self._score_parts(loop, parts)

    def _drop_gone(self) -> None:
        """Leaves out the texts of requests already answered (a client that went away, or a
        request one of whose calls failed)."""
        for bucket in list(self._pending):
            kept = [p for p in self._pending[bucket] if not p.job.future.done()]
            if kept:
                self._pending[bucket] = kept
            else:
                del self._pending[bucket]

    def _take(self, bucket: int, n: int) -> list[_Part]:
        self._served[bucket] = time.perf_counter()
        parts = self._pending[bucket]
        taken, rest = parts[:n], parts[n:]
        if rest:
            self._pending[bucket] = rest
        else:
            del self._pending[bucket]
        return taken

    def _starved(self) -> int | None:
        """The bucket whose oldest text has waited `STARVE` times `max_wait` since it arrived
        or since the bucket last went, the longest waiting of such (None: none has). It goes
        before any full bucket: otherwise a stream of full calls of one length (a batch of
        many sentences) held every other length back for as long as it lasted. Counting from
        a bucket's last call takes late buckets in turn, one call each."""
        now, limit = time.perf_counter(), STARVE * self.max_wait
        waited = {
            b: now - max(min(p.job.queued for p in w), self._served.get(b, 0.0))
            for b, w in self._pending.items()
        }
        late = [b for b, t in waited.items() if t >= limit]
        return max(late, key=waited.__getitem__) if late else None

    def _next_partial(self) -> tuple[int, float]:
        """The bucket whose remainder goes next, and how long until it is due. Of the buckets
        whose oldest text has waited `max_wait`, the fullest (the call least padded) goes
        first (one that has waited `STARVE` times as long went before, `_starved`). While a
        call runs, texts gather, so under load a remainder grows before it goes."""
        now = time.perf_counter()
        waited = {b: now - min(p.job.queued for p in w) for b, w in self._pending.items()}
        oldest = max(waited, key=waited.__getitem__)
        due = [b for b, t in waited.items() if t >= self.max_wait]
        if not due:
            return oldest, self.max_wait - waited[oldest]
        return max(due, key=lambda b: len(self._pending[b])), 0.0

    def _whole_calls(self) -> list[_Part]:
        """The texts of every bucket that fills whole calls (at most `max_items` in all, at
        least one call), taken out of the buckets."""
        out: list[_Part] = []
        for bucket in list(self._pending):
            room = max(self.rows, (self.max_items - len(out)) // self.rows * self.rows)
            n = min(len(self._pending[bucket]) // self.rows * self.rows, room)
            if n:
                out += self._take(bucket, n)
            if len(out) >= self.max_items:
                break
        return out

    async def _score_parts(self, loop: asyncio.AbstractEventLoop, parts: list[_Part]) -> None:
        for p in parts:
            self._started(p.job)
        items = [p.job.items[p.index] for p in parts]
        try:
            scores = await self._scored(loop, items)
        except Exception as e:  # noqa: BLE001 - the call's requests fail, the server goes on
            for p in parts:
                if not p.job.future.done():
                    p.job.future.set_exception(e)
            return
        for p, row in zip(parts, scores, strict=True):
            p.job.results[p.index] = row
            p.job.left -= 1
            if not p.job.left and not p.job.future.done():
                p.job.future.set_result(np.stack(p.job.results))

    async def _scored(self, loop: asyncio.AbstractEventLoop, items: list[Any]) -> np.ndarray:
        """`score(items)` in the scoring thread, counted in the stats (a failure too)."""
        t0 = time.perf_counter()
        try:
            scores = await loop.run_in_executor(self.pool, self.score, items)
        except Exception:
            self.stats.failed_batches += 1
            raise
        self._recent.append((len(items), time.perf_counter() - t0))
        self._seconds_per_item = sum(s for _, s in self._recent) / sum(n for n, _ in self._recent)
        self.stats.batches += 1
        self.stats.items += len(items)
        self.stats.last_sizes = (self.stats.last_sizes + [len(items)])[-100:]
        return scores
