"""Scoring a labelled file and reporting the metric of its kind, as its competition defines
it (`jaxtpu evaluate`): the file read as the run's task reads it, scored in the buckets and
batch shape every scoring path uses, the task's validation metrics, the headline among them,
and the calibration's ECE and Brier score before and after.

Each file kind's metric is in `jaxtpu.evaluate`'s table; the numbers are the ones training
reports for its validation set (`jaxtpu.core.tasks`), from the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jaxtpu.core import calibration
from jaxtpu.core.data import readers, records, taskdata, tokenized
from jaxtpu.core.data.buckets import Batcher, fixed_edges
from jaxtpu.core.data.filekinds import BY_NAME, kind_of
from jaxtpu.core.data.tokens import load_tokenizer
from jaxtpu.core.errors import DataError
from jaxtpu.core.flags.schema import SCORING
from jaxtpu.core.run import loop
from jaxtpu.core.severity import format_weights, pair_agreement
from jaxtpu.core.tasks import TASKS, Task
from jaxtpu.core.textformat import PLAIN, TextFormat
from jaxtpu.engine.scoring import (
    for_scoring,
    load_model_dir,
    load_multilabel,
    load_trained,
    pair_probabilities,
    scoring_backend,
)

# The headline metric's name in the output -> its key in the validation metrics.
METRICS = {
    "auc": "val_auc",
    "mean_column_auc": "val_mean_auc",
    "jigsaw_bias": "val_jigsaw_bias",
    "mean_language_auc": "val_mean_language_auc",
    "agreement": "val_agreement",
    "mean_rule_auc": "val_mean_rule_auc",
}


def headline(task: Task, examples: tokenized.Examples) -> str:
    """The metric that decides the file's competition (a name of `METRICS`): the one a run
    monitors by default on the same file (`Task.monitors`), so `evaluate` and training's best
    model speak of one number (a Multilingual file: the ROC AUC over all rows, the
    leaderboard's; its per-language mean is reported beside it)."""
    monitor = task.monitors(examples.groups)[0]
    return next(name for name, key in METRICS.items() if key == monitor)


def read_labelled(
    path: str, task: Task, fmt: TextFormat = PLAIN, every_label: bool = True
) -> records.Comments | records.Pairs:
    """The labelled file a run of `task` can be scored on: pairs for a ranker (pairs drawn at
    random from labels would make the number depend on a seed), a labelled rules file for a
    rules run (its pairs made by the run's own --rule-template), labelled comments
    otherwise; each row as the run's --prompt-template makes it a prompt, if it has one.
    A multi-label run's file needs a label besides the first unless not `every_label` (a
    community's decisions, which label one)."""
    kind = kind_of(readers.columns(path))
    if kind is None or kind.name != task.evaluated_on:
        found = kind.what if kind else "a file of unknown layout"
        hint = "; to score it, use jaxtpu.predict" if kind and not kind.labelled else ""
        raise DataError(
            f"--input {path}: a {task.name} run is evaluated on "
            f"{BY_NAME[task.evaluated_on].what}; this is {found}{hint}"
        )
    data = taskdata.read_task_file(
        path, task, columns=taskdata.aux_columns(task, required=False), fmt=fmt
    )
    if task.main_outputs > 1 and every_label:
        taskdata.check_label_columns(data, task, f"--input {path}")
    return data


def evaluate(
    workdir: str | None,
    path: str,
    devices: list[Any],
    batch_size: int = SCORING.batch_size,
    model_dir: str | None = None,
    max_len: int = SCORING.max_len,
) -> dict[str, Any]:
    """The metric of `path` under the best model of run `workdir`, or of the fine-tuned
    classifier directory `model_dir` (`jaxtpu.engine.scoring.load_model_dir`, its comments cut to
    `max_len` tokens): {'metric': name, 'value': value, 'examples': n, ...every part}."""

    if workdir:
        model = load_trained(workdir)
    else:
        kind = kind_of(readers.columns(path))
        ranked = kind is not None and any(  # a file a pairs task is evaluated on
            t.comments_per_example == 2 and t.evaluated_on == kind.name for t in TASKS.values()
        )
        model = load_model_dir(model_dir, max_len, ranked)
    task = model.spec.task
    examples, result, scores = score_file(model, path, devices, batch_size)
    name = headline(task, examples)
    parts = {k.removeprefix("val_"): v for k, v in result.items()}
    return {
        "metric": name,
        "value": result[METRICS[name]],
        "examples": len(examples),
        "input": str(path),
        **({"workdir": str(workdir)} if workdir else {"model_dir": str(model_dir)}),
        **parts,
        **calibration_report(model.calibration, scores, examples.label),
    }


def score_file(
    model: Any, path: str, devices: list[Any], batch_size: int, every_label: bool = True
) -> tuple[tokenized.Examples, dict[str, float], Any]:
    """(examples, validation metrics, raw outputs in the file's order) of labelled file `path`
    under `model`, in the length buckets and batch shape `predict`, `jaxtpu.load()` and
    `serve` score in (`Scorer`: fixed power-of-two edges, `batch_size` rows per device), so
    that evaluate's score of a row is theirs, bf16 included."""
    task, d = model.spec.task, model.cfg.data
    data = read_labelled(path, task, model.spec.text_format, every_label)
    tokenizer = load_tokenizer(model.tokenizer_dir, model.spec.pad_id)
    examples = tokenized.encode(data, tokenizer, d.max_len, d.cache_dir, task)
    global_batch = batch_size * len(devices)
    edges = fixed_edges(d.max_len)
    batcher = Batcher(examples.real_lengths(), global_batch, d.max_len, edges)
    backend = scoring_backend(for_scoring(model, devices), devices, task)
    result, scores = loop.score_examples(backend, examples, batcher, task)
    return examples, result, scores


def calibration_report(cal: Any, logits: Any, labels: Any) -> dict[str, Any]:
    """{'calibration': {column: ECE and Brier score before and after}} of the file's rows under
    the model's calibration (the metrics above are the same either way: a monotone map of each
    column); {} for a model without one (a ranker, an older run)."""
    if cal is None:
        return {}
    before, after = calibration.scores(logits, labels), calibration.scores(logits, labels, cal)
    return {
        "calibration": {
            column: {
                "ece_before": before["ece"][j],
                "ece_after": after["ece"][j],
                "brier_before": before["brier"][j],
                "brier_after": after["brier"][j],
            }
            for j, column in enumerate(cal.columns)
        }
    }


def agreement_report(
    workdirs: Sequence[str], path: str, weights: np.ndarray, devices: list[Any], batch_size: int
) -> dict[str, Any]:
    """`evaluate --label-weights`: the agreement of the weighted severity on a pairs file."""
    less, more = pair_probabilities(load_multilabel(workdirs), path, devices, batch_size)
    return {
        "metric": "agreement",
        "value": pair_agreement(less, more, weights),
        "examples": len(less),
        "input": str(path),
        "workdir": str(workdirs[0]),
        "label_weights": format_weights(weights),
    }
