"""`jaxtpu.serve.batcher` grouping texts by length bucket for a model whose every call is
`rows` texts of one bucket (the JAX backend): whole calls of one bucket as soon as a bucket
fills them, the rest after `max_wait_ms`, every request answered with its own rows (one whose
texts fall in several buckets too), a failing call failing only the requests it held."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from jaxtpu.serve.batcher import Batcher


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
    assert b.bucket_of is None and b.rows == 0
