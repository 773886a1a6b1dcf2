"""`jaxtpu.serve.batcher` grouping texts by length bucket for a model whose every call is
`rows` texts of one bucket (the JAX backend): whole calls of one bucket as soon as a bucket
fills them, the rest after `max_wait_ms`, every request answered with its own rows (one whose
texts fall in several buckets too), a failing call failing only the requests it held."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from jaxtpu.serve.batcher import Batcher, Overloaded


def _bucket(text: str) -> int:
    return 16 if len(text) < 10 else 32


class Model:
    """Scores a text as its length; records each call's texts; a call holding FAIL fails."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def score(self, items: list[str]) -> np.ndarray:
        self.calls.append(list(items))
        if any("FAIL" in t for t in items):
            raise RuntimeError("this call cannot be scored")
        return np.array([[float(len(t))] for t in items])

    def buckets(self, items: list[str]) -> list[int]:
        return [_bucket(t) for t in items]


def _run(coro):
    return asyncio.run(coro)


def test_whole_calls_of_one_bucket_go_at_once_and_the_rest_after_the_wait():
    model = Model()

    async def main():
        b = Batcher(model.score, 64, max_wait_ms=1000, bucket_of=model.buckets, rows=4)
        await b.start()
        short = [f"s{i}" for i in range(6)]  # bucket 16: one whole call of 4, 2 left
        long = [f"a long comment number {i}" for i in range(3)]  # bucket 32: 3, no call
        t0 = asyncio.get_running_loop().time()
        tasks = [asyncio.create_task(b.submit([t])) for t in short + long]
        done, _ = await asyncio.wait(tasks, timeout=0.5)  # well before the wait ends
        assert len(done) == 4  # the whole call went before the wait
        # four of the short texts (each request's bucket is found off the loop, so
        # concurrent requests may reach the queue in another order than sent)
        assert len(model.calls) == 1 and len(set(model.calls[0]) & set(short)) == 4
        results = await asyncio.gather(*tasks)
        assert asyncio.get_running_loop().time() - t0 >= 0.99  # the rest waited
        await b.stop()
        return results

    results = _run(main())
    assert [float(r[0, 0]) for r in results] == [2.0] * 6 + [23.0] * 3
    assert sorted(map(len, model.calls)) == [2, 3, 4]  # then each bucket's remainder
    assert all(len({_bucket(t) for t in call}) == 1 for call in model.calls)


def test_a_request_across_buckets_gets_its_rows_in_order_and_a_failure_stays_in_its_call():
    model = Model()

    async def main():
        b = Batcher(model.score, 64, max_wait_ms=20, bucket_of=model.buckets, rows=2)
        await b.start()
        mixed = ["one", "a much longer sentence here", "two"]
        first = await asyncio.gather(b.submit(mixed), b.submit(["x", "y"]))
        then = await asyncio.gather(
            b.submit(["a FAIL that is long enough"]), b.submit(["z"]), return_exceptions=True
        )
        await b.stop()
        return first, then

    (mixed, other), (bad, fine) = _run(main())
    assert [float(x) for x in mixed[:, 0]] == [3.0, 27.0, 3.0]
    assert [float(x) for x in other[:, 0]] == [1.0, 1.0]
    assert isinstance(bad, RuntimeError) and [float(x) for x in fine[:, 0]] == [1.0]
    # the failing call held bucket 32's text only; the short request beside it was answered
    failing = next(c for c in model.calls if any("FAIL" in t for t in c))
    assert failing == ["a FAIL that is long enough"]
    assert all(len({_bucket(t) for t in call}) == 1 for call in model.calls)


def test_without_a_bucket_function_batches_go_in_arrival_order():
    model = Model()

    async def main():
        b = Batcher(model.score, 3, max_wait_ms=50)
        await b.start()
        out = await asyncio.gather(*(b.submit([t]) for t in ["a", "a long one here!", "b", "c"]))
        await b.stop()
        return out

    out = _run(main())
    assert [float(r[0, 0]) for r in out] == [1.0, 16.0, 1.0, 1.0]
    assert model.calls[0] == ["a", "a long one here!", "b"]  # mixed lengths: arrival order


@pytest.mark.parametrize("rows", [0, -1])
def test_no_rows_means_no_grouping(rows):
    b = Batcher(Model().score, 8, bucket_of=Model().buckets, rows=rows)
    assert b.bucket_of is None and b.rows == 8  # one bucket, whose whole call is max_items


class Gated(Model):
    """`Model` whose calls wait for `gate` (a threading.Event) to open; `started` holds each
    call's texts as it starts."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.started: list[list[str]] = []

    def score(self, items):
        self.started.append(list(items))
        assert self.gate.wait(10), "the test never opened the gate"
        return super().score(items)


@pytest.mark.parametrize("grouped", [False, True])
def test_a_request_of_many_texts_does_not_hold_back_those_that_arrive_after_it(grouped):
    """Issue 86, item 3: one request of 100 sentences (a span-heavy comment), then five
    ordinary requests while its first call runs: their texts go in the very next call, not
    after all of its calls (before: the long request was one call of 101 texts, or its
    bucket's calls all went first)."""
    model = Gated()

    async def main():
        kw = dict(bucket_of=model.buckets, rows=4) if grouped else {}
        b = Batcher(model.score, 16, max_wait_ms=1, **kw)
        await b.start()
        long = asyncio.create_task(b.submit([f"s{i}" for i in range(100)]))
        while not model.started:  # its first call is running
            await asyncio.sleep(0.001)
        short = [asyncio.create_task(b.submit([f"o{i}"])) for i in range(5)]
        await asyncio.sleep(0.05)  # the ordinary texts are queued behind the running call
        model.gate.set()
        out = await asyncio.gather(long, *short)
        await b.stop()
        return out

    out = _run(main())
    assert [float(x) for x in out[0][:, 0]] == [float(len(f"s{i}")) for i in range(100)]
    assert len(model.calls) >= 7 and all(len(c) <= 16 for c in model.calls)
    second = model.calls[1]
    assert {f"o{i}" for i in range(5)} <= set(second), model.calls[:3]


def test_the_queue_bound_holds_while_texts_are_tokenized_and_retry_after_is_the_drain_time():
    """Issue 86, items 4 and 10: 200 requests at once against max_queue 4, with a slow
    tokenizer (the JAX backend finds each text's bucket off the event loop): never more than
    4 wait (before: every request that arrived while others were tokenized got in), and the
    429s' Retry-After is the measured time to score what waits (before: 16 times it, at the
    default of 64 texts a call)."""
    model = Gated()

    def slow_buckets(items):
        time.sleep(0.002)
        return model.buckets(items)

    async def main():
        b = Batcher(model.score, 64, max_wait_ms=1, max_queue=4, bucket_of=slow_buckets, rows=1)
        await b.start()
        b._seconds_per_item = 0.05  # as if measured: 20 texts a second
        tasks = [asyncio.create_task(b.submit([f"t{i}"])) for i in range(200)]
        await asyncio.sleep(0.3)
        model.gate.set()
        out = await asyncio.gather(*tasks, return_exceptions=True)
        await b.stop()
        return b, out

    b, out = _run(main())
    refused = [r for r in out if isinstance(r, Overloaded)]
    # those the first call took (the gate held it), and at most 4 waiting behind it
    assert len(out) - len(refused) <= len(model.started[0]) + 4, len(refused)
    assert b.stats.peak_waiting <= 4 and b.stats.refused == len(refused)
    assert {r.retry_after for r in refused} == {1}  # at most 4 texts of 0.05 s wait


def test_a_bucket_that_waited_starve_waits_goes_before_other_buckets_full_calls():
    """Issue 95, item 4: a stream of full calls of one length (a batch of one-word sentences)
    held a longer comment back until every full call had gone (24 s behind 100 such calls);
    the bound of `STARVE` waits held only when no bucket was full. Here 40 full calls of short
    texts wait behind a running call while one long text has waited past the bound: it goes in
    one of the next two calls (the short texts' bucket, waiting as long, may go first)."""
    model = Gated()

    async def main():
        b = Batcher(model.score, 4, max_wait_ms=1, bucket_of=model.buckets, rows=4)
        await b.start()
        first = asyncio.create_task(b.submit(["s-first"]))
        while not model.started:
            await asyncio.sleep(0.001)
        many = asyncio.create_task(b.submit([f"s{i}" for i in range(160)]))  # 40 full calls
        long = asyncio.create_task(b.submit(["a long comment, of bucket 32"]))
        await asyncio.sleep(0.05)  # past STARVE (20) waits of 1 ms
        model.gate.set()
        out = await asyncio.gather(first, many, long)
        await b.stop()
        return out

    out = _run(main())
    assert float(out[2][0, 0]) == float(len("a long comment, of bucket 32"))
    assert ["a long comment, of bucket 32"] in model.calls[1:3], model.calls[:4]
