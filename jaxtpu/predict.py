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
from jaxtpu.core.data.filekinds import kind_of
from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.commands import check_command_flags, command_parser
from jaxtpu.core.flags.schema import SCORING
from jaxtpu.core.run.exits import user_errors
from jaxtpu.core.severity import parse_label_weights
from jaxtpu.core.storage import check_output_path
from jaxtpu.engine.predictions import Progress, check_fits, predict_stream, resume_of
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
    work = _work(args)
    check_fits(args.input, work, models, kind)
    progress = Progress(out, work)
    with progress.held():
        resume = resume_of(progress, args.resume, args.overwrite)
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


if __name__ == "__main__":
    sys.exit(main())
