"""The Jigsaw tasks, one table: what each reads, how its examples are shaped, its head dropout,
its validation metric and the key that picks the best checkpoint (framework-free).

Everything that differs between tasks is asked of this table. Each side keeps one per-task
loss function (`jaxtpu.engine.steps.LOSSES`, `torchxla_ref.steps.LOSSES`) next to its step, keyed by
the same names. A new task is a row here, its metric below, and its loss on each side.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from jaxtpu.core import metrics
from jaxtpu.core.breakdowns import BREAKDOWNS, RULE_MONITOR
from jaxtpu.core.errors import ConfigError

log = logging.getLogger("jaxtpu")

RANKING_MARGIN = 0.5  # margin of the ranking loss, on both sides
# The six labels of the Kaggle Toxic Comment Classification data, in its column order.
LABELS = ("toxic", "severe_toxic", "obscene", "threat", "insult", "identity_hate")


def _auc(scores: np.ndarray, labels: np.ndarray, weight: np.ndarray) -> dict[str, float]:
    return {"val_auc": metrics.roc_auc(scores, labels, weight)}


def _both_classes(labels: np.ndarray) -> str | None:
    binary = np.asarray(labels) >= 0.5  # float targets are binarised for AUC
    if binary.all() or not binary.any():
        return f"all {binary.size} labels are {'toxic' if binary.all() else 'non-toxic'}"
    return None


def _mean_column_auc(
    scores: np.ndarray, labels: np.ndarray, weight: np.ndarray
) -> dict[str, float]:
    """The Kaggle Toxic Comment Classification metric: the mean of the six columns' ROC AUC,
    each over the rows whose label is known (rows with blank sub-labels count for `toxic`
    only). A column with one class in the evaluation set has no AUC: it is left out of the
    mean and of the per-label keys."""
    aucs = dict(zip(LABELS, metrics.column_aucs(scores, labels, weight), strict=True))
    defined = {k: v for k, v in aucs.items() if np.isfinite(v)}
    if len(defined) < len(aucs):
        left_out = [k for k in aucs if k not in defined]
        log.warning(
            "val_mean_auc is the mean over %d of %d labels: %s left out (one class, or no "
            "known value, in the validation set)",
            len(defined),
            len(aucs),
            ", ".join(left_out),
        )
    mean = float(np.mean(list(defined.values()))) if defined else float("nan")
    return {"val_mean_auc": mean, **{f"val_auc_{k}": v for k, v in defined.items()}}


def _agreement(scores: np.ndarray, labels: np.ndarray, weight: np.ndarray) -> dict[str, float]:
    return {"val_agreement": metrics.agreement(scores[:, 0], scores[:, 1], weight)}


@dataclass(frozen=True)
class Task:
    """One task of the table.

    Attributes:
      name: the `--task` value.
      comments_per_example: 1 (a comment, model input (B, L)) or 2 (a less/more toxic pair,
        (B, 2, L), the same head applied to both).
      head_dropout: dropout before the Dense head when `--dropout` is not given.
      monitor: the task's metric, which picks the best checkpoint by default (higher is
        better; `monitors` lists the others a run may choose with --monitor).
      metric: (scores, labels, weight) of the whole evaluation set -> {monitor: value}.
      reads: the file kinds (`jaxtpu.core.data.filekinds.FILE_KINDS`) a training/validation
        file may be.
      evaluated_on: the file kind `evaluate` scores a run of the task on.
      predicts: the file kinds `predict` scores with a model of the task.
      unit: what one example is called in messages.
      undefined: why the metric is undefined on a validation set with these labels (None when
        it is defined): such a set is refused before training.
      label_columns: the label columns of a classification file the task learns, in the
        order of the head's outputs (one score per column per comment; NaN where a column is
        blank). One column gives labels of shape (N,), several (N, columns). A pairs task's
        label is 1 for every pair (the more toxic comment comes second).
      aux_columns: auxiliary targets (`--aux-columns`, soft targets in [0, 1], NaN where blank)
        learnt as further head outputs after the label columns, each row's loss the task's
        on its labels plus `aux_weight` x the mean BCE over its known auxiliary targets. The
        metrics, predictions and scores read the label columns' outputs alone (`main`).
      aux_weight: `--aux-weight`.
      others: further metrics of the task that --monitor may choose (`monitors`).
      text_pairs: each example is a text pair (the rules task: the rule, then the comment),
        tokenized as the tokenizer encodes pairs, the second text truncated, never the first.
    """

    name: str
    comments_per_example: int
    head_dropout: float
    monitor: str
    metric: Callable[[np.ndarray, np.ndarray, np.ndarray], dict[str, float]]
    reads: tuple[str, ...]
    unit: str
    evaluated_on: str = "classification"
    predicts: tuple[str, ...] = ("classification", "unlabelled", "score")
    undefined: Callable[[np.ndarray], str | None] = lambda labels: None
    label_columns: tuple[str, ...] = ("toxic",)
    aux_columns: tuple[str, ...] = ()
    aux_weight: float = 1.0
    others: tuple[str, ...] = ()
    text_pairs: bool = False

    @property
    def outputs(self) -> int:
        """Scores per comment: the head's outputs (the labels', then the auxiliary ones)."""
        return len(self.label_columns) + len(self.aux_columns)

    @property
    def main_outputs(self) -> int:
        """The outputs of the label columns: what the task is scored and predicts by."""
        return len(self.label_columns)

    def main(self, values: np.ndarray) -> np.ndarray:
        """The label columns' part of per-comment outputs or labels ((N, outputs) -> (N,) for
        one label column, (N, label columns) for several); as they are without auxiliary
        targets."""
        if not self.aux_columns:
            return values
        values = np.asarray(values)
        return values[:, 0] if self.main_outputs == 1 else values[:, : self.main_outputs]

    def with_aux(self, columns: tuple[str, ...], weight: float) -> Task:
        """This task with auxiliary targets (`aux_columns`); itself when there are none."""
        if not columns:
            return self
        return replace(self, aux_columns=tuple(columns), aux_weight=weight)

    def example_shape(self, max_len: int) -> tuple[int, ...]:
        """The shape of one example's token ids."""
        return (max_len,) if self.comments_per_example == 1 else (2, max_len)

    @property
    def label_shape(self) -> tuple[int, ...]:
        """The shape of one example's label: () for one output, (outputs,) for several."""
        return () if self.outputs == 1 else (self.outputs,)

    def batch_layout(self, max_len: int) -> dict[str, tuple[tuple[int, ...], str]]:
        """The layout of one batch row, the one description of it every batch is made to:
        `{key: (shape of one row, numpy dtype name)}`. Token ids and
        their mask are (L,) or (2, L) int32; the label `label_shape` float32; the weight a
        float32 scalar, 1 for a real row and 0 for rows that pad an evaluation batch or a call
        (what metrics and the skipping of padding slots read); the row weight a float32 scalar,
        the row's weight in the training loss (`--weight-column`, `--bias-weights`; else the
        weight), which may be 0 on a real row."""
        example = self.example_shape(max_len)
        return {
            "input_ids": (example, "int32"),
            "attention_mask": (example, "int32"),
            "label": (self.label_shape, "float32"),
            "weight": ((), "float32"),
            "row_weight": ((), "float32"),
        }

    def zeros(self, lead: tuple[int, ...], max_len: int) -> dict[str, np.ndarray]:
        """A batch of zeros laid out as `batch_layout`, with leading dimensions `lead` (e.g.
        (rows,) or (K, rows)): the shape-only batch of precompiling and benchmarks."""
        return {
            k: np.zeros((*lead, *shape), dtype)
            for k, (shape, dtype) in self.batch_layout(max_len).items()
        }

    def score_columns(self, every: bool = False) -> tuple[str, ...]:
        """The columns of `predictions`: a probability per label column (`every`: then per
        auxiliary target too), or for a pairs task the raw score of each comment of the
        pair."""
        if self.comments_per_example == 2:
            return ("less_toxic_score", "more_toxic_score")
        return self.label_columns + (self.aux_columns if every else ())

    def predictions(self, scores: np.ndarray, every: bool = False) -> np.ndarray:
        """What a model's outputs (logits) are reported as, (N, score columns): probabilities
        for a classification task (of the label columns, or with `every` of every output),
        the raw scores of a ranker (only their order means something)."""
        scores = scores if every else self.main(scores)
        if self.comments_per_example == 2:  # a ranker's raw scores, as many as given
            return np.asarray(scores, np.float64).reshape(len(scores), -1)
        columns = len(self.score_columns(every))  # so no rows still has its columns
        return metrics.probability(np.asarray(scores, np.float64).reshape(len(scores), columns))

    def validation_metrics(
        self,
        scores: np.ndarray,
        labels: np.ndarray,
        losses: np.ndarray,
        weight: np.ndarray,
        groups: Any = None,
    ) -> dict[str, float]:
        """The validation metrics from gathered per-example outputs (pad rows at weight 0),
        with the breakdowns the file's `groups` (`jaxtpu.core.data.records.Groups`) allow.

        Returns:
          {'val_loss': ..., monitor: ..., group metrics (`group_metrics`)}: the loss is the
          training objective's (auxiliary targets included), the metrics of the label
          columns' outputs.
        """
        scores, labels = self.main(scores), self.main(labels)
        return {
            "val_loss": metrics.weighted_mean(losses, weight),
            **self.metric(scores, labels, weight),
            **self.group_metrics(scores, labels, weight, groups),
        }

    def group_metrics(
        self, scores: np.ndarray, labels: np.ndarray, weight: np.ndarray, groups: Any
    ) -> dict[str, float]:
        """The competitions' breakdowns (`jaxtpu.core.breakdowns.BREAKDOWNS`) of the first
        output (`toxic`/`target`/`rule_violation`) of a one-comment task, each where the file
        has its column: the Unintended Bias metric over identity columns, the Multilingual
        per-language AUC, the Agile Community Rules per-rule AUC."""
        if not groups or self.comments_per_example != 1:
            return {}
        first = (lambda a: a) if self.main_outputs == 1 else (lambda a: a[:, 0])  # noqa: E731
        s, y = first(np.asarray(scores)), first(np.asarray(labels))
        out = {}
        for b in BREAKDOWNS:
            values = b.values(groups)
            if values is None:
                continue
            parts, left_out = b.measure(s, y, values, weight)
            if left_out:
                log.warning(
                    "%s: %s(s) %s left out (one class%s in the validation set)",
                    b.monitor,
                    b.group,
                    b.left_out([str(g)[:60] for g in left_out], named=True),
                    ", or no rows," if b.no_rows else "",
                )
            out.update({f"val_{k}": v for k, v in parts.items()})
        return out

    def monitors(self, groups: Any = None) -> tuple[str, ...]:
        """The metrics that may choose the best checkpoint on validation data with these
        `groups`, the default first: the competition's own metric where the file is of that
        competition (a breakdown ranked 'first': Unintended Bias's `val_jigsaw_bias`), else
        the task's; the breakdowns ranked 'after' next; `val_loss` always."""
        names = [self.monitor, *self.others]
        if groups and self.comments_per_example == 1:
            for b in BREAKDOWNS:
                if b.values(groups) is None or b.rank == "own":
                    continue
                if b.rank == "first":
                    names.insert(0, b.monitor)
                else:
                    names.append(b.monitor)
        return (*names, "val_loss")

    def undefined_monitor(self, monitor: str, labels: np.ndarray, groups: Any) -> str | None:
        """Why a breakdown's `monitor` is undefined at every evaluation on this validation
        data whatever the model scores (every group holds one class), or None. The overall
        one-class case is `undefined`'s."""
        found = [b for b in BREAKDOWNS if b.monitor == monitor]
        values = found[0].values(groups) if found else None
        if values is None:
            return None
        b = found[0]
        y = np.asarray(labels, np.float64)
        y = y if y.ndim == 1 else y[:, 0]
        scores, weight = np.zeros(len(y)), np.ones(len(y))  # AUCs exist iff both classes do
        parts, left_out = b.measure(scores, y, values, weight)
        if np.isfinite(parts[monitor.removeprefix("val_")]):
            return None
        return f"every {b.group} ({b.left_out([str(g) for g in left_out])}) holds one class"

    def choose_monitor(self, requested: str, groups: Any = None) -> str:
        """`--monitor` (empty: the default of `monitors`), refused when this task does not
        report it on this validation data."""
        allowed = self.monitors(groups)
        if not requested:
            return allowed[0]
        if requested not in allowed:
            raise ConfigError(
                f"--monitor {requested}: the {self.name} task reports "
                f"{', '.join(allowed)} on this validation data"
            )
        return requested


def higher_is_better(monitor: str) -> bool:
    """The direction of a monitored metric: val_loss is minimised, every other maximised."""
    return monitor != "val_loss"


TASKS: dict[str, Task] = {
    "toxicity": Task(
        name="toxicity",
        comments_per_example=1,
        head_dropout=0.3,
        monitor="val_auc",
        metric=_auc,
        reads=("classification",),
        unit="comments",
        undefined=_both_classes,  # ROC AUC needs both classes
    ),
    "ranking": Task(
        name="ranking",
        comments_per_example=2,
        head_dropout=0.2,
        monitor="val_agreement",
        metric=_agreement,
        reads=("pairs", "classification"),  # labelled comments are paired by severity
        unit="pairs",
        # pairs drawn at random from labels would make the number depend on a seed
        evaluated_on="pairs",
    ),
    "multilabel": Task(
        name="multilabel",
        comments_per_example=1,
        head_dropout=0.3,
        monitor="val_mean_auc",
        metric=_mean_column_auc,
        reads=("classification",),
        unit="comments",
        undefined=_both_classes,  # of `toxic`, known for every row
        label_columns=LABELS,
    ),
    # Agile Community Rules (2025): does this comment break this rule? One (rule, comment)
    # text pair per example, its label `rule_violation`; scored by the mean per-rule AUC.
    "rules": Task(
        name="rules",
        comments_per_example=1,
        head_dropout=0.1,
        monitor=RULE_MONITOR,
        metric=_auc,
        reads=("rules",),
        unit="rows",
        evaluated_on="rules",
        predicts=("rules",),
        undefined=_both_classes,
        label_columns=("rule_violation",),
        others=("val_auc",),
        text_pairs=True,
    ),
}


def monitor_names() -> tuple[str, ...]:
    """Every metric some task reports on some file: the values --monitor accepts (each run
    then checks its own, `Task.choose_monitor`)."""
    tasks = sorted({m for t in TASKS.values() for m in (t.monitor, *t.others)})
    breakdowns = [b.monitor for b in BREAKDOWNS if b.rank != "own"]
    return (*tasks, *breakdowns, "val_loss")


def get_task(name: str) -> Task:
    """The table row of a task name (names are validated with the config)."""
    return TASKS[name]


# Severity weights for pairs built from labels (as in public Rate Severity solutions):
# toxic, then SUBLABELS in order.
SEVERITY_WEIGHTS = np.array([0.32, 1.5, 0.16, 1.5, 0.64, 1.5], np.float32)


# The label: `toxic` (0/1, the Toxic Comment and Multilingual files) or `target` (the share of
# raters who found the comment toxic, Unintended Bias), trained on as a soft target.
LABEL_COLUMNS = ("toxic", "target")
