"""Length buckets: the edges `auto` picks, the batches drawn within buckets, that a comment
scores the same at its bucket's length as at full padding, and one compilation per bucket."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from jaxtpu.core.data import buckets, pairing, readers, tokenized
from jaxtpu.core.errors import ConfigError
from jaxtpu.core.flags.presets import tiny
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.run import loop, prefetch
from jaxtpu.core.run.plan import Job, Plan, schedule


def skewed_lengths(n: int = 997, max_len: int = 128, seed: int = 0) -> np.ndarray:
    """Token lengths shaped like real comments: many short, a long tail cut at max_len."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(3.8, 0.8, n).astype(np.int64), 3, max_len)


def test_auto_edges_are_the_cheapest_of_every_choice_of_that_many():
    lengths, max_len = skewed_lengths(400, 128), 128
    edges = buckets.choose_edges(lengths, max_len, max_buckets=3)
    cost = buckets.tokens_computed(lengths, edges, max_len)
    cands = buckets._candidates(max_len)
    top = int(cands[np.searchsorted(cands, lengths.max())])
    brute = min(
        buckets.tokens_computed(lengths, (*inner, top), max_len)
        for k in range(len(edges))
        for inner in itertools.combinations([c for c in cands if c < top], k)
    )
    assert cost == brute
    assert edges[-1] == top and all(e % 8 == 0 or e == max_len for e in edges)
    assert cost < 0.75 * lengths.size * max_len  # far fewer tokens than full padding


def test_auto_keeps_one_bucket_when_more_would_not_pay():
    lengths = np.full(300, 20)
    assert buckets.choose_edges(lengths, 128) == (24,)
    assert buckets.choose_edges(np.full(300, 128), 128) == (128,)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("64,32", "strictly ascending"),
        ("32,256", "edges must be in 1..--max-len 128"),
        ("short", "expected auto, none or ascending"),
    ],
)
def test_bad_bucket_specs_are_refused_by_name(spec, message):
    with pytest.raises(ConfigError, match=message):
        tiny().replace(buckets=spec, max_len=128)


@pytest.mark.parametrize("k", [1, 3])
def test_bucketed_epoch_trains_every_example_once_in_interleaved_seeded_batches(k):
    lengths, gb, max_len = skewed_lengths(), 32, 128
    b = buckets.Batcher(lengths, gb, max_len, buckets.choose_edges(lengths, max_len), group=k)
    assert len(b.edges) > 1
    epoch = list(b.epoch(0, seed=3))
    assert len(epoch) == b.steps_per_epoch() == -(-lengths.size // gb)
    real = np.concatenate([x.idx[x.weight > 0] for x in epoch])
    assert sorted(real.tolist()) == list(range(lengths.size))  # each example exactly once
    for x in epoch:
        assert x.idx.shape == (gb,) and lengths[x.idx].max() <= x.length
    seq = [x.length for x in epoch]
    assert seq != sorted(seq) and seq != sorted(seq, reverse=True)  # buckets interleave
    runs = [len(list(g)) for _, g in itertools.groupby(seq)]
    assert all(
        r % k == 0 for r in runs[: -len(b.edges)]
    )  # the remainders run last  # K batches of one length per device call
    again = list(b.epoch(0, seed=3))
    assert all(np.array_equal(x.idx, y.idx) for x, y in zip(epoch, again, strict=True))
    other = list(b.epoch(1, seed=3))
    assert not all(np.array_equal(x.idx, y.idx) for x, y in zip(epoch, other, strict=True))
    tail = list(b.epoch(0, seed=3, start_step=5))  # resume mid-epoch: the same sequence
    assert all(np.array_equal(x.idx, y.idx) for x, y in zip(epoch[5:], tail, strict=True))


def test_bucketed_eval_covers_every_example_once_at_its_bucket():
    lengths = skewed_lengths(203)
    b = buckets.Batcher(lengths, 16, 128, (32, 64))  # longer ones go to --max-len
    seen = []
    for x in b.eval_batches(lengths):
        assert lengths[x.idx].max() <= x.length and x.length in (32, 64, 128)
        seen += x.idx[x.weight > 0].tolist()
    assert sorted(seen) == list(range(203))


def test_schedule_never_mixes_lengths_in_one_call():
    lengths = skewed_lengths(40 * 8)
    b = buckets.Batcher(lengths, 8, 128, buckets.choose_edges(lengths, 128), group=4)
    plan = Plan(lengths.size, 8, b.steps_per_epoch(), b.steps_per_epoch(), 1, b)
    cfg = tiny().replace(steps_per_call=4, log_every=8)
    calls = list(schedule(plan, cfg, 0))
    assert sum(len(c.batches) for c in calls) == plan.total
    assert all(len({x.length for x in c.batches}) == 1 for c in calls if c.batches)


# --------------------------------------------------------------------------- with a model


@pytest.fixture(scope="module")
def comments(real_csv, tokenizer):
    """60 real comments of varied lengths, tokenized at 64."""
    data = readers.read_comments(real_csv).subset(np.arange(60))
    return data, tokenizer


@pytest.mark.model
@pytest.mark.parametrize("task", ["toxicity", "ranking"])
def test_scores_at_bucket_length_equal_scores_at_full_padding(comments, task):
    """fp32: the same logits (within 1e-5) whether a comment is cut to its bucket or padded
    to --max-len; evaluation in buckets scores every example once, in its place."""
    import jax
    import optax

    from jaxtpu.core.tasks import get_task
    from jaxtpu.engine import parallel, steps, weights
    from jaxtpu.engine.backend import JaxBackend

    data, tokenizer = comments
    if task == "ranking":
        data = pairing.pairs_from_labels(data, 40, 0)
    examples = tokenized.encode(data, tokenizer, 64)
    cfg = tiny().replace(task=task, max_len=64, precision="fp32")
    model = weights.load_model(cfg, RunSpec.resolve(cfg))
    lengths = buckets.real_lengths(examples.attention_mask)
    assert lengths.min() < 32 < lengths.max()  # varied: several buckets in use
    state = steps.TrainState.create(
        apply_fn=model.module.apply, params=model.params, tx=optax.identity()
    )
    devices = jax.devices()[:8]
    backend = JaxBackend(parallel.make_strategy("jit", devices, steps.for_task(task)), state, 0)
    backend.start()
    padded = buckets.Batcher(lengths, 16, 64)
    cut = buckets.Batcher(lengths, 16, 64, (16, 24, 32, 48))
    m_pad, s_pad = loop.score_examples(backend, examples, padded, get_task(task))
    m_cut, s_cut = loop.score_examples(backend, examples, cut, get_task(task))
    assert len({b.length for b in cut.eval_batches(lengths)}) >= 3
    scale = np.abs(s_pad).max()
    np.testing.assert_allclose(s_cut, s_pad, rtol=0, atol=1e-5 * max(scale, 1.0))
    t = get_task(task)  # the metric is over the examples in their own order, labels aligned
    ones = np.ones(len(examples), np.float32)
    assert m_cut[t.monitor] == pytest.approx(t.metric(s_cut, examples.label, ones)[t.monitor])
    assert m_cut["val_loss"] == pytest.approx(m_pad["val_loss"], rel=1e-5)


@pytest.mark.model
@pytest.mark.parametrize("k", [1, 2])
def test_train_step_compiles_once_per_bucket_length_used(tmp_path, real_csv, k):
    from jaxtpu import train

    cfg = tiny().replace(
        train_csv=str(real_csv),
        max_rows=320,
        max_len=64,
        buckets="auto",
        parallel="jit",
        steps_per_call=k,
        log_every=2 * k,
        epochs=2,
        workdir=str(tmp_path / "run"),
    )
    summary = train.train_and_evaluate(cfg)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_lines = [x for x in lines if x["event"] == "train"]
    assert all(x["data_wait_s"] >= 0 and 0 <= x["data_wait_share"] <= 1 for x in train_lines)
    # what the schedule fed, rebuilt from the same pure functions
    spec = RunSpec.resolve(cfg)
    job = Job.load(cfg, spec, tmp_path / "plan", 8, primary=False, started=0.0)
    shapes = {
        (c.batches[0].length, len(c.batches)) for c in schedule(job.plan, cfg, 0) if c.batches
    }
    lengths = {length for length, _ in shapes}
    assert len(lengths) >= 2
    if k > 1:  # calls of fewer than K batches (a bucket's end) run in the same program
        assert any(n < k for _, n in shapes)
    assert summary["train_compiles"] == len(lengths)  # and never again, over 2 epochs
    assert summary["steps"] == 2 * -(-288 // 32)  # every example once per epoch


def test_prefetch_raises_the_input_threads_error_in_the_loop():
    def items():
        yield 1
        raise ValueError("bad batch")

    with prefetch.Prefetch(items()) as feed:
        got = []
        with pytest.raises(ValueError, match="bad batch"):
            for x in feed:
                got.append(x)
    assert got == [1]


def test_prefetch_stops_its_thread_when_the_loop_stops_early():
    with prefetch.Prefetch(iter(range(10**6)), depth=2) as feed:
        first = next(iter(feed))
    assert first == 0 and not feed._thread.is_alive()


@pytest.mark.model
def test_bucketed_run_cut_and_resumed_reproduces_the_uninterrupted_run(tmp_path):
    from jaxtpu import train
    from jaxtpu.core.errors import UserError

    def cfg(name, **kw):
        flags = {"precision": "fp32", "epochs": 2, "log_every": 1, "buckets": "12,16", **kw}
        return tiny().replace(workdir=str(tmp_path / name), **flags)

    full = train.train_and_evaluate(cfg("full"))
    assert full["train_compiles"] == 2  # both buckets used
    train.train_and_evaluate(cfg("cut", max_steps=11, profile_steps="2:3"))  # stops mid-epoch 1
    assert list((tmp_path / "cut" / "profile").rglob("*.xplane.pb"))  # jax.profiler's trace
    with pytest.raises(UserError, match="groups K batches of a bucket"):
        train.train_and_evaluate(cfg("cut", resume=True, steps_per_call=2, log_every=2))
    resumed = train.train_and_evaluate(cfg("cut", resume=True))
    assert resumed["steps"] == full["steps"]

    def losses(name):
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [(x["step"], x["loss"]) for x in map(json.loads, lines) if x["event"] == "train"]

    a, b = losses("full"), losses("cut")
    assert [s for s, _ in a] == [s for s, _ in b]
    np.testing.assert_allclose([x for _, x in b], [x for _, x in a], rtol=1e-6)
    assert resumed["final"]["val_auc"] == pytest.approx(full["final"]["val_auc"], abs=1e-6)
