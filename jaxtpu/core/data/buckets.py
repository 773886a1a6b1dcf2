"""Length buckets: which batches a run feeds, and at which sequence length (framework-free).

Every example is tokenized once at `--max-len` (padded on the right). A batch of comments
that are all short does not need those padded columns: with buckets, examples of similar
length are batched together and each batch is cut to its bucket's edge, so a run computes
far fewer padded tokens with only as many compiled shapes as there are buckets.

A `Batcher` is the one builder of every batch both sides feed:
- padded (`--buckets none`): a seeded permutation per epoch, the last partial batch dropped
  (`shuffled_batches`), every batch at full length;
- bucketed (`--buckets auto` or edges): each example goes to the smallest bucket that holds
  its real tokens; within a bucket the examples are shuffled and cut into full global
  batches; what is left of a bucket joins the next longer one; the last remainder is one
  batch padded with weight-0 rows, so every example is trained on exactly once per epoch.
  The order of the batches is shuffled (seeded, per epoch), so buckets interleave. With
  --steps-per-call K, a bucket's batches are grouped K at a time (one device call holds K
  batches of one length); the groups of K are shuffled and each bucket's shorter remainder
  group runs at the end of the epoch.
Everything is a pure function of (data, edges, global batch, seed, epoch): every process of
a multi-host run and both frameworks draw the same batches, and a resumed run continues the
same sequence.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from jaxtpu.core.flags.values import parse_buckets

MAX_AUTO_BUCKETS = 4
EDGE_MULTIPLE = 8  # edges are multiples of 8 (or --max-len): friendly shapes for TPU tiles
# `auto` adds a bucket only when it saves at least this share of the tokens computed so far:
# each bucket costs one more compilation.
MIN_GAIN = 0.05


@dataclass(frozen=True)
class Rows:
    """Which rows make one global batch: indices of the examples, their loss weights (0 = a
    filler row) and the sequence length to cut to (None = the full --max-len);
    `Examples.take` turns them into the batch's arrays."""

    idx: np.ndarray
    weight: np.ndarray
    length: int | None = None


def fixed_edges(max_len: int, smallest: int = 16) -> tuple[int, ...]:
    """Powers of two from `smallest` below `max_len`, then `max_len`: a set of lengths fixed in
    advance, so scoring texts one call after another (`predict`'s chunks, the Python API)
    compiles a bounded number of programs, whatever the texts."""
    edges, n = [], smallest
    while n < max_len:
        edges.append(n)
        n *= 2
    return (*edges, max_len)


def real_lengths(attention_mask: np.ndarray) -> np.ndarray:
    """Columns each example needs: one past its last real token (for a ranking pair, the
    longer of the two comments). Right padding is assumed; a left-padded mask needs all."""
    mask = attention_mask.reshape(attention_mask.shape[0], -1, attention_mask.shape[-1])
    positions = np.arange(1, mask.shape[-1] + 1, dtype=np.int32)
    out = np.empty(mask.shape[0], np.int64)
    for start in range(0, mask.shape[0], 65536):  # bounded temporaries for millions of rows
        part = mask[start : start + 65536]
        out[start : start + len(part)] = (part * positions).max(axis=(1, 2))
    return out


def _candidates(max_len: int) -> np.ndarray:
    return np.array(sorted({*range(EDGE_MULTIPLE, max_len, EDGE_MULTIPLE), max_len}))


def tokens_computed(lengths: np.ndarray, edges: Sequence[int], max_len: int) -> int:
    """Tokens (real + padding) computed when each example is cut to its bucket's edge."""
    return int(edge_of(lengths, edges, max_len).sum())


def edge_of(lengths: np.ndarray, edges: Sequence[int], max_len: int) -> np.ndarray:
    """The length each example is cut to: the smallest edge that holds it (else --max-len)."""
    full = np.asarray([*edges, max_len] if edges[-1] < max_len else list(edges))
    return full[np.searchsorted(full, lengths, side="left")]


def choose_edges(
    lengths: np.ndarray, max_len: int, max_buckets: int = MAX_AUTO_BUCKETS
) -> tuple[int, ...]:
    """Up to `max_buckets` edges that minimise the tokens computed over `lengths` (an exact
    dynamic programme over the multiples of 8), using fewer buckets when one more saves less
    than `MIN_GAIN` of the tokens."""
    cand = _candidates(max_len)
    # count[c]: examples whose smallest holding candidate is cand[c]
    count = np.bincount(np.searchsorted(cand, np.clip(lengths, 1, max_len)), minlength=cand.size)
    cum = np.concatenate([[0], np.cumsum(count)])  # examples with candidate index < c
    last = int(np.flatnonzero(count).max()) if count.any() else cand.size - 1
    inf = float("inf")
    # best[k][c]: least tokens for the examples up to cand[c] with k buckets, the top at c
    best = [[inf] * cand.size for _ in range(max_buckets + 1)]
    back = [[-1] * cand.size for _ in range(max_buckets + 1)]
    for c in range(cand.size):
        best[1][c] = float(cum[c + 1] * cand[c])
    for k in range(2, max_buckets + 1):
        for c in range(cand.size):
            for p in range(c):
                cost = best[k - 1][p] + float((cum[c + 1] - cum[p + 1]) * cand[c])
                if cost < best[k][c]:
                    best[k][c], back[k][c] = cost, p
    chosen = 1
    for k in range(2, max_buckets + 1):
        if best[k][last] <= best[chosen][last] * (1 - MIN_GAIN):
            chosen = k
    edges, c = [], last
    for k in range(chosen, 0, -1):
        edges.append(int(cand[c]))
        c = back[k][c]
    return tuple(sorted(edges))


def _fill(idx: np.ndarray, global_batch: int) -> Rows:
    """A batch of `idx` (at most global_batch rows) padded with weight-0 repeats of its first
    row, so every batch has the same number of rows."""
    pad = global_batch - idx.size
    weight = np.ones(global_batch, np.float32)
    if pad:
        weight[idx.size :] = 0.0
        idx = np.concatenate([idx, np.full(pad, idx[0], idx.dtype)])
    return Rows(idx, weight)


class Batcher:
    """The batches of a run: training batches per epoch and evaluation batches.

    `edges` None is the padded batcher (`--buckets none`)."""

    def __init__(
        self,
        train_lengths: np.ndarray,
        global_batch: int,
        max_len: int,
        edges: tuple[int, ...] | None = None,
        group: int = 1,
        eval_batch: int = 0,
    ) -> None:
        self.n = int(train_lengths.shape[0])
        self.eval_global_batch = eval_batch or global_batch  # rows of an evaluation batch
        self.global_batch, self.max_len, self.edges, self.group = (
            global_batch,
            max_len,
            edges,
            max(group, 1),
        )
        self.train_lengths = train_lengths
        self.train_edge = None if edges is None else edge_of(train_lengths, edges, max_len)

    @classmethod
    def for_data(
        cls,
        buckets: str,
        lengths: np.ndarray,
        global_batch: int,
        max_len: int,
        group: int = 1,
        eval_batch: int = 0,
    ) -> Batcher:
        """The batcher `--buckets` asks for, edges chosen from the training examples'
        `real_lengths` (`eval_batch`: rows of an evaluation batch; 0 = `global_batch`)."""
        parsed = parse_buckets(buckets, max_len)
        if parsed == "auto":
            parsed = choose_edges(lengths, max_len)
        return cls(lengths, global_batch, max_len, parsed, group, eval_batch)

    def batch_lengths(self) -> list[int | None]:
        """The sequence lengths of the training batches (None: the full --max-len)."""
        if self.train_edge is None:
            return [None]
        return [int(x) for x in np.unique(self.train_edge)]

    def eval_batch_lengths(self, lengths: np.ndarray) -> list[int | None]:
        """The sequence lengths of `eval_batches(lengths)`."""
        if self.edges is None:
            return [None]
        return [int(x) for x in np.unique(edge_of(lengths, self.edges, self.max_len))]

    def steps_per_epoch(self) -> int:
        if self.edges is None:
            return self.n // self.global_batch
        return -(-self.n // self.global_batch)  # every example once: the remainder is a batch

    def epoch(self, epoch: int, seed: int, start_step: int = 0) -> Iterator[Rows]:
        """The training batches of one epoch from `start_step` on."""
        if self.edges is None:
            ones = np.ones(self.global_batch, np.float32)
            for idx in shuffled_batches(self.n, self.global_batch, seed, epoch, start_step):
                yield Rows(idx, ones)
            return
        yield from self._bucketed_epoch(epoch, seed)[start_step:]

    def _bucketed_epoch(self, epoch: int, seed: int) -> list[Rows]:
        assert self.train_edge is not None
        rng = np.random.default_rng([seed, 19, epoch])
        gb, groups, tails = self.global_batch, [], []
        carry = np.zeros(0, np.int64)
        lengths = np.unique(self.train_edge)
        for i, length in enumerate(lengths):
            pool = rng.permutation(
                np.concatenate([carry, np.flatnonzero(self.train_edge == length)])
            )
            full = pool.size // gb
            carry = pool[full * gb :]
            batches = [
                Rows(pool[b * gb : (b + 1) * gb], np.ones(gb, np.float32), int(length))
                for b in range(full)
            ]
            if i == len(lengths) - 1 and carry.size:
                last = _fill(carry, gb)
                batches.append(Rows(last.idx, last.weight, int(length)))
            k = self.group
            whole = len(batches) // k * k
            groups += [batches[j : j + k] for j in range(0, whole, k)]
            if batches[whole:]:
                tails.append(batches[whole:])
        order = rng.permutation(len(groups))
        return [b for g in order for b in groups[g]] + [b for t in tails for b in t]

    def eval_batches(self, lengths: np.ndarray) -> Iterator[Rows]:
        """Batches covering every one of `len(lengths)` examples exactly once (filler rows at
        weight 0): in order at full length, or bucket by bucket at each bucket's edge."""
        n, gb = lengths.shape[0], self.eval_global_batch
        if self.edges is None:
            for start in range(0, n, gb):
                yield _fill(np.arange(start, min(start + gb, n)), gb)
            return
        edge = edge_of(lengths, self.edges, self.max_len)
        for length in np.unique(edge):
            members = np.flatnonzero(edge == length)
            for start in range(0, members.size, gb):
                b = _fill(members[start : start + gb], gb)
                yield Rows(b.idx, b.weight, int(length))

    def describe(self) -> str:
        """The buckets and the share of computed tokens that are padding, before and after."""
        if self.edges is None:
            return f"buckets: none (every batch padded to --max-len {self.max_len})"
        return describe_edges(self.edges, self.train_lengths, self.max_len)


def shuffled_batches(
    n: int, global_batch: int, seed: int, epoch: int, start_step: int = 0
) -> Iterator[np.ndarray]:
    """Index arrays of each training step of one padded epoch: a seeded permutation, last
    partial batch dropped. `start_step` skips the steps already done (resume mid-epoch)."""
    perm = np.random.default_rng([seed, 17, epoch]).permutation(n)
    for s in range(start_step, n // global_batch):
        yield perm[s * global_batch : (s + 1) * global_batch]


def describe_edges(edges: Sequence[int], lengths: np.ndarray, max_len: int) -> str:
    """One line: the edges, examples per edge, padding share before and after."""
    real = int(lengths.sum())
    padded = lengths.size * max_len
    cut = tokens_computed(lengths, edges, max_len)
    counts = np.unique(edge_of(lengths, edges, max_len), return_counts=True)
    per = ", ".join(f"{int(e)}: {int(c)}" for e, c in zip(*counts, strict=True))
    return (
        f"buckets: {','.join(map(str, edges))} (examples per edge {per}); padding "
        f"{1 - real / max(padded, 1):.0%} of computed tokens at --max-len {max_len} -> "
        f"{1 - real / max(cut, 1):.0%} ({cut / max(padded, 1):.2f}x the tokens)"
    )
