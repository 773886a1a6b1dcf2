"""Dynamic batching: the texts of concurrent requests scored together, in one call of the
model, up to `max_items` texts or `max_wait_ms` after the first arrived, whichever comes first.

A request's texts (its comment, and each sentence when it asks for spans) go into one queue of
at most `max_queue` requests: one more is refused at once (`Overloaded`, the server's 429 with
Retry-After), so memory and latency stay bounded under a flood. The model runs in one thread
beside the event loop (a device is driven by one caller at a time), while the loop keeps
reading requests. A batch whose scoring fails fails its own requests only; the next batch is
scored as if nothing happened. A text's score does not depend on the batch it shares
(`jaxtpu.engine.scoring.Scorer` pads every call to one shape and groups texts by fixed length
buckets), so batching changes latency, never a score.

For a model that pads every call to `rows` texts of one length bucket (the JAX backend), the
texts are grouped by bucket (`bucket_of`): a bucket is scored as soon as it fills whole calls,
and what is left of it waits at most `max_wait_ms` (from its oldest text) for more texts of
its length, then goes as it is. Under load every call is then full, as offline scoring's are;
a request whose texts fall in several buckets is answered when the last of them is scored.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# a bucket's remainder is never held back for fuller ones longer than this many waits
STARVE = 20


class Overloaded(Exception):
    """The queue is full: the request is refused, to be retried after `retry_after` s."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"the server is at capacity; retry after {retry_after} s")
        self.retry_after = retry_after


@dataclass
class _Job:
    items: list[Any]
    future: asyncio.Future
    queued: float = field(default_factory=time.perf_counter)
    buckets: Sequence[int] = ()  # each item's length bucket (grouped batching)
    results: list[Any] = field(default_factory=list)
    left: int = 0


@dataclass
class _Part:
    """One item of a job, waiting in its bucket."""

    job: _Job
    index: int


@dataclass
class BatchStats:
    """What the batcher has done, for /metrics."""

    batches: int = 0
    items: int = 0
    failed_batches: int = 0
    refused: int = 0
    last_sizes: list[int] = field(default_factory=list)


class Batcher:
    """Scores lists of items with `score(items) -> (N, ...) array`, batching concurrent calls.

    Args:
      score: the model's scoring function (blocking; run in one worker thread).
      max_items: texts per model call at most (a request is never split: one larger than this
        is scored alone).
      max_wait_ms: how long the first request of a batch waits for others.
      max_queue: requests waiting at most; beyond it `submit` raises `Overloaded`.
      bucket_of: each item's length bucket, for a model whose calls are `rows` items of one
        bucket (None: batches in arrival order).
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
        self.bucket_of, self.rows = (bucket_of, rows) if rows > 0 else (None, 0)
        self.max_wait = max_wait_ms / 1000
        self.max_queue = max_queue
        self.stats = BatchStats()
        self._queue: asyncio.Queue[_Job] | None = None
        self._task: asyncio.Task | None = None
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="score")
        self._seconds_per_item = 0.01

    @property
    def waiting(self) -> int:
        return self._queue.qsize() if self._queue else 0

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._run_grouped() if self.bucket_of else self._run())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.pool.shutdown(wait=True)

    def retry_after(self) -> int:
        """Seconds until the queue has likely drained (at least 1)."""
        backlog = self.waiting * max(1, self.max_items // 4)
        return max(1, int(np.ceil(backlog * self._seconds_per_item)))

    async def submit(self, items: Sequence[Any]) -> np.ndarray:
        """The scores of `items`, scored in a batch with whatever else is waiting.

        Raises:
          Overloaded: `max_queue` requests are already waiting.
          Exception: whatever scoring this request's batch raised.
        """
        assert self._queue is not None, "Batcher.start() first"
        if self._queue.qsize() >= self.max_queue:
            self.stats.refused += 1
            raise Overloaded(self.retry_after())
        loop = asyncio.get_running_loop()
        job = _Job(list(items), loop.create_future())
        if self.bucket_of:  # tokenized off the event loop
            job.buckets = await loop.run_in_executor(None, self.bucket_of, job.items)
            job.results, job.left = [None] * len(job.items), len(job.items)
        await self._queue.put(job)
        return await job.future

    async def _run(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            jobs = [await self._queue.get()]
            size = len(jobs[0].items)
            deadline = time.perf_counter() + self.max_wait
            while size < self.max_items:
                left = deadline - time.perf_counter()
                if left <= 0 and self._queue.empty():
                    break
                try:
                    job = (
                        self._queue.get_nowait()
                        if not self._queue.empty()
                        else await asyncio.wait_for(self._queue.get(), left)
                    )
                except TimeoutError:
                    break
                if size + len(job.items) > self.max_items:
                    await self._requeue_first(job)
                    break
                jobs.append(job)
                size += len(job.items)
            jobs = [j for j in jobs if not j.future.cancelled()]  # clients that went away
            if jobs:
                await self._score(loop, jobs)

    async def _run_grouped(self) -> None:
        """Whole calls of one bucket as soon as a bucket fills them; a bucket's remainder
        once its oldest item has waited `max_wait`, in a call of its own."""
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        pending: dict[int, list[_Part]] = {}  # each bucket's items, oldest first
        while True:
            if not pending:
                self._take(await self._queue.get(), pending)
            while not self._queue.empty():
                self._take(self._queue.get_nowait(), pending)
            parts = self._whole_calls(pending)
            if not parts:
                bucket, wait = self._next_partial(pending)
                if wait > 0:
                    try:
                        self._take(await asyncio.wait_for(self._queue.get(), wait), pending)
                    except TimeoutError:
                        pass
                    continue
                parts = pending.pop(bucket)
            parts = [p for p in parts if not p.job.future.done()]  # gone, or failed already
            if parts:
                await self._score_parts(loop, parts)

    def _next_partial(self, pending: dict[int, list[_Part]]) -> tuple[int, float]:
        """The bucket whose remainder goes next, and how long until it is due. Of the buckets
        whose oldest item has waited `max_wait`, the fullest (the call least padded) goes
        first, unless one has waited `STARVE` times as long: then the oldest. While a call
        runs, items gather, so under load a remainder grows before it goes."""
        now = time.perf_counter()
        waited = {b: now - w[0].job.queued for b, w in pending.items()}
        oldest = max(waited, key=waited.__getitem__)
        if waited[oldest] >= STARVE * self.max_wait:
            return oldest, 0.0
        due = [b for b, t in waited.items() if t >= self.max_wait]
        if not due:
            return oldest, self.max_wait - waited[oldest]
        return max(due, key=lambda b: len(pending[b])), 0.0

    @staticmethod
    def _take(job: _Job, pending: dict[int, list[_Part]]) -> None:
        for i, bucket in enumerate(job.buckets):
            pending.setdefault(int(bucket), []).append(_Part(job, i))

    def _whole_calls(self, pending: dict[int, list[_Part]]) -> list[_Part]:
        """The items of every bucket that fills whole calls (at most `max_items` in all,
        at least one call), taken out of `pending`."""
        out: list[_Part] = []
        for bucket in list(pending):
            waiting = pending[bucket]
            room = max(self.rows, (self.max_items - len(out)) // self.rows * self.rows)
            n = min(len(waiting) // self.rows * self.rows, room)
            if n:
                out += waiting[:n]
                if waiting[n:]:
                    pending[bucket] = waiting[n:]
                else:
                    del pending[bucket]
            if len(out) >= self.max_items:
                break
        return out

    async def _score_parts(self, loop: asyncio.AbstractEventLoop, parts: list[_Part]) -> None:
        items = [p.job.items[p.index] for p in parts]
        try:
            scores = await self._scored(loop, items)
        except Exception as e:  # noqa: BLE001 - the batch's requests fail, the server goes on
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
        took = time.perf_counter() - t0
        self._seconds_per_item = 0.8 * self._seconds_per_item + 0.2 * took / max(1, len(items))
        self.stats.batches += 1
        self.stats.items += len(items)
        self.stats.last_sizes = (self.stats.last_sizes + [len(items)])[-100:]
        return scores

    async def _requeue_first(self, job: _Job) -> None:
        """Puts `job` back at the head of the queue (it starts the next batch)."""
        assert self._queue is not None
        rest = []
        while not self._queue.empty():
            rest.append(self._queue.get_nowait())
        for j in [job, *rest]:
            self._queue.put_nowait(j)

    async def _score(self, loop: asyncio.AbstractEventLoop, jobs: list[_Job]) -> None:
        items = [x for j in jobs for x in j.items]
        try:
            scores = await self._scored(loop, items)
        except Exception as e:  # noqa: BLE001 - the batch's requests fail, the server goes on
            for j in jobs:
                if not j.future.done():
                    j.future.set_exception(e)
            return
        start = 0
        for j in jobs:
            part = scores[start : start + len(j.items)]
            start += len(j.items)
            if not j.future.done():
                j.future.set_result(part)
