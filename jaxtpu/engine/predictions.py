"""Predictions written to a file as a resumable stream (framework-free): `predict_stream`
scores an input `--chunk-rows` comments at a time with `Scorer`s and appends each chunk to a
partial file whose `Progress` record lets a killed predict continue (`--resume`) to the same
bytes; `outputs` is the file's format (Kaggle's submission columns, Rate Severity's
`comment_id,score`), `pseudo_rows` a pseudo-labelled training file's.
"""

from __future__ import annotations

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
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxtpu.core import files, metrics
from jaxtpu.core.data import readers
from jaxtpu.core.data.filekinds import BY_NAME, FileKind, described
from jaxtpu.core.errors import UserError
from jaxtpu.core.files import write_text
from jaxtpu.core.severity import parse_label_weights
from jaxtpu.core.severity import severity as weighted_severity
from jaxtpu.core.tasks import LABELS, SEVERITY_WEIGHTS
from jaxtpu.core.textformat import PROMPT

if TYPE_CHECKING:
    from jaxtpu.engine.scoring import Scorer


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
    scorers: list[Scorer], source: str, progress: Progress, kind: FileKind, resume: dict | None
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
    rank_by_rule = progress.work.get("rank_by_rule", False)
    columns, _ = outputs(np.zeros((0, *task.label_shape), np.float32), task, kind, every)
    if pseudo:
        columns = ["id", "comment_text", *task.label_columns]
        kind = BY_NAME["classification"]  # the labels' probabilities, whatever the file
    # ranks within each rule need every row of the file at once
    chunk_rows = sys.maxsize if rank_by_rule else progress.work["chunk_rows"]
    done, size = (resume["rows"], resume["bytes"]) if resume else (0, 0)
    bar = _bar(done)
    empty, written = 0, (resume or {}).get("written", 0)
    digest = hashlib.sha256()  # of the rows read: ids and texts
    try:  # a predict refused for its input leaves nothing that looks like a stopped one
        with open(progress.partial, "r+b" if resume else "wb") as f:
            f.truncate(size)  # rows written after the last record are written again
            f.seek(size)
            if not resume:
                f.write(csv_bytes([columns]))
            fmt = scorers[0].model.spec.text_format
            for k, chunk in enumerate(readers.comments_to_score(source, chunk_rows, fmt)):
                start = k * chunk_rows
                if resume and start == resume["rows"]:
                    _check_same_rows(digest, resume, source)
                for text in _row_texts(chunk):
                    digest.update(text.encode("utf-8", "surrogatepass") + b"\x1f")
                if start < done:
                    continue
                empty += chunk.dropped
                each = [
                    outputs(s.scores(texts), task, kind, every, weights)[1]
                    for s, texts in zip(scorers, _own_rows(scorers, chunk, source), strict=True)
                ]
                if rank_by_rule:
                    each = [metrics.rank_within(e[:, 0], chunk.groups.rule)[:, None] for e in each]
                mean = np.mean(each, 0)
                ids = chunk.ids or [str(start + j) for j in range(len(chunk))]
                if pseudo:
                    lines = pseudo_rows(ids, chunk.texts, mean, confidence)
                else:
                    lines = [[i, *row] for i, row in zip(ids, mean.tolist(), strict=True)]
                f.write(csv_bytes(lines))
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


def _row_texts(chunk: Any) -> list[str]:
    """Every text of a chunk's rows, in order (what a resumed predict checks it reads again):
    the ids, then the comments, then each row's first item (a prompt's two halves)."""
    first = chunk.first or ()
    if chunk.form == PROMPT:
        first = [half for message in first for half in message]
    return [*(chunk.ids or ()), "\x1e", *chunk.texts, *first]


def _own_rows(scorers: list[Scorer], chunk: Any, source: str) -> list[Sequence[Any]]:
    """The rows of `chunk` as each scorer reads them: the chunk's own (read with the first
    scorer's text format: --rule-template or --prompt-template), or, for a model of a rank
    ensemble that reads rows another way (a decoder's prompt beside an encoder's pair), the
    same rows of `source` read in its format (a rank ensemble scores the file in one chunk)."""
    first = scorers[0].model.spec.text_format
    out: list[Sequence[Any]] = []
    for s in scorers:
        fmt = s.model.spec.text_format
        if fmt == first:
            out.append(chunk.encoded())
            continue
        (mine,) = list(readers.comments_to_score(source, sys.maxsize, fmt))
        if list(mine.ids or ()) != list(chunk.ids or ()) or len(mine) != len(chunk):
            raise UserError(f"--input {source}: its rows changed while it was scored")
        out.append(mine.encoded())
    return out


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


def csv_bytes(rows: Any) -> bytes:
    """`rows` as predict writes them (the csv module's writer, UTF-8); `jaxtpu archive` too."""
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


def outputs(
    scores: np.ndarray,
    task: Any,
    kind: FileKind,
    every: bool = False,
    label_weights: Any = None,
) -> tuple[list[str], np.ndarray]:
    """(header, values (N, columns)) of the output file for an input of `kind`: for a Rate
    Severity file (`kind.severity`), `comment_id,score` (a multi-label model ranks by the
    severity weights of its six probabilities, as pairs are built from labels; other models by
    their raw score); else Kaggle's submission, the kind's id column (`id`; a rules file's
    `row_id`) and a probability per label the model scores (`every`: and per auxiliary
    target, `Task.aux_columns`). `label_weights` (--label-weights) replace the severity
    weights."""
    if kind.severity:
        scores = task.main(scores)
        if scores.ndim == 2:
            weights = SEVERITY_WEIGHTS if label_weights is None else label_weights
            scores = weighted_severity(metrics.probability(scores), weights)
        return [kind.id_column, "score"], np.asarray(scores, np.float64).reshape(-1, 1)
    return [kind.id_column, *task.score_columns(every)], task.predictions(scores, every)


def check_fits(source: str, work: dict[str, Any], models: list[Any], kind: FileKind | None) -> None:
    """Refuses what a predict's `work` (its flags, `jaxtpu.predict`) asks that does not fit
    the models loaded or the kind of its input (`kind`, `jaxtpu.core.data.filekinds`), as read
    from the task's and the kind's records: one line each, before anything is scored
    (`source`: the --input as given)."""
    args = SimpleNamespace(**{**work, "input": source})
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


def resume_of(progress: Progress, resume: bool, overwrite: bool) -> dict[str, Any] | None:
    """The stopped predict to continue (--resume), or None to start afresh; a stopped one is
    never overwritten silently."""
    out = progress.output
    stopped = progress.stopped()
    if stopped is None or not progress.partial.exists():
        if resume:
            raise UserError(f"--resume: no stopped predict into --output {out} to continue")
        return None
    if not resume:
        if overwrite:
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
