"""Tokenized `Examples`, ready to batch: a split's token ids, masks and labels laid out as its
task's batch layout says (framework-free). Which rows each batch holds is
`jaxtpu.core.data.buckets.Batcher`'s business; a ranking example holds [0] the less toxic and
[1] the more toxic comment. Both sides take their batches from here, so they see exactly the
same examples in the same order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jaxtpu.core.data.buckets import real_lengths
from jaxtpu.core.data.records import RULE_LABEL, SUBLABELS, Comments, Groups, Pairs
from jaxtpu.core.data.tokens import cached_tokens
from jaxtpu.core.tasks import Task, get_task


@dataclass
class Examples:
    """Tokenized examples of one split, ready to batch."""

    input_ids: np.ndarray  # (N, L) or (N, 2, L)
    attention_mask: np.ndarray
    label: np.ndarray  # (N, *Task.label_shape), NaN where a sub-label is blank
    cache_hit: bool = False
    groups: Groups = field(default_factory=Groups)  # for the metrics, never batched
    lengths: np.ndarray | None = None  # (N,) `real_lengths` when the tokenizer gave them
    # what a batch holds, `Task.batch_layout` ({key: (row shape, dtype)}); None: the four
    # arrays as they are
    layout: Mapping[str, tuple[tuple[int, ...], str]] | None = None
    # (N,) float32 >= 0: each example's weight in the training loss (`row_weights`); None: 1
    row_weights: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.label.shape[0])

    def concat(self, other: Examples, weights: np.ndarray | None, other_weight: float) -> Examples:
        """These examples followed by `other`'s (the same max length and layout), with the
        row weights `weights` (None: 1) for these and `other_weight` for each of `other`'s; the
        groups (for metrics, never batched) are left behind."""
        own = np.ones(len(self), np.float32) if weights is None else weights
        return Examples(
            np.concatenate([self.input_ids, other.input_ids]),
            np.concatenate([self.attention_mask, other.attention_mask]),
            np.concatenate([self.label, other.label]),
            self.cache_hit and other.cache_hit,
            lengths=np.concatenate([self.real_lengths(), other.real_lengths()]),
            layout=self.layout,
            row_weights=np.concatenate([own, np.full(len(other), other_weight, np.float32)]),
        )

    def real_lengths(self) -> np.ndarray:
        """Each example's `buckets.real_lengths`, without reading the token arrays when they
        came from the cache (which keeps them beside the entry)."""
        if self.lengths is not None:
            return self.lengths
        return real_lengths(self.attention_mask)

    def take(
        self, idx: np.ndarray, weight: np.ndarray | None = None, length: int | None = None
    ) -> dict[str, np.ndarray]:
        """The batch of rows `idx`, cut to `length` tokens (None: all; see
        `jaxtpu.core.data.buckets`), made to the task's batch layout: its keys, in its dtypes.
        `weight` marks the real rows (0: a row that pads the batch); the row weight is it times
        the example's own (`row_weights`)."""
        if weight is None:
            weight = np.ones(idx.shape[0], np.float32)
        cut = slice(None, length)
        own = (lambda: 1.0) if self.row_weights is None else (lambda: self.row_weights[idx])
        columns = {
            "input_ids": lambda: self.input_ids[idx, ..., cut],
            "attention_mask": lambda: self.attention_mask[idx, ..., cut],
            "label": lambda: self.label[idx],
            "weight": lambda: weight.astype(np.float32),
            "row_weight": lambda: (weight * own()).astype(np.float32),
        }
        layout = self.layout or dict.fromkeys(columns, ((), ""))
        missing = [k for k in layout if k not in columns]
        if missing:
            raise KeyError(f"the batch layout asks for {missing}; examples hold {list(columns)}")
        batch = {k: columns[k]() for k in layout}
        return {
            k: x.astype(layout[k][1], copy=False) if layout[k][1] else x for k, x in batch.items()
        }


def encode(
    data: Comments | Pairs,
    tokenizer: Any,
    max_len: int,
    cache_dir: Any = None,
    task: Task | None = None,
) -> Examples:
    """Tokenizes comments (or text pairs or prompts: `Comments.first`, in `Comments.form`),
    or both sides of each pair (ranking), with the labels of `task`
    (default: toxicity) laid out as its `Task.batch_layout` says (`labels_of`)."""
    task = task or get_task("toxicity")
    if isinstance(data, Pairs):
        n = len(data)
        # Each pair's two comments side by side: (2n, L) is (n, 2, L) without a copy.
        both = lambda: [t for pair in zip(data.less, data.more, strict=True) for t in pair]  # noqa: E731
        digests = data.text_digests().reshape(2 * n, 16)
        t = cached_tokens(both, digests, tokenizer, max_len, cache_dir)
        pair = lambda a: a.reshape(n, 2, max_len)  # noqa: E731
        longer = t.lengths.reshape(n, 2).max(1)
        label = np.ones(n, np.float32)  # the more toxic comment is the second
        layout = task.batch_layout(max_len)
        return Examples(
            pair(t.ids), pair(t.mask), label, t.cache_hit, lengths=longer, layout=layout
        )
    t = cached_tokens(data.encoded, data.text_digests(), tokenizer, max_len, cache_dir, data.form)
    labels = labels_of(data, task.label_columns)
    if task.aux_columns:  # the auxiliary targets after the labels, NaN where blank or absent
        blank = np.full(len(data), np.nan, np.float32)
        aux = [data.columns.get(c, blank) for c in task.aux_columns]
        labels = np.column_stack([labels, *aux]).astype(np.float32)
    labels = labels.reshape(len(data), *task.label_shape)
    layout = task.batch_layout(max_len)
    return Examples(t.ids, t.mask, labels, t.cache_hit, data.groups, t.lengths, layout)


def labels_of(data: Comments, label_columns: tuple[str, ...]) -> np.ndarray:
    """(N, columns) float32 of these label columns (`toxic` and the `SUBLABELS`, or a rules
    file's `rule_violation`), NaN where a sub-label is blank (or the file has no such column);
    unlabelled comments get zeros."""
    n = len(data)
    if data.labels is None:
        return np.zeros((n, len(label_columns)), np.float32)
    sub = data.sublabels if data.sublabels is not None else np.full((n, len(SUBLABELS)), np.nan)
    by_name = {
        "toxic": data.labels,
        RULE_LABEL: data.labels,
        **{c: sub[:, i] for i, c in enumerate(SUBLABELS)},
    }
    return np.column_stack([by_name[c] for c in label_columns]).astype(np.float32)
