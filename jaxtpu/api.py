"""Scoring text from Python, as detoxify offers: `jaxtpu.load(run).predict(texts)`.

    >>> from jaxtpu import load
    >>> model = load("runs/toxicity-20261124-101500")
    >>> model.predict(["thanks for the edit", "you are an idiot"])
    array([0.02, 0.97], dtype=float32)

A toxicity model gives each text's probability, a ranker its raw score (only the order means
something), a multi-label model a dict of its six named columns of probabilities, a rules model
the probability that each (rule, comment) pair's comment breaks its rule. Texts are
scored in batches, in fixed length buckets (powers of two up to the run's --max-len), so a
long-lived model compiles each bucket's program once whatever texts it is given.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core import metrics
from jaxtpu.core.data import templates
from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.schema import SCORING
from jaxtpu.core.textformat import PROMPT
from jaxtpu.engine.scoring import Scorer, TrainedModel, load_trained


class Model:
    """The best model of a jaxtpu run, ready to score text (see `load`)."""

    def __init__(
        self,
        workdir: str | Path,
        devices: list[Any],
        batch_size: int,
        calibrated: bool = True,
        pooled: bool = False,
    ) -> None:
        self._start(load_trained(workdir), devices, batch_size, calibrated, pooled)

    @classmethod
    def of(
        cls,
        trained: TrainedModel,
        devices: list[Any],
        batch_size: int,
        calibrated: bool = True,
        pooled: bool = False,
    ) -> Model:
        """A model already loaded (`jaxtpu.engine.scoring`'s `load_model_dir` of an export, or
        `load_trained` of a run), scored as a run's is (`jaxtpu serve --model-dir`)."""
        model = cls.__new__(cls)
        model._start(trained, devices, batch_size, calibrated, pooled)
        return model

    def _start(
        self,
        trained: TrainedModel,
        devices: list[Any],
        batch_size: int,
        calibrated: bool,
        pooled: bool = False,
    ) -> None:
        self.trained = trained
        self.scorer = Scorer(self.trained, devices, batch_size, calibrated, pooled)
        self.task = self.scorer.task
        self.backend = self.scorer.backend
        self.text_format = self.trained.spec.text_format

    @property
    def labels(self) -> tuple[str, ...]:
        """The names of the scores: ('toxic',) or the six labels of a multi-label model."""
        return self.task.label_columns

    def logits(self, texts: Iterable[str]) -> np.ndarray:
        """The model's raw outputs: (N,) or (N, outputs) (the labels', then any auxiliary
        targets'), for any iterable of strings (a list, a generator, a pandas Series, ...),
        read once. A rules model scores (rule, comment) pairs; a model trained with
        --prompt-template scores each comment (and rule) inside that prompt, as it trained."""
        prepared = self.prepared(texts)  # checked before anything is scored
        return self.scorer.logits(prepared)

    def probabilities(self, texts: Iterable[str]) -> np.ndarray:
        """(N, columns) calibrated probabilities of every score column (`task.score_columns`:
        the labels, then any auxiliary targets'): what the server answers with."""
        return self._probabilities(self.scorer.scores(self.prepared(texts)))

    def _probabilities(self, calibrated: np.ndarray) -> np.ndarray:
        return np.asarray(self.task.predictions(calibrated, True), np.float64)

    def scored(self, texts: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
        """(`probabilities`, each text's vector under the head (N, hidden)) from one pass of
        the model: what a community's head reads (`jaxtpu.core.serving.heads`); for a model
        loaded with `pooled`."""
        prepared = self.prepared(texts)
        logits, vectors = self.scorer.features(prepared)
        return self._probabilities(self.scorer.calibrate(logits, vectors, prepared)), vectors

    def buckets(self, texts: Iterable[str]) -> np.ndarray:
        """The length bucket (its edge, in tokens) each text is scored in: texts of one bucket
        run in one program (the server groups them so, `jaxtpu.serve.batcher`)."""
        prepared = self.prepared(texts)
        return self.scorer.buckets(prepared)

    def prepared(self, texts: Iterable[str]) -> list[Any]:
        """What the scorer tokenizes: each text (or pair) checked and read as the run read its
        rows (whitespace collapsed; the run's prompt or rule template)."""
        if isinstance(texts, str | bytes):
            raise UserError("predict takes an iterable of strings (one comment each), not one")
        texts = list(texts)  # a generator is read once: every item is scored
        fmt = self.text_format
        if fmt.rules:  # a rules model: (rule, comment) pairs
            wrong = [i for i, t in enumerate(texts) if not _is_pair(t)]
            if wrong:
                kind = type(texts[wrong[0]]).__name__
                raise UserError(
                    "a rules model scores (rule, comment) pairs of strings (the rule as its "
                    f"--rule-template renders it); item {wrong[0]} is {kind}"
                )
            empty = [i for i, (rule, _) in enumerate(texts) if not rule.strip()]
            if empty:  # as train and predict refuse a row whose rule is empty
                raise UserError(
                    f"item {empty[0]}'s rule is empty; every (rule, comment) pair asks about one "
                    "rule"
                )
            norm = templates.normalize_text
            if fmt.kind == PROMPT:  # the rule goes into the run's prompt, as its rows' did
                t = templates.template_of(fmt)
                if set(t.fields) != {"rule"}:
                    raise UserError(
                        f"this model's {fmt.describe()} reads columns {', '.join(t.fields)}, "
                        "not the rule alone: score a file of them with jaxtpu predict"
                    )
                return [(t.render({"rule": a}), norm(b)) for a, b in texts]
            return [(norm(a), norm(b)) for a, b in texts]
        wrong = [i for i, t in enumerate(texts) if not isinstance(t, str)]
        if wrong:
            kind = type(texts[wrong[0]]).__name__
            raise UserError(f"predict takes strings (one comment each); item {wrong[0]} is {kind}")
        if fmt.kind == PROMPT:  # each comment in the run's prompt, as its rows were
            first = templates.template_of(fmt).render({})
            return [(first, templates.normalize_text(t)) for t in texts]
        return [templates.normalize_text(t) for t in texts]

    def predict(
        self, texts: Iterable[str], all_outputs: bool = False
    ) -> np.ndarray | dict[str, np.ndarray]:
        """One score per text: the probability of toxicity (a ranker: its raw score), or for
        a multi-label model `{label: probabilities}` for each of its labels. `all_outputs`
        (a run trained with --aux-columns): `{column: probabilities}` of the labels and every
        auxiliary target."""
        if self.trained.spec.task.comments_per_example == 2:
            return self.logits(texts)
        scores = self.scorer.scores(self.prepared(texts))
        if all_outputs:
            names, probs = self.task.score_columns(True), self.task.predictions(scores, True)
            return {k: probs[:, j].astype(np.float32) for j, k in enumerate(names)}
        probs = metrics.probability(self.task.main(scores))
        if probs.ndim == 1:
            return probs.astype(np.float32)
        return {k: probs[:, j].astype(np.float32) for j, k in enumerate(self.labels)}


def _is_pair(item: Any) -> bool:
    return (
        isinstance(item, tuple | list) and len(item) == 2 and all(isinstance(x, str) for x in item)
    )


def load(
    workdir: str | Path,
    num_devices: int | None = None,
    batch_size: int = SCORING.batch_size,
    calibrated: bool = True,
    pooled: bool = False,
) -> Model:
    """The best model of run directory `workdir`, on `num_devices` devices (default: every
    local device JAX has: an accelerator's, or on a CPU one device unless virtual ones were
    asked for; a number of virtual CPU devices is made only when JAX has not started yet),
    scoring `batch_size` texts per device per batch. `predict` gives calibrated probabilities
    (the run's `calibration.json`, as `jaxtpu predict` writes them) unless `calibrated` is
    False; `logits` are the model's raw outputs either way. `pooled`: `scored` gives each
    text's vector under the head beside its probabilities (what a community's head reads)."""
    from jaxtpu.engine import hosts

    if batch_size < 1:
        raise UserError(f"batch_size must be >= 1, got {batch_size}")
    hosts.use_compilation_cache()
    if num_devices is not None and num_devices < 1:
        raise UserError(f"num_devices must be >= 1 (None: every local device), got {num_devices}")
    devices = hosts.scoring_devices(num_devices or 0)
    return Model(workdir, devices, batch_size, calibrated, pooled)
