"""`python -m jaxtpu.predict`: score a CSV with the best model of a run, or with a PyTorch
training notebook's checkpoint (`--init-from model.bin --model-dir DIR`).

Writes `comment_id,score` for the Rate Severity `comments_to_score.csv` (`comment_id`, `text`),
or `id,toxic` for classification files (`comment_text`, optional `id`); a multi-label model
writes Kaggle's `id,toxic,severe_toxic,obscene,threat,insult,identity_hate`. Toxicity and
multi-label models give sigmoid probabilities, rankers their raw score (only the order matters
there); a multi-label model scores a Rate Severity file by the severity weights of its six
probabilities (`jaxtpu.core.data.SEVERITY_WEIGHTS`, as ranking pairs are built from labels).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core import data as jdata
from jaxtpu.core import hostmem
from jaxtpu.core.buckets import Batcher
from jaxtpu.core.config import Config, from_dict
from jaxtpu.core.encoder import EncoderConfig
from jaxtpu.core.errors import UserError
from jaxtpu.core.files import atomic_write
from jaxtpu.core.rundir import check_output_path, user_errors
from jaxtpu.core.spec import RunSpec
from jaxtpu.core.tasks import LABELS
from jaxtpu.core.tokens import load_tokenizer, tokenize


@dataclass
class TrainedModel:
    cfg: Config
    spec: RunSpec
    module: Any
    params: Any
    meta: dict[str, Any]
    tokenizer_dir: Path


def load_trained(workdir: str | Path) -> TrainedModel:
    """The best checkpoint of a run directory, with its config, encoder shape and tokenizer."""
    from jaxtpu import checkpoint, models

    wd = Path(workdir)
    record = wd / "config.json"
    if not record.exists():
        raise UserError(f"--workdir {wd}: no config.json; not a jaxtpu run directory")
    recorded = json.loads(record.read_text())
    cfg = from_dict(recorded["config"])
    ckpts = checkpoint.Checkpoints(wd)
    meta = ckpts.best_meta()
    if meta is None:
        raise UserError(f"--workdir {wd}: no best checkpoint yet (the run has not evaluated)")
    enc = EncoderConfig.from_hf_dict(meta["encoder"])
    spec = RunSpec.of_checkpoint(cfg, enc, recorded.get("resolved"))
    module = models.for_run(cfg, spec, scan=False)
    stored = models.for_run(cfg, spec)  # a scanned run stored its layers stacked
    template = models.param_shapes(stored, spec.task.example_shape(8))
    params, meta = ckpts.restore_best(template, spec.identity)
    if cfg.model.scan_layers:  # scored and exported as the unscanned model: same weights
        params = models.unstack_layers(params)
    return TrainedModel(cfg, spec, module, params, meta, wd / "tokenizer")


def load_notebook(init_from: str, model_dir: str, max_len: int) -> TrainedModel:
    """A training notebook's state-dict file (`--init-from`) with the config and tokenizer of
    `model_dir`, scored in fp32 as the notebook's module does in eval mode."""
    from jaxtpu import weights

    cfg = Config().replace(  # validated, as every flag
        init_from=init_from, model_dir=model_dir, max_len=max_len, precision="fp32"
    )
    spec = RunSpec.resolve(cfg, 1)
    model = weights.load_model(cfg, spec, head_required=True)
    return TrainedModel(cfg, spec, model.module, model.params, {}, Path(spec.tokenizer_dir))


def scoring_backend(model: TrainedModel, devices: list[Any], task: Any) -> Any:
    """A backend that evaluates `model` on `devices` (jit, data-parallel) as `task` lays its
    batches out; it keeps its compiled programs for every batch shape it meets."""
    import optax

    from jaxtpu import parallel, steps
    from jaxtpu.backend import JaxBackend

    strategy = parallel.make_strategy("jit", devices, task.name, margin=model.cfg.run.margin)
    state = steps.TrainState.create(
        apply_fn=model.module.apply, params=model.params, tx=optax.identity()
    )
    return JaxBackend(strategy, state, seed=0)


def one_comment_task(task: Any) -> Any:
    """How a model scores single comments: every task's model scores one comment per row, a
    ranker as toxicity does, a multi-label model as itself (its scores per comment)."""
    from jaxtpu.core.tasks import get_task

    return task if task.comments_per_example == 1 else get_task("toxicity")


def score_texts(model: TrainedModel, texts: list[str], devices: list[Any], batch_size: int):
    """Model scores (logits) of `texts`, each scored once, data-parallel over `devices`."""
    from jaxtpu.core import loop

    tokenizer = load_tokenizer(model.tokenizer_dir)
    ids, mask, _ = tokenize(texts, tokenizer, model.cfg.data.max_len, model.cfg.data.cache_dir)
    single = one_comment_task(model.spec.task)
    label = single.zeros((len(texts),), model.cfg.data.max_len)["label"]  # Task.batch_spec's
    examples = jdata.Examples(ids, mask, label)
    backend = scoring_backend(model, devices, single)
    # Scored in length buckets chosen from these texts: one compilation per bucket, the
    # same logits as at full padding (tests/test_buckets.py).
    batcher = Batcher.for_data("auto", mask, batch_size * len(devices), model.cfg.data.max_len)
    _, scores = loop.score_examples(backend, examples, batcher, single)
    return scores


def write_csv(path: Path, header: Sequence[str], rows: Any) -> None:
    """Writes atomically: a killed run never leaves a half-written submission."""
    with atomic_write(path, newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m jaxtpu.predict",
        description="Score a CSV with the best checkpoint of a jaxtpu run, or with a PyTorch "
        "notebook's state-dict file (--init-from).",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--workdir",
        nargs="+",
        help="Run directory written by jaxtpu.train (its best model); several (the folds or "
        "seeds of one recipe) are an ensemble: the mean of their probabilities (rankers: of "
        "their scores).",
    )
    source.add_argument(
        "--init-from",
        help="Instead of a run: a PyTorch training notebook's state-dict file (.bin/.pt, or a "
        "Lightning .ckpt) with a BERT encoder and a Linear(hidden, 1) head; needs --model-dir.",
    )
    p.add_argument(
        "--model-dir",
        help="With --init-from: the Hugging Face directory with the model's config.json and "
        "tokenizer ('minilm' = the packaged MiniLM).",
    )
    p.add_argument(
        "--max-len",
        type=int,
        help="With --init-from: tokens per comment (a run uses its own) [default: 128].",
    )
    p.add_argument(
        "--input",
        required=True,
        help="CSV to score: comments_to_score.csv (comment_id,text), or comment_text (or the "
        "Multilingual test.csv's content) with an optional id.",
    )
    p.add_argument("--output", required=True, help="Where to write the scores (CSV).")
    p.add_argument("--num-devices", type=int, default=8, help="Devices to score on.")
    p.add_argument("--batch-size", type=int, default=16, help="Comments per device per batch.")
    p.add_argument("--overwrite", action="store_true", help="Replace an existing --output.")
    args = p.parse_args(argv)
    with user_errors():
        out = Path(args.output)
        check_output_path(out, "--output")
        if out.exists() and not args.overwrite:
            raise UserError(f"--output {out} exists; pass --overwrite to replace it")
        if args.batch_size < 1 or args.num_devices < 1:
            raise UserError("--batch-size and --num-devices must be >= 1")
        if args.init_from and not args.model_dir:
            raise UserError("--init-from needs --model-dir (the config.json and tokenizer)")
        if args.workdir and (args.model_dir or args.max_len):
            raise UserError("--model-dir and --max-len go with --init-from; a run has its own")
        from jaxtpu import hosts

        hosts.use_compilation_cache()
        devices = hosts.init_devices(args.num_devices)  # before anything starts JAX
        header = jdata.columns(args.input)
        comments = jdata.read_comments(args.input, labelled=False)
        if args.workdir:
            models = [load_trained(w) for w in args.workdir]
            check_ensemble(models, args.workdir)
        else:
            models = [load_notebook(args.init_from, args.model_dir, args.max_len or 128)]
        severity = jdata.file_kind(header) == "score"
        task = models[0].spec.task
        if severity and task.outputs > 1 and task.label_columns != LABELS:
            raise UserError(
                f"--input {args.input}: a Rate Severity file needs one score per comment; "
                f"this {task.name} model scores {', '.join(task.label_columns)}"
            )
        columns, values = None, []
        for i, model in enumerate(models):
            if len(models) > 1:
                print(f"model {i + 1} of {len(models)}: {args.workdir[i]}", flush=True)
            scores = score_texts(model, comments.texts, devices, args.batch_size)
            columns, model_values = outputs(scores, task, severity)
            values.append(model_values)
        assert columns is not None
        mean = np.mean(values, axis=0)
        ids = comments.ids if any(comments.ids) else [str(i) for i in range(len(mean))]
        rows = ([i, *row] for i, row in zip(ids, mean.tolist(), strict=True))
        write_csv(out, columns, rows)
        what = f"the mean of {len(models)} models' " if len(models) > 1 else ""
        print(f"wrote {what}{len(mean)} scores to {out}")
    return 0


def check_ensemble(models: list[TrainedModel], workdirs: Sequence[str]) -> None:
    """Models averaged together must score the same thing from the same tokens."""
    from jaxtpu.core.tokens import tokenizer_fingerprint

    first = models[0]
    fingerprint = tokenizer_fingerprint(load_tokenizer(first.tokenizer_dir))
    for model, wd in zip(models[1:], workdirs[1:], strict=True):
        if model.spec.task.name != first.spec.task.name:
            raise UserError(
                f"--workdir {wd} is a {model.spec.task.name} run, {workdirs[0]} a "
                f"{first.spec.task.name} run; an ensemble averages runs of one task"
            )
        if tokenizer_fingerprint(load_tokenizer(model.tokenizer_dir)) != fingerprint:
            raise UserError(
                f"--workdir {wd} has another tokenizer than {workdirs[0]}; an ensemble averages "
                "runs of one model family and tokenizer"
            )


def outputs(scores: np.ndarray, task: Any, severity: bool) -> tuple[list[str], np.ndarray]:
    """(header, values (N, columns)) of the output file: `comment_id,score` for a Rate
    Severity file (`severity`; a multi-label model ranks by the severity weights of its six
    probabilities, as pairs are built from labels; other models by their raw score), else
    Kaggle's submission, `id` and a probability per label the model scores."""
    if severity:
        if scores.ndim == 2:
            scores = (1.0 / (1.0 + np.exp(-scores))) @ jdata.SEVERITY_WEIGHTS
        return ["comment_id", "score"], np.asarray(scores, np.float64).reshape(-1, 1)
    probs = 1.0 / (1.0 + np.exp(-np.asarray(scores, np.float64)))
    labels = list(task.label_columns) if probs.ndim == 2 else ["toxic"]
    return ["id", *labels], probs.reshape(len(probs), -1)


if __name__ == "__main__":
    hostmem.reexec_with_huge_pages()
    sys.exit(main())
