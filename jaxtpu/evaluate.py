"""`python -m jaxtpu.evaluate`: score a labelled file with the best model of a run and report
the metric of the file's kind, as its competition defines it.

| file | metric |
|---|---|
| comments with `toxic` (or `target`) | `auc`: ROC AUC |
| the six Toxic Comment labels, for a multi-label run | `mean_column_auc` and each label's |
| identity columns (Unintended Bias) | `jigsaw_bias`, with every subgroup's three AUCs |
| a `lang` column (Multilingual validation) | `mean_language_auc`, with each language's |
| `less_toxic`, `more_toxic` pairs, for a ranking run | `agreement` |

The numbers are the ones training reports for its validation set (`jaxtpu.core.tasks`), from
the same code.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from jaxtpu.core import calibration, storage
from jaxtpu.core.data import readers, records, taskdata, templates, tokenized
from jaxtpu.core.data.buckets import Batcher, fixed_edges
from jaxtpu.core.data.tokens import load_tokenizer
from jaxtpu.core.errors import DataError, UserError
from jaxtpu.core.flags.commands import check_command_flags, command_parser
from jaxtpu.core.flags.schema import SCORING
from jaxtpu.core.run import loop
from jaxtpu.core.run.exits import user_errors
from jaxtpu.core.run.rundir import strict_json
from jaxtpu.core.severity import parse_label_weights
from jaxtpu.core.tasks import Task
from jaxtpu.engine.scoring import (
    agreement_report,
    load_model_dir,
    load_trained,
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
    path: str, task: Task, template: str = templates.DEFAULT_RULE_TEMPLATE
) -> records.Comments | records.Pairs:
    """The labelled file a run of `task` can be scored on: pairs for a ranker (pairs drawn at
    random from labels would make the number depend on a seed), a labelled rules file for a
    rules run (its pairs made by the run's own --rule-template), labelled comments
    otherwise; each row as the run's --prompt-template makes it a prompt, if it has one."""
    kind = readers.file_kind(readers.columns(path))
    wanted = "pairs" if task.comments_per_example == 2 else "classification"
    wanted = "rules" if task.text_pairs else wanted
    if kind != wanted:
        what = {
            "pairs": "a pairs file (less_toxic, more_toxic)",
            "classification": "labelled comments (comment_text or content, with toxic or target)",
            "rules": "a labelled rules file (body, rule, rule_violation)",
        }
        found = f"a {kind} file" if kind else "a file of unknown layout"
        hint = "; to score it, use jaxtpu.predict" if kind in ("score", "unlabelled") else ""
        raise DataError(
            f"--input {path}: a {task.name} run is evaluated on {what[wanted]}; this is "
            f"{found}{hint}"
        )
    data = taskdata.read_task_file(
        path, task, columns=taskdata.aux_columns(task, required=False), template=template
    )
    if task.main_outputs > 1:
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
        pairs = readers.file_kind(readers.columns(path)) == "pairs"
        model = load_model_dir(model_dir, max_len, pairs)
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
    model: Any, path: str, devices: list[Any], batch_size: int
) -> tuple[tokenized.Examples, dict[str, float], Any]:
    """(examples, validation metrics, raw outputs in the file's order) of labelled file `path`
    under `model`, in the length buckets and batch shape `predict`, `jaxtpu.load()` and
    `serve` score in (`Scorer`: fixed power-of-two edges, `batch_size` rows per device), so
    that evaluate's score of a row is theirs, bf16 included."""
    task, d = model.spec.task, model.cfg.data
    data = read_labelled(path, task, d.row_template)
    tokenizer = load_tokenizer(model.tokenizer_dir, model.spec.pad_id)
    examples = tokenized.encode(data, tokenizer, d.max_len, d.cache_dir, task)
    global_batch = batch_size * len(devices)
    edges = fixed_edges(d.max_len)
    batcher = Batcher(examples.real_lengths(), global_batch, d.max_len, edges)
    backend = scoring_backend(model, devices, task)
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


def _print_calibration(report: dict[str, Any]) -> None:
    for column, r in report.get("calibration", {}).items():
        print(
            f"  calibration {column}: ECE {r['ece_before']:.4f} -> {r['ece_after']:.4f}, "
            f"Brier {r['brier_before']:.4f} -> {r['brier_after']:.4f}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    p = command_parser(
        "evaluate",
        "Score a labelled file with the best model of a jaxtpu run, or with a fine-tuned "
        "Hugging Face classifier, and print the metric of its kind: auc, mean_column_auc (six "
        "labels), jigsaw_bias (identity columns), mean_language_auc (a lang column) or "
        "agreement (pairs).",
    )
    args = p.parse_args(argv)
    with user_errors():
        if args.out:
            storage.check_output_file(args.out, "--out", args.overwrite)
        check_command_flags("evaluate", args)
        if args.max_len and not args.model_dir:
            raise UserError("--max-len goes with --model-dir; a run scores with its own")
        if args.model_dir and args.label_weights:
            raise UserError("--label-weights scores the runs' probabilities: give --workdir")
        # a bad value is refused before anything loads
        weights = parse_label_weights(args.label_weights) if args.label_weights else None
        from jaxtpu.engine import hosts

        hosts.use_compilation_cache()
        devices = hosts.scoring_devices(args.num_devices)  # before anything starts JAX
        local = storage.local_input(args.input, "--input")  # a copy, for one in a bucket
        with storage.named(local, args.input):
            if weights is not None:
                report = agreement_report([args.workdir], local, weights, devices, args.batch_size)
            else:
                report = evaluate(
                    args.workdir,
                    local,
                    devices,
                    args.batch_size,
                    args.model_dir,
                    args.max_len or SCORING.max_len,
                )
        report["input"] = args.input
        print(f"{report['metric']}: {report['value']:.6f} ({report['examples']} examples)")
        for key, value in report.items():
            if key not in (
                "metric",
                "value",
                "examples",
                "input",
                "workdir",
                "model_dir",
                "calibration",
                report["metric"],
            ):
                print(f"  {key}: {value:.6f}" if isinstance(value, float) else f"  {key}: {value}")
        _print_calibration(report)
        if args.out:
            storage.write_output_text(args.out, strict_json(report, indent=2) + "\n")
            print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
