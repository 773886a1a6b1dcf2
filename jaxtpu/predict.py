"""`python -m jaxtpu.predict`: score a file with the best model of a run, or with a PyTorch
training notebook's checkpoint (`--init-from model.bin --model-dir DIR`), in a stream of
`--chunk-rows` comments (`predict_stream`: constant memory, `--resume` after a kill).

Writes `comment_id,score` for the Rate Severity `comments_to_score.csv` (`comment_id`, `text`),
or `id,toxic` for classification files (`comment_text`, optional `id`); a multi-label model
writes Kaggle's `id,toxic,severe_toxic,obscene,threat,insult,identity_hate`. Toxicity and
multi-label models give sigmoid probabilities, rankers their raw score (only the order matters
there); a multi-label model scores a Rate Severity file by the severity weights of its six
probabilities (`jaxtpu.core.tasks.SEVERITY_WEIGHTS`, as ranking pairs are built from labels).
A rules model scores an Agile Community Rules test file into its submission, `row_id,
rule_violation` (with `--rank-by-rule`, per-rule ranks averaged over an ensemble).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jaxtpu.core import storage
from jaxtpu.core.data import readers
from jaxtpu.core.data.filekinds import FileKind, described, kind_of
from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.commands import check_command_flags, command_parser
from jaxtpu.core.flags.schema import SCORING
from jaxtpu.core.run.exits import user_errors
from jaxtpu.core.severity import parse_label_weights
from jaxtpu.core.storage import check_output_path
from jaxtpu.core.tasks import LABELS
from jaxtpu.engine.predictions import Progress, predict_stream
from jaxtpu.engine.scoring import (
    Scorer,
    check_ensemble,
    load_model_dir,
    load_notebook,
    load_trained,
)


def main(argv: Sequence[str] | None = None) -> int:
    p = command_parser(
        "predict",
        "Score a CSV with the best checkpoint of a jaxtpu run, a fine-tuned Hugging Face "
        "classifier directory (--model-dir), or a PyTorch notebook's state-dict file "
        "(--init-from).",
    )
    args = p.parse_args(argv)
    with user_errors():
        return _predict(args)


def _predict(args: argparse.Namespace) -> int:
    """`main` once the flags are parsed. An --output in a bucket is written here first (its
    progress kept in the local cache, for --resume on this machine) and uploaded when whole;
    an --input or --init-from in a bucket is read from a local copy."""
    url = args.output if storage.is_remote(args.output) else ""
    if url:
        if storage.exists(url) and not args.overwrite:
            raise UserError(f"--output {url} exists; pass --overwrite to replace it")
        storage.check_writable(url, "--output")
        out = storage.output_copy(url)
        out.unlink(missing_ok=True)  # a finished copy whose upload failed: scored again
    else:
        out = Path(args.output)
        check_output_path(out, "--output")
    if out.exists() and not args.overwrite:
        raise UserError(f"--output {out} exists; pass --overwrite to replace it")
    source = args.input
    args.input = storage.local_input(args.input, "--input")
    if args.init_from:
        args.init_from = storage.local_input(args.init_from, "--init-from")
    with storage.named(args.input, source):
        code = _score(args, out)
    if url:
        storage.put(out, url)
        print(f"uploaded {out.name} to {url}")
    return code


def _score(args: argparse.Namespace, out: Path) -> int:
    """Scores the input into `out` (`main`'s work once paths are local)."""
    _check_flags(args)
    from jaxtpu.engine import hosts

    hosts.use_compilation_cache()
    devices = hosts.scoring_devices(args.num_devices)  # before anything starts JAX
    header = readers.columns(args.input)
    if args.workdir:
        models = [load_trained(w) for w in args.workdir]
        check_ensemble(models, args.workdir, ranks=args.rank_by_rule)
    elif args.init_from:
        models = [load_notebook(args.init_from, args.model_dir, _max_len(args))]
    else:
        models = [load_model_dir(args.model_dir, _max_len(args))]
    kind = kind_of(header)
    _check_models(args, models, kind)
    progress = Progress(out, _work(args))
    with progress.held():
        resume = _resume(progress, args)
        scorers = [Scorer(m, devices, args.batch_size, not args.no_calibration) for m in models]
        rows, empty, written = predict_stream(scorers, args.input, progress, kind, resume)
    if empty:
        what = "left out" if args.pseudo_label else "scored as empty text"
        print(f"warning: {empty} of {rows} comments are empty; {what}", file=sys.stderr)
    what = f"the mean of {len(models)} models' " if len(models) > 1 else ""
    if args.pseudo_label:
        sure = f" scored at least {args.confidence:g} sure" if args.confidence else ""
        print(
            f"wrote {written} of {rows} comments{sure} as pseudo-labels ({what}"
            f"probabilities as soft targets) to {out}: train on them with --extra-train {out}"
        )
    elif args.rank_by_rule:
        print(
            f"wrote {rows} rank scores to {out}: each model's score ranked within its rule, "
            f"in [0, 1]{f', averaged over {len(models)} models' if len(models) > 1 else ''} "
            "(not probabilities; each rule's order is all they keep)"
        )
    else:
        print(f"wrote {what}{rows} scores to {out}")
    return 0


def _check_flags(args: argparse.Namespace) -> None:
    """The flags that do not go together, refused before anything loads."""
    if args.resume and args.overwrite:
        raise UserError("--resume continues a stopped predict, --overwrite starts again: one")
    check_command_flags("predict", args)
    if args.label_weights:
        parse_label_weights(args.label_weights)  # a bad value before anything loads
    if args.confidence is not None and not (args.pseudo_label and 0.5 < args.confidence < 1):
        raise UserError(
            f"--confidence {args.confidence:g}: goes with --pseudo-label, a probability "
            "between 0.5 and 1 (exclusive)"
        )
    if args.init_from and not args.model_dir:
        raise UserError("--init-from needs --model-dir (the config.json and tokenizer)")
    if args.workdir and (args.model_dir or args.max_len):
        raise UserError("--model-dir and --max-len score a model without a run; a run has its own")
    if not (args.workdir or args.model_dir):
        raise UserError(
            "give the model to score: --workdir RUN, --model-dir DIR, or --init-from FILE "
            "--model-dir DIR"
        )


def _check_models(args: argparse.Namespace, models: list[Any], kind: FileKind | None) -> None:
    """The flags that do not fit the models loaded or the kind of file (`kind`: the input's,
    `jaxtpu.core.data.filekinds`), read from the task's and the kind's records."""
    task = models[0].spec.task
    severity = kind is not None and kind.severity
    if kind is None or kind.name not in task.predicts:
        found = kind.what if kind else "a file of unknown layout"
        raise UserError(
            f"--input {args.input}: a {task.name} model scores {described(task.predicts)}; "
            f"this is {found}"
        )
    if args.pseudo_label and not kind.pseudo_labels:
        raise UserError(
            f"--pseudo-label writes comments with toxicity targets; {kind.what} is scored as "
            f"{kind.id_column},{','.join(task.label_columns)} ({kind.instead} instead)"
        )
    if args.rank_by_rule and not kind.by_rule:
        raise UserError(
            "--rank-by-rule ranks a rules model's scores within each rule of an Agile Community "
            "Rules file; this is not one"
        )
    if args.label_weights and not (severity and task.label_columns == LABELS):
        raise UserError(
            "--label-weights scores a Rate Severity file (comment_id, text) with a "
            f"multilabel model; this is a {task.name} model on "
            f"{'that file' if severity else 'a file of another kind'}"
        )
    if args.all_outputs and (severity or len({m.spec.task.aux_columns for m in models}) > 1):
        raise UserError(
            "--all-outputs writes every output of one kind of model to a classification "
            "file's scores; "
            + (
                "a Rate Severity file gets one score per comment"
                if severity
                else "these runs have different --aux-columns"
            )
        )
    if args.pseudo_label and (task.comments_per_example == 2 or args.all_outputs):
        raise UserError(
            "--pseudo-label writes a classification model's probabilities as training "
            "targets; "
            + (
                "drop --all-outputs (the file holds the task's own labels)"
                if args.all_outputs
                else "a ranker's scores are not probabilities"
            )
        )
    if (
        severity
        and task.main_outputs > 1
        and task.label_columns != LABELS
        and not args.pseudo_label
    ):
        raise UserError(
            f"--input {args.input}: a Rate Severity file needs one score per comment; "
            f"this {task.name} model scores {', '.join(task.label_columns)}"
        )


def _max_len(args: argparse.Namespace) -> int:
    """--max-len of a model scored without a run, or the scoring default."""
    return args.max_len or SCORING.max_len


def _work(args: argparse.Namespace) -> dict[str, Any]:
    """What a predict scores and how: a resumed one must match it."""
    source = Path(args.input)
    if args.workdir:
        models = [w if storage.is_remote(w) else str(Path(w).resolve()) for w in args.workdir]
    else:
        init = str(Path(args.init_from).resolve()) if args.init_from else None
        models = [init, str(args.model_dir), _max_len(args)]
    return {
        "input": str(source.resolve()),
        "models": models,
        "chunk_rows": args.chunk_rows,
        "batch_size": args.batch_size,
        "num_devices": args.num_devices,
        "all_outputs": args.all_outputs,
        "pseudo_label": args.pseudo_label,
        "confidence": args.confidence,
        "label_weights": args.label_weights,
        "rank_by_rule": args.rank_by_rule,
        "calibrated": not args.no_calibration,
    }


def _resume(progress: Progress, args: argparse.Namespace) -> dict[str, Any] | None:
    """The stopped predict to continue (--resume), or None to start afresh; a stopped one is
    never overwritten silently."""
    out = progress.output
    stopped = progress.stopped()
    if stopped is None or not progress.partial.exists():
        if args.resume:
            raise UserError(f"--resume: no stopped predict into --output {out} to continue")
        return None
    if not args.resume:
        if args.overwrite:
            return None
        raise UserError(
            f"--output {out}: a predict into it stopped after {stopped.get('rows', 0)} rows; "
            "pass --resume to continue it or --overwrite to start again"
        )
    for key, value in progress.work.items():
        if stopped.get(key) != value:
            raise UserError(
                f"--resume: the stopped predict into {out} had {key} {stopped.get(key)!r}, "
                f"this one {value!r}; continue it with the same input and settings, or pass "
                "--overwrite to start again"
            )
    return stopped


if __name__ == "__main__":
    sys.exit(main())
