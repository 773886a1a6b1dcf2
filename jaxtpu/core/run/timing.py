"""Where a run's wall time goes, and what the training part of it achieves (framework-free):
the time shares, tokens/s and model-FLOPs utilisation of each `metrics.jsonl` train line, the
progress bar and `summary.json`.

The loop runs on one thread, so its time splits without overlap into compiling (ahead of the
first step, or inside a first call that compiles), evaluating, checkpointing, waiting for the
next call's input (`Prefetch.wait_s`) and the rest, training: dispatching calls and waiting
for the devices. Throughput is counted over training and data waiting, the time the steps
took: evaluation, checkpoints and compilation are apart.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

KINDS = ("compile", "eval", "checkpoint", "data_wait")  # what is not training


@dataclass
class Work:
    """What the training steps did: examples (rows of weight > 0), the tokens up to each
    example's last real token (for a ranking pair, the longer comment's, twice), the tokens
    computed (every row, padding included) and the model's FLOPs of those."""

    examples: int = 0
    real_tokens: int = 0
    computed_tokens: int = 0
    model_flops: float = 0.0

    def add(self, other: Work) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


def batch_work(
    idx: np.ndarray,
    weight: np.ndarray,
    length: int,
    lengths: np.ndarray,
    comments_per_example: int,
    flops: Any,
) -> Work:
    """The `Work` of one global batch: rows `idx` with `weight`, cut to `length` tokens, of
    examples whose real lengths are `lengths`; `flops(comments, seq)` gives the model's
    FLOPs (`EncoderConfig.train_flops`)."""
    real = weight > 0
    rows = len(idx) * comments_per_example
    return Work(
        examples=int(real.sum()),
        real_tokens=int(np.minimum(lengths[idx[real]], length).sum()) * comments_per_example,
        computed_tokens=rows * length,
        model_flops=float(flops(rows, length)),
    )


class Clock:
    """Seconds spent per kind since the start and since the last `interval`, and the work of
    the steps over the same spans.

    Args:
      peak_flops: the bf16 peak FLOP/s of one device (`hardware.peak_flops_per_device`), None
        where it is not known (then no MFU).
      devices: how many devices the run uses (all processes).
    """

    def __init__(self, peak_flops: float | None, devices: int) -> None:
        self.peak = peak_flops * devices if peak_flops else None
        self.spent = dict.fromkeys(KINDS, 0.0)
        self.start = self._mark = time.perf_counter()
        self._spent_at_mark = dict(self.spent)
        self.work, self.total = Work(), Work()

    @contextmanager
    def timing(self, kind: str) -> Iterator[None]:
        """Adds the block's seconds to `kind` (one of `KINDS`)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.spent[kind] += time.perf_counter() - t0

    def waited(self, total: float) -> None:
        """The input thread's total wait so far (`Prefetch.wait_s`)."""
        self.spent["data_wait"] = total

    def did(self, work: Work) -> None:
        self.work.add(work)
        self.total.add(work)

    def interval(self) -> dict[str, Any]:
        """The figures since the last call (or the start), for one metrics line."""
        now = time.perf_counter()
        spent = {k: self.spent[k] - self._spent_at_mark[k] for k in KINDS}
        out = self._figures(now - self._mark, spent, self.work)
        self._mark, self._spent_at_mark, self.work = now, dict(self.spent), Work()
        return out

    def totals(self) -> dict[str, Any]:
        """The figures of the whole loop, for the summary."""
        return self._figures(time.perf_counter() - self.start, dict(self.spent), self.total)

    def _figures(self, wall: float, spent: dict[str, float], work: Work) -> dict[str, Any]:
        wall = max(wall, 1e-9)
        steps = max(wall - spent["compile"] - spent["eval"] - spent["checkpoint"], 1e-9)
        seconds = {"train": max(steps - spent["data_wait"], 0.0), **spent}
        return {
            "wall_s": wall,
            "time_share": {k: v / wall for k, v in seconds.items()},
            "examples_per_s": work.examples / steps,
            "tokens_per_s": work.real_tokens / steps,
            "computed_tokens_per_s": work.computed_tokens / steps,
            "mfu": work.model_flops / (steps * self.peak) if self.peak else None,
        }


def progress_postfix(loss: float, figures: dict[str, Any]) -> dict[str, str]:
    """The progress bar's postfix: the loss and the interval's throughput, MFU where the
    device's peak is known, and the share of time the steps had."""
    out = {
        "loss": f"{loss:.4f}",
        "ex/s": f"{figures['examples_per_s']:,.1f}",
        "tok/s": f"{figures['tokens_per_s']:,.0f}",
    }
    if figures["mfu"] is not None:
        out["mfu"] = f"{figures['mfu']:.1%}"
    out["train"] = f"{figures['time_share']['train']:.0%}"
    return out
