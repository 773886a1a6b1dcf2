"""`python -m jaxtpu.predict`: score a file with the best model of a run, or with a PyTorch
training notebook's checkpoint (`--init-from model.bin --model-dir DIR`), in a stream of
`--chunk-rows` comments (`predict_stream`: constant memory, `--resume` after a kill).

Writes `comment_id,score` for the Rate Severity `comments_to_score.csv` (`comment_id`, `text`),
or `id,toxic` for classification files (`comment_text`, optional `id`); a multi-label model
writes Kaggle's `id,toxic,severe_toxic,obscene,threat,insult,identity_hate`. Toxicity and
multi-label models give sigmoid probabilities, rankers their raw score (only the order matters
there); a multi-label model scores a Rate Severity file by the severity weights of its six
probabilities (`jaxtpu.core.data.records.SEVERITY_WEIGHTS`, as ranking pairs are built from labels).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import io
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core import files, hostmem, metrics, storage
from jaxtpu.core.data import readers, records, tokenized
from jaxtpu.core.data.buckets import Batcher, fixed_edges, real_lengths
from jaxtpu.core.data.tokens import encode_texts, load_tokenizer
from jaxtpu.core.errors import UserError
from jaxtpu.core.files import write_text
from jaxtpu.core.flags.cli import add_scoring_flags, check_scoring_flags
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import SCORING, Config, from_dict
from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.run.rundir import check_output_path, user_errors
from jaxtpu.core.severity import parse_label_weights
from jaxtpu.core.severity import severity as weighted_severity
from jaxtpu.core.tasks import LABELS


@dataclass
class TrainedModel:
    cfg: Config
    spec: RunSpec
    module: Any
    params: Any
    meta: dict[str, Any]
    tokenizer_dir: Path


def load_trained(workdir: str | Path) -> TrainedModel:
    """The best checkpoint of a run directory (a path, or a bucket URL: its config.json and
    tokenizer are copied here, the checkpoint is read from the bucket), with its config,
    encoder shape and tokenizer."""
    from jaxtpu import checkpoint
    from jaxtpu.models import encoder as models
    from jaxtpu.models import layers

    wd, tokenizer_dir = run_files(workdir)
    with storage.named(wd, str(workdir)):
        cfg, recorded = read_run_config(wd)
    ckpts = checkpoint.Checkpoints(workdir)
    meta = ckpts.best_meta()
    if meta is None:
        raise UserError(f"--workdir {wd}: no best checkpoint yet (the run has not evaluated)")
    enc = EncoderConfig.from_hf_dict(meta["encoder"])
    spec = RunSpec.of_checkpoint(cfg, enc, recorded.get("resolved"))
    module = models.for_run(cfg, spec, scan=False)
    stored = models.for_run(cfg, spec)  # a scanned run stored its layers stacked
    template = models.param_shapes(stored, spec.task.example_shape(8))
    params, meta = ckpts.restore_best(template, spec.model_key)
    if cfg.model.scan_layers:  # scored and exported as the unscanned model: same weights
        params = layers.unstack_layers(params)
    return TrainedModel(cfg, spec, module, params, meta, tokenizer_dir)


def run_files(workdir: str | Path) -> tuple[Path, Path]:
    """The directory holding a run's config.json, and its tokenizer: a local run's own; for
    a run in a bucket, local copies of them (what scoring reads besides the checkpoint)."""
    if not storage.is_remote(workdir):
        return Path(workdir), Path(workdir) / "tokenizer"
    url = str(workdir)
    if not storage.exists(storage.join(url, "config.json")):
        raise UserError(f"--workdir {url}: no config.json; not a jaxtpu run directory")
    record = storage.fetch(storage.join(url, "config.json"), "--workdir")
    return record.parent, storage.fetch(storage.join(url, "tokenizer"), "--workdir")


def read_run_config(wd: Path) -> tuple[Config, dict[str, Any]]:
    """The config a run directory records (its config.json), or one line saying what `wd` is
    instead: missing, a Hugging Face model directory, or some other directory."""
    record = wd / "config.json"
    if not wd.is_dir():
        raise UserError(f"--workdir {wd}: no such run directory")
    if not record.exists():
        raise UserError(f"--workdir {wd}: no config.json; not a jaxtpu run directory")
    try:
        recorded = json.loads(record.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"--workdir {wd}: unreadable config.json ({e})") from None
    if (
        isinstance(recorded, dict)
        and "config" not in recorded
        and ("model_type" in recorded or "architectures" in recorded)
    ):
        raise UserError(
            f"--workdir {wd} is a Hugging Face model directory, not a jaxtpu run directory: "
            "train from it with --model-dir; predict scores a run (--workdir) or a notebook's "
            "state dict (--init-from FILE --model-dir DIR)"
        )
    if not isinstance(recorded, dict) or not isinstance(recorded.get("config"), dict):
        raise UserError(
            f"--workdir {wd}: its config.json is not a jaxtpu run's (no 'config' section)"
        )
    return from_dict(recorded["config"]), recorded


def load_notebook(init_from: str, model_dir: str, max_len: int) -> TrainedModel:
    """A training notebook's state-dict file (`--init-from`) with the config and tokenizer of
    `model_dir`, scored in fp32 as the notebook's module does in eval mode. Its task is what
    its head scores: one output is scored as toxicity (a ranker's score is the same number),
    six as the multi-label model (`export --format state-dict` of a multilabel run)."""
    from jaxtpu import weights
    from jaxtpu.core.hf.directory import read_notebook_checkpoint

    task = "toxicity"
    if Path(init_from).is_file():
        head = read_notebook_checkpoint(init_from).head.get("classifier.weight")
        if head is not None and head.shape[0] == len(LABELS):
            task = "multilabel"
    cfg = Config().replace(  # validated, as every flag
        init_from=init_from, model_dir=model_dir, max_len=max_len, precision="fp32", task=task
    )
    spec = RunSpec.resolve(cfg, 1)
    model = weights.load_model(cfg, spec, head_required=True)
    return TrainedModel(cfg, spec, model.module, model.params, {}, Path(spec.tokenizer_dir))


def load_model_dir(model_dir: str, max_len: int, pairs: bool = False) -> TrainedModel:
    """A fine-tuned Hugging Face directory, scored without a run: a
    `*ForSequenceClassification` checkpoint (transformers', or a `--head hf` export) with its
    own head, or a jaxtpu export (`head.safetensors`), in fp32. Its task is what its head
    scores: the six Jigsaw labels are the multi-label model, one output toxicity (a ranker
    when `pairs`: the same score of each comment of a pair; an export records its task).

    Raises:
      UserError: a directory without a classification head (a plain encoder), or a head of
        another number of outputs or of other labels than the six Jigsaw ones.
    """
    from jaxtpu import weights
    from jaxtpu.core.hf.directory import HEAD_FILE
    from jaxtpu.core.hf.encoder import (
        exported_head,
        read_classifier_dir,
        read_encoder,
        resolve_model_dir,
    )

    where = resolve_model_dir(model_dir) or ""
    enc = read_encoder(where)
    classifier = read_classifier_dir(where, enc.model_type)
    if classifier is not None:
        head, labels = "hf", classifier.labels
        generic = labels == tuple(f"LABEL_{i}" for i in range(len(labels)))
        if len(labels) == len(LABELS) and (labels == LABELS or generic):
            task = "multilabel"
        elif len(labels) == 1:
            task = "ranking" if pairs else "toxicity"
        else:
            raise UserError(
                f"--model-dir {model_dir}: its head scores {len(labels)} labels "
                f"({', '.join(labels)}); jaxtpu scores one toxicity score or the six Jigsaw "
                f"labels ({', '.join(LABELS)})"
            )
        if generic and len(labels) > 1:
            print(
                f"warning: --model-dir {model_dir} names its labels {', '.join(labels)}; "
                f"scored as {', '.join(LABELS)} in that order",
                file=sys.stderr,
            )
    elif (Path(where) / HEAD_FILE).exists():
        head = "jaxtpu"
        task = exported_head(where).get("task") or "toxicity"
        if task == "toxicity" and pairs:
            task = "ranking"
    else:
        raise UserError(
            f"--model-dir {model_dir}: no classification head (neither a "
            f"*ForSequenceClassification checkpoint nor a jaxtpu export with {HEAD_FILE}); it "
            "is an encoder to train on: jaxtpu train --model-dir DIR"
        )
    cfg = Config().replace(  # validated, as every flag
        model_dir=model_dir, max_len=max_len, precision="fp32", task=task, head=head
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

    fns = steps.for_task(task, model.cfg.train.margin)
    strategy = parallel.make_strategy("jit", devices, fns)
    state = steps.TrainState.create(
        apply_fn=model.module.apply, params=model.params, tx=optax.identity()
    )
    backend = JaxBackend(strategy, state, seed=0)
    backend.start()
    return backend


def one_comment_task(task: Any) -> Any:
    """How a model scores single comments: every task's model scores one comment per row, a
    ranker as toxicity does, a multi-label model as itself (its scores per comment)."""
    from jaxtpu.core.tasks import get_task

    return task if task.comments_per_example == 1 else get_task("toxicity")


class Scorer:
    """A model ready to score comments on `devices`: its tokenizer, a backend that keeps its
    compiled programs, and fixed length buckets (powers of two up to the run's --max-len), so
    each length compiles once whatever it is given (`predict`'s chunks, the Python API's
    calls)."""

    def __init__(self, model: TrainedModel, devices: list[Any], batch_size: int) -> None:
        self.model = model
        self.task = one_comment_task(model.spec.task)
        self.tokenizer = load_tokenizer(model.tokenizer_dir)
        self.max_len = model.cfg.data.max_len
        self.global_batch = batch_size * len(devices)
        self.backend = scoring_backend(model, devices, self.task)
        self.edges = fixed_edges(self.max_len)

    def logits(self, texts: list[str]) -> np.ndarray:
        """The raw outputs for (normalized) `texts`: (N,) or (N, labels); tokenized in memory,
        without the disk cache (each text is scored once)."""
        from jaxtpu.core.run import loop

        if not texts:
            return np.zeros((0, *self.task.label_shape), np.float32)
        ids, mask = encode_texts(texts, self.tokenizer, self.max_len)
        label = self.task.zeros((len(texts),), self.max_len)["label"]  # Task.batch_layout's
        batcher = Batcher(real_lengths(mask), self.global_batch, self.max_len, self.edges)
        layout = self.task.batch_layout(self.max_len)
        examples = tokenized.Examples(ids, mask, label, layout=layout)
        _, scores = loop.score_examples(self.backend, examples, batcher, self.task)
        return scores


# --------------------------------------------------------------------------- the stream


@dataclass
class Progress:
    """Where a predict into `output` stands: its rows and bytes written so far, kept beside
    the unfinished file (`.NAME.partial`) so a killed predict can continue (`--resume`), and
    what it was scoring, so it continues only the same work."""

    output: Path
    work: dict[str, Any]

    @property
    def partial(self) -> Path:
        return self.output.with_name(f".{self.output.name}.partial")

    @property
    def record(self) -> Path:
        return self.output.with_name(f".{self.output.name}.progress.json")

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """This predict's hold on `output`: a second predict into the same file is refused
        while it lasts (as a second run on a run directory is)."""
        lock = self.output.with_name(f".{self.output.name}.lock")
        self.output.parent.mkdir(parents=True, exist_ok=True)  # checked: it can be made
        fd, holder = files.take_lock(lock)
        if fd is None:
            raise UserError(
                f"--output {self.output} is being written by another predict ({holder}); wait "
                "for it to end, or choose another --output"
            )
        try:
            yield
        finally:
            files.release_lock(fd, lock)

    def discard(self) -> None:
        """Removes the partial file and its record (a predict refused for its input leaves
        nothing that looks like a stopped predict)."""
        self.partial.unlink(missing_ok=True)
        self.record.unlink(missing_ok=True)

    def stopped(self) -> dict[str, Any] | None:
        """The record of a predict that stopped before finishing, if any."""
        try:
            return json.loads(self.record.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise UserError(
                f"{self.record}: unreadable ({e}); remove it or pass --overwrite"
            ) from None

    def save(self, rows: int, size: int, digest: str, written: int | None = None) -> None:
        """Records `rows` rows scored into `size` bytes of the partial file (`written` rows
        written, fewer than read for pseudo-labels), and the digest of the input rows read
        so far (a resumed predict checks it: the input is the same)."""
        written = rows if written is None else written
        record = {**self.work, "rows": rows, "bytes": size, "digest": digest, "written": written}
        write_text(self.record, json.dumps(record))

    def finish(self) -> None:
        os.replace(self.partial, self.output)
        self.record.unlink(missing_ok=True)


def predict_stream(
    scorers: list[Scorer], source: str, progress: Progress, severity: bool, resume: dict | None
) -> tuple[int, int, int]:
    """Scores `source` `chunk_rows` at a time (the mean over `scorers`), appending each
    chunk's rows to the partial file and then recording them, so memory stays that of one
    chunk and a killed run continues from its last recorded chunk with the same chunks, the
    same batches and so the same bytes. With the work's `pseudo_label`, the file is a
    training file instead (`pseudo_rows`). Returns (rows read, empty comments, rows
    written)."""
    task, every = scorers[0].task, progress.work.get("all_outputs", False)
    pseudo, confidence = progress.work.get("pseudo_label", False), progress.work.get("confidence")
    weights = progress.work.get("label_weights")
    weights = None if weights is None else parse_label_weights(weights)
    columns, _ = outputs(np.zeros((0, *task.label_shape), np.float32), task, severity, every)
    if pseudo:
        columns = ["id", "comment_text", *task.label_columns]
        severity = False  # probabilities of the labels, whatever the file's kind
    chunk_rows = progress.work["chunk_rows"]
    done, size = (resume["rows"], resume["bytes"]) if resume else (0, 0)
    bar = _bar(done)
    empty, written = 0, (resume or {}).get("written", 0)
    digest = hashlib.sha256()  # of the rows read: ids and texts
    try:  # a predict refused for its input leaves nothing that looks like a stopped one
        with open(progress.partial, "r+b" if resume else "wb") as f:
            f.truncate(size)  # rows written after the last record are written again
            f.seek(size)
            if not resume:
                f.write(_csv_bytes([columns]))
            for k, chunk in enumerate(readers.comments_to_score(source, chunk_rows)):
                start = k * chunk_rows
                if resume and start == resume["rows"]:
                    _check_same_rows(digest, resume, source)
                for text in [*(chunk.ids or ()), "\x1e", *chunk.texts]:
                    digest.update(text.encode("utf-8", "surrogatepass") + b"\x1f")
                if start < done:
                    continue
                empty += chunk.dropped
                each = [
                    outputs(s.logits(chunk.texts), task, severity, every, weights)[1]
                    for s in scorers
                ]
                mean = np.mean(each, 0)
                ids = chunk.ids or [str(start + j) for j in range(len(chunk))]
                if pseudo:
                    lines = pseudo_rows(ids, chunk.texts, mean, confidence)
                else:
                    lines = [[i, *row] for i, row in zip(ids, mean.tolist(), strict=True)]
                f.write(_csv_bytes(lines))
                f.flush()
                os.fsync(f.fileno())
                done, written = start + len(chunk), written + len(lines)
                progress.save(done, f.tell(), digest.hexdigest(), written)
                bar(len(chunk), done)
            if resume and resume["rows"] >= done:  # no row after where it stopped: none new
                _check_same_rows(digest, resume, source)
    except UserError:
        if not resume:  # a stopped predict's rows stay for --resume
            progress.discard()
        raise
    progress.finish()
    return done, empty, written


def pseudo_rows(
    ids: list[str], texts: Sequence[str], probs: np.ndarray, confidence: float | None
) -> list[list[Any]]:
    """The rows of a pseudo-labelled training file: id, the comment, the probabilities as
    soft targets; empty comments left out, and with `confidence` c only the rows whose first
    probability (`toxic`) is <= 1 - c or >= c."""
    first = probs if probs.ndim == 1 else probs[:, 0]
    sure = (
        np.ones(len(first), bool)
        if confidence is None
        else np.maximum(first, 1 - first) >= confidence
    )
    return [
        [i, t, *np.atleast_1d(p).tolist()]
        for i, t, p, keep in zip(ids, texts, probs, sure, strict=True)
        if keep and t
    ]


def _check_same_rows(digest: Any, resume: dict[str, Any], source: str) -> None:
    """Continues a stopped predict only when the input rows up to where it stopped are the
    ones it scored (not edited or replaced since)."""
    if digest.hexdigest() != resume.get("digest"):
        raise UserError(
            f"--resume: the first {resume['rows']} rows of --input {source} are not the ones "
            "the stopped predict scored (the file changed since); pass --overwrite to score "
            "it again from the start"
        )
    print(f"resuming after {resume['rows']} rows", file=sys.stderr)


def _csv_bytes(rows: Any) -> bytes:
    text = io.StringIO(newline="")
    csv.writer(text).writerows(rows)
    return text.getvalue().encode("utf-8")


def _bar(done: int) -> Any:
    """Progress on stderr: a tqdm bar on a terminal, one line per chunk in a log."""
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(initial=done, unit=" rows", desc="scoring", file=sys.stderr)
        return lambda n, _: bar.update(n)
    started, first = time.perf_counter(), done

    def line(n: int, total: int) -> None:
        rate = (total - first) / max(time.perf_counter() - started, 1e-9)
        print(f"scored {total} rows ({rate:.0f} rows/s)", file=sys.stderr, flush=True)

    return line


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m jaxtpu.predict",
        description="Score a CSV with the best checkpoint of a jaxtpu run, a fine-tuned Hugging "
        "Face classifier directory (--model-dir), or a PyTorch notebook's state-dict file "
        "(--init-from).",
    )
    source = p.add_mutually_exclusive_group()
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
        help="Alone: a fine-tuned classifier to score (a *ForSequenceClassification checkpoint "
        "of one score or the six Jigsaw labels, or a jaxtpu export). With --init-from: the "
        "Hugging Face directory with the model's config.json and tokenizer ('minilm' = the "
        "packaged MiniLM).",
    )
    p.add_argument(
        "--input",
        required=True,
        help="File to score (CSV, or .parquet/.pq, .jsonl/.ndjson): comments_to_score.csv "
        "(comment_id,text), or comment_text (or the Multilingual test.csv's content) with an "
        "optional id.",
    )
    p.add_argument("--output", required=True, help="Where to write the scores (CSV).")
    add_scoring_flags(p, ("max_len", "num_devices", "batch_size", "chunk_rows"), unset=("max_len",))
    p.add_argument("--overwrite", action="store_true", help="Replace an existing --output.")
    p.add_argument(
        "--pseudo-label",
        action="store_true",
        help="Write a training file instead of scores: id, comment_text and the model's (an "
        "ensemble's mean) probability of each label as a soft target, for `jaxtpu train "
        "--extra-train` (the Multilingual winners' pseudo-labelling round). Empty comments are "
        "left out.",
    )
    p.add_argument(
        "--confidence",
        type=float,
        default=None,
        help="With --pseudo-label: keep only the comments whose toxic probability is >= C or "
        "<= 1 - C (0.5 < C < 1). [default: every comment]",
    )
    p.add_argument(
        "--label-weights",
        help="A multilabel model on a Rate Severity file (comment_id, text): score each comment "
        "by these weights of its six label probabilities (w1,...,w6 in the order toxic, "
        "severe_toxic, obscene, threat, insult, identity_hate; `jaxtpu severity-weights` "
        "searches them) instead of the built-in severity weights.",
    )
    p.add_argument(
        "--all-outputs",
        action="store_true",
        help="Also write the probability of each auxiliary target of a run trained with "
        "--aux-columns (after the task's own columns); without it, the task's columns alone.",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="Continue a predict into --output that was stopped (killed, preempted) from its "
        "last finished chunk; the file it ends with is the one an uninterrupted run writes. "
        "Refused when the input, models or settings differ.",
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
    if args.resume and args.overwrite:
        raise UserError("--resume continues a stopped predict, --overwrite starts again: one")
    check_scoring_flags(args)
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
    from jaxtpu import hosts

    hosts.use_compilation_cache()
    devices = hosts.init_devices(args.num_devices)  # before anything starts JAX
    header = readers.columns(args.input)
    if args.workdir:
        models = [load_trained(w) for w in args.workdir]
        check_ensemble(models, args.workdir)
    elif args.init_from:
        models = [load_notebook(args.init_from, args.model_dir, _max_len(args))]
    else:
        models = [load_model_dir(args.model_dir, _max_len(args))]
    severity = readers.file_kind(header) == "score"
    task = models[0].spec.task
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
    progress = Progress(out, _work(args))
    with progress.held():
        resume = _resume(progress, args)
        scorers = [Scorer(m, devices, args.batch_size) for m in models]
        rows, empty, written = predict_stream(scorers, args.input, progress, severity, resume)
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
    else:
        print(f"wrote {what}{rows} scores to {out}")
    return 0


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


def check_ensemble(models: list[TrainedModel], workdirs: Sequence[str]) -> None:
    """Models averaged together must score the same thing from the same tokens."""
    from jaxtpu.core.data.tokens import tokenizer_fingerprint

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


def outputs(
    scores: np.ndarray,
    task: Any,
    severity: bool,
    every: bool = False,
    label_weights: Any = None,
) -> tuple[list[str], np.ndarray]:
    """(header, values (N, columns)) of the output file: `comment_id,score` for a Rate
    Severity file (`severity`; a multi-label model ranks by the severity weights of its six
    probabilities, as pairs are built from labels; other models by their raw score), else
    Kaggle's submission, `id` and a probability per label the model scores (`every`: and per
    auxiliary target, `Task.aux_columns`). `label_weights` (--label-weights) replace the
    severity weights."""
    if severity:
        scores = task.main(scores)
        if scores.ndim == 2:
            weights = records.SEVERITY_WEIGHTS if label_weights is None else label_weights
            scores = weighted_severity(metrics.probability(scores), weights)
        return ["comment_id", "score"], np.asarray(scores, np.float64).reshape(-1, 1)
    return ["id", *task.score_columns(every)], task.predictions(scores, every)


if __name__ == "__main__":
    hostmem.reexec_with_huge_pages()
    sys.exit(main())
