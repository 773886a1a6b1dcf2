"""One row of the real-data epoch benchmark in one process: train MiniLM (6 x 384, bf16) on
one epoch of the real Jigsaw comments as one kind of batching feeds them, print one JSON line.

`python -m benchmarks.training.epoch --framework jaxtpu --parallel jit --devices 2
--steps-per-call 8 --sharding fsdp --batching bucketed --max-len 128`

Batching (all from `jaxtpu.core.data.buckets.Batcher`, the batch builder of both sides):
  padded    every batch at --max-len (jaxtpu's `--buckets none`)
  bucketed  length buckets chosen by `--buckets auto`, each batch cut to its bucket's edge
  random    the padded run's random batches, each cut to its own longest comment: dynamic
            padding, what a PyTorch user does with HF's DataCollatorWithPadding
Frameworks: jaxtpu (jit / pmap / shard_map on --devices virtual devices, the input thread of
the training loop) and plain PyTorch on the CPU (eager, compile: torch.compile), bf16
autocast, batches built inline.

The row trains on the whole of epoch 0 (or its first --num-batches batches), blocking on every
device call. jaxtpu first compiles a program for every sequence length of the epoch, as
`jaxtpu.train` does (`compile_s`), then runs every call of the epoch. PyTorch first runs one
untimed step of each length (its excess over that length's median step is `compile_s`:
torch.compile's compilation, or eager's first-call set-up), then runs the epoch. The epoch
time is compile_s + the timed steps (with --num-batches, the steps are projected to the
whole epoch from each length's mean).

Host memory (`--huge-pages`): `auto` runs each framework as its own command does: jaxtpu's
commands restart themselves with glibc's malloc on transparent huge pages
(`jaxtpu.core.hostmem`), a plain PyTorch process does not; `on` / `off` choose for the row.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.training.worker import (
    WORKLOADS,
    add_huge_pages_flag,
    jax_backend,
    restart_for_huge_pages,
    torch_cpu_trainer,
)
from jaxtpu.core import hostmem
from jaxtpu.core.data import readers, tokenized
from jaxtpu.core.data.buckets import Batcher, Rows, choose_edges, real_lengths
from jaxtpu.core.data.tokens import load_tokenizer
from jaxtpu.core.flags.presets import tiny
from jaxtpu.core.flags.schema import SHARDINGS
from jaxtpu.core.hf.encoder import packaged_minilm_dir
from parity_tests.checks import REAL_CSV

BATCHINGS = ("padded", "bucketed", "random")


def epoch_batches(kind: str, lengths: np.ndarray, gb: int, max_len: int, k: int = 1) -> list[Rows]:
    """Epoch 0's batches (seed 0) of one batching (buckets grouped k at a time)."""
    edges = choose_edges(lengths, max_len) if kind == "bucketed" else None
    batcher = Batcher(lengths, gb, max_len, edges, group=k)
    out = list(batcher.epoch(0, seed=0))
    if kind == "random":
        out = [Rows(b.idx, b.weight, int(lengths[b.idx].max())) for b in out]
    return out


def sample(epoch: list[Rows], n: int, k: int, batching: str) -> list[Rows]:
    """About n batches of the epoch (n <= 0: all of it), in epoch order. Bucketed: each
    length's first batches in
    proportion to its share of the epoch (at least one call of k), so every bucket is measured;
    otherwise the first n (random order: a fair sample)."""
    if n <= 0 or n >= len(epoch):
        return epoch
    if batching != "bucketed":
        return epoch[:n]
    lengths = [b.length for b in epoch]
    quota = {}
    for length in set(lengths):
        share = lengths.count(length) * n / len(epoch)
        quota[length] = max(k, int(np.ceil(share / k)) * k)
    out = []
    for b in epoch:
        if quota[b.length] > 0:
            out.append(b)
            quota[b.length] -= 1
    return out


def jax_runner(args: argparse.Namespace, cfg: Any, examples: tokenized.Examples):
    """(prepare, step, compiles, prefetch, precompile): one jaxtpu device call of K stacked
    batches; precompile(calls) builds the program of every length among `calls`. Called a
    second time (--compile-cache warm) it makes a new backend whose programs come from the
    persistent cache the first one filled."""
    import jax

    if args.compile_cache == "cold":  # every program compiled here, whatever the environment
        jax.config.update("jax_enable_compilation_cache", False)
    elif not jax.config.jax_compilation_cache_dir:  # a fresh cache, this process's only
        cache = tempfile.mkdtemp(prefix="epoch-xla-")
        atexit.register(shutil.rmtree, cache, True)
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    backend = jax_backend(cfg, args.parallel, args.devices, args.max_len, args.steps_per_call)

    def prepare(call: list[Rows]) -> Any:
        return backend.prepare([examples.take(b.idx, b.weight, b.length) for b in call])

    def step(prepared: Any) -> None:
        backend.fetch(backend.train_steps(prepared))

    def precompile(calls: list[list[Rows]]) -> None:
        first = {c[0].length: c[0] for c in calls}  # one call of each length
        backend.precompile([[examples.take(b.idx, b.weight, b.length)] for b in first.values()], [])

    return prepare, step, backend.compile_count, True, precompile


def torch_runner(args: argparse.Namespace, cfg: Any, examples: tokenized.Examples):
    """(prepare, step, compiles, prefetch): plain PyTorch on the CPU, one batch per call."""
    import torch

    train = torch_cpu_trainer(cfg, args.parallel == "compile", "bf16")

    def prepare(call: list[Rows]) -> dict[str, Any]:
        (b,) = call
        return {k: torch.from_numpy(v) for k, v in examples.take(b.idx, b.weight, b.length).items()}

    def step(batch: dict[str, Any]) -> None:
        float(train(batch)[0])  # blocks on the loss

    def compiles() -> int:
        if args.parallel != "compile":
            return 0
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])

    return prepare, step, compiles, False, None


def calls_of(batches: list[Rows], k: int) -> list[list[Rows]]:
    """Consecutive batches of one length, up to k per device call (as the loop groups them)."""
    calls: list[list[Rows]] = []
    for b in batches:
        if calls and len(calls[-1]) < k and calls[-1][-1].length == b.length:
            calls[-1].append(b)
        else:
            calls.append([b])
    return calls


def timed(calls: list[list[Rows]], prepare: Any, step: Any, prefetch: bool):
    """Per-call seconds (blocking on each) and the total wait for input."""
    from jaxtpu.core.run.prefetch import Prefetch

    times, wait = [], 0.0
    if prefetch:  # jaxtpu's input thread, as in the training loop
        with Prefetch(prepare(c) for c in calls) as feed:
            for prepared in feed:
                t = time.perf_counter()
                step(prepared)
                times.append(time.perf_counter() - t)
            return times, feed.wait_s
    for c in calls:  # built inline, as a plain PyTorch loop does
        t = time.perf_counter()
        prepared = prepare(c)
        t_built = time.perf_counter()
        step(prepared)
        wait += t_built - t
        times.append(time.perf_counter() - t_built)
    return times, wait


MAX_WARM_SHAPES = 6


def _cpu_s() -> float:
    """CPU seconds (user + system) this process has used so far, all threads."""
    t = os.times()
    return t.user + t.system


def projected_steady(
    calls: list[list[Rows]], times: list[float], epoch: list[Rows], batching: str
) -> float:
    """Steady seconds of the whole epoch. Bucketed: each length's measured seconds per batch x
    the epoch's batches of that length (the sample must hold every bucket); otherwise the
    sample's mean seconds per batch x the epoch's batches (random batches: a fair sample)."""
    if batching != "bucketed":
        return sum(times) / sum(len(c) for c in calls) * len(epoch)
    per: dict[int | None, list[float]] = {}
    for c, t in zip(calls, times, strict=True):
        per.setdefault(c[0].length, []).extend([t / len(c)] * len(c))
    need = {b.length for b in epoch}
    if not need <= set(per):
        missing = sorted(x for x in need - set(per) if x is not None)
        raise SystemExit(f"the sample holds no batch of length {missing}: raise --num-batches")
    return sum(float(np.mean(per[b.length])) for b in epoch)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training.epoch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--framework", choices=("jaxtpu", "torch"), default="jaxtpu")
    p.add_argument(
        "--parallel", default="jit", help="jit|pmap|shard_map (jaxtpu), eager|compile (torch)"
    )
    p.add_argument("--batching", choices=BATCHINGS, default="bucketed")
    p.add_argument("--max-len", type=int, default=128, help="tokens per comment at most")
    p.add_argument("--workload", choices=list(WORKLOADS), default="minilm", help="model shape")
    p.add_argument(
        "--num-batches",
        type=int,
        default=0,
        help="batches of the epoch to run (0, the default: all of them)",
    )
    p.add_argument("--batch", type=int, default=32, help="global batch")
    p.add_argument("--devices", type=int, default=8, help="jaxtpu: virtual devices")
    p.add_argument(
        "--steps-per-call",
        type=int,
        default=1,
        help="jaxtpu: up to K batches of one length per device call (lax.scan)",
    )
    p.add_argument(
        "--sharding",
        choices=SHARDINGS,
        default="auto",
        help="jaxtpu jit: where the fp32 state lives (jaxtpu.train's --sharding)",
    )
    p.add_argument(
        "--compile-cache",
        choices=("cold", "warm"),
        default="cold",
        help="jaxtpu: cold (the default) compiles every program; warm first fills a fresh "
        "persistent compilation cache untimed, then times loading the programs from it, as "
        "a second jaxtpu.train run of the same configuration does",
    )
    add_huge_pages_flag(p)
    p.add_argument("--csv", default=str(REAL_CSV), help="the real comments")
    return p


def _config(args: argparse.Namespace) -> Any:
    """The run both frameworks time: the tiny preset's shape at the workload's size, bf16,
    dropout and AdamW as a fine-tuning run has them (the strategy: jaxtpu's alone)."""
    return tiny().replace(
        model_dir="",
        **WORKLOADS[args.workload],
        precision="bf16",
        num_devices=args.devices,
        batch_size=args.batch // args.devices,
        max_len=args.max_len,
        dropout=0.1,
        encoder_dropout=0.1,
        lr=5e-5,
        weight_decay=0.01,
        schedule="linear",
        **(
            {"sharding": args.sharding, "parallel": args.parallel}
            if args.framework == "jaxtpu"
            else {}
        ),
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if not Path(args.csv).exists():
        p.error(f"--csv {args.csv}: not found (see ../shared/data/SOURCES.md)")
    comments = readers.read_comments(args.csv)
    examples = tokenized.encode(comments, load_tokenizer(packaged_minilm_dir()), args.max_len)
    lengths = real_lengths(examples.attention_mask)
    k = args.steps_per_call if args.framework == "jaxtpu" else 1
    batches = epoch_batches(args.batching, lengths, args.batch, args.max_len, k)
    run = sample(batches, args.num_batches, k, args.batching)
    cfg = _config(args)
    runner = jax_runner if args.framework == "jaxtpu" else torch_runner
    prepare, step, compiles, prefetch, precompile = runner(args, cfg, examples)
    calls = calls_of(run, k)
    shape = lambda c: (c[0].length or args.max_len, len(c))  # noqa: E731
    warm: dict[Any, float] = {}
    compile_s = 0.0
    if precompile is not None and args.compile_cache == "warm":
        precompile(calls)  # untimed: fills the cache, as a first run would
        prepare, step, compiles, prefetch, precompile = runner(args, cfg, examples)
    if precompile is not None:  # jaxtpu: every length's program, before the first step
        t = time.perf_counter()
        precompile(calls)
        compile_s = time.perf_counter() - t
    else:  # one untimed step of each length first; its excess over the median: compile_s
        for c in calls:
            if shape(c) not in warm and len(warm) < MAX_WARM_SHAPES:
                t = time.perf_counter()
                step(prepare(c))
                warm[shape(c)] = time.perf_counter() - t
    t0, cpu0 = time.perf_counter(), _cpu_s()
    times, wait = timed(calls, prepare, step, prefetch)
    wall, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    by_shape: dict[Any, list[float]] = {}
    for c, t in zip(calls, times, strict=True):
        by_shape.setdefault(shape(c), []).append(t)
    compile_s += sum(max(w - float(np.median(by_shape[s])), 0.0) for s, w in warm.items())
    steady = sum(times)
    # token counts of the whole epoch (the sample may over-represent a bucket)
    real = int(sum(lengths[b.idx[b.weight > 0]].sum() for b in batches))
    computed = sum(args.batch * (b.length or args.max_len) for b in batches)
    epoch_steady = projected_steady(calls, times, batches, args.batching)
    record = {
        "framework": args.framework,
        "parallel": args.parallel,
        "batching": args.batching,
        "workload": args.workload,
        "steps_per_call": k,
        "devices": args.devices if args.framework == "jaxtpu" else 1,
        "sharding": args.sharding if args.framework == "jaxtpu" else None,
        "huge_pages": hostmem.active(),
        "compile_cache": args.compile_cache if args.framework == "jaxtpu" else None,
        "max_len": args.max_len,
        "batch": args.batch,
        "batches": len(run),
        "epoch_batches": len(batches),
        "lengths": len({c[0].length for c in calls}),
        "compiles": compiles(),
        "timed_s": wall,
        "compile_s": compile_s,
        "steady_s": steady,
        "epoch_steady_s": epoch_steady,
        "epoch_s": compile_s + epoch_steady,
        "real_tokens_per_s": real / epoch_steady,
        "padded_share": 1 - real / computed,
        "data_wait_share": wait / max(wall, 1e-9),
        # CPU cores busy while the epoch ran (this process's CPU seconds / wall seconds): near
        # os.cpu_count() means compilation overlapped with training would only take turns
        "steady_cpu_cores": cpu / max(wall, 1e-9),
        "cpu_count": os.cpu_count(),
        "tokens_vs_full_padding": computed / (args.batch * args.max_len * len(batches)),
        "s_per_batch": {
            f"{n}": float(np.mean(t)) / kk for (n, kk), t in by_shape.items() if kk == k
        },
    }
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    restart_for_huge_pages(parser().parse_args())
    sys.exit(main())
