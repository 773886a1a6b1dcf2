"""`jaxtpu archive` (`python -m jaxtpu.serve.archive`): score a file, or a glob of files, too large
for one machine on Apache Beam: RunInference with a model handler that wraps a jaxtpu run
(`--workdir`) or an ONNX export (`--onnx`), on Beam's local runner or, by `--runner`, on
Dataflow, Flink or Spark.

    jaxtpu archive --onnx DIR --input 'comments-*.parquet' --output scores.csv
    jaxtpu archive --workdir RUN --input gs://b/in-*.csv --output gs://b/out/scores.csv \\
        --runner dataflow --shards 0 -- --project P --region R --temp_location gs://b/tmp

Each input file is read by one worker with the reader `jaxtpu predict` uses (CSV, Parquet or
JSONL: a CSV comment may hold newlines, so a file is never split at a line), its rows are
spread over the workers (a reshuffle), and each worker scores them `--chunk-rows` at a time with
the same scorer as `predict`: a comment's score does not depend on the other comments of its
call, so every row is `predict`'s score of it. The output is `predict`'s CSV (its header, then
an id and the scores a row), in no particular order: a row keeps its id (a file without an id
column: the row's number in its file). What follows `--` goes to Beam's pipeline options as
they are (a Dataflow project, a Flink master, ...).

Beam pins older numpy, protobuf and pyarrow than the main install: install
`jaxtpu[jax,serve-onnx,archive]` into an environment of its own (`make setup-archive`:
`.venv-archive` from requirements/archive.txt).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from jaxtpu.core import storage
from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.schema import SCORING
from jaxtpu.core.run.exits import user_errors
from jaxtpu.engine.predictions import check_fits, outputs
from jaxtpu.serve.beam import RUNNERS, Source, input_files, input_kind, run_pipeline

INSTALL = (
    "jaxtpu archive needs Apache Beam, which the main install leaves out (Beam pins numpy "
    "<2.5, protobuf <7, pyarrow <26): in an environment of its own, pip install "
    "'jaxtpu[jax,serve-onnx,archive]' (in this checkout: make setup-archive)"
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jaxtpu archive",
        description=__doc__.split("\n\n")[0],
        epilog="Flags after `--` are Beam's pipeline options, passed as they are.",
    )
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--workdir", help="a finished jaxtpu run: its best model (needs JAX)")
    model.add_argument(
        "--onnx",
        help="an ONNX export (jaxtpu export --format onnx): its directory scores the fp32 "
        "graph, DIR/model_int8.onnx the int8 one",
    )
    p.add_argument(
        "--input",
        required=True,
        help="the file to score (CSV, Parquet or JSONL, as jaxtpu predict reads), or a glob "
        "of such files (quote it); local or in a bucket (gs://...)",
    )
    p.add_argument(
        "--output",
        required=True,
        help="the scores' CSV, jaxtpu predict's columns; with --shards other than 1, the "
        "prefix of its shards (OUTPUT-00000-of-00004.csv, ...)",
    )
    p.add_argument(
        "--runner",
        choices=sorted(RUNNERS),
        default="direct",
        help="where the pipeline runs: direct (this machine, Beam's local runner; the "
        "default), dataflow, flink or spark (their options after --)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="the direct runner's worker processes, each with its own model (default 1)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=SCORING.batch_size,
        help="comments a device call scores, as jaxtpu predict's --batch-size (default "
        f"{SCORING.batch_size}): the same value gives predict's scores exactly (a bf16 program "
        "of another batch rounds differently, about 1e-3)",
    )
    p.add_argument(
        "--chunk-rows",
        type=int,
        default=1024,
        help="the most comments one RunInference call gives the model (default 1024): larger "
        "chunks sort more comments into each length bucket",
    )
    p.add_argument(
        "--shards",
        type=int,
        default=1,
        help="output files: 1 (the default) writes OUTPUT itself through one worker; 0 lets "
        "the runner choose, for outputs too large for one writer",
    )
    p.add_argument(
        "--no-calibration", action="store_true", help="raw sigmoid scores (as jaxtpu predict's)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    beam_flags: list[str] = []
    if "--" in args_in:
        cut = args_in.index("--")
        args_in, beam_flags = args_in[:cut], args_in[cut + 1 :]
    args = parser().parse_args(args_in)
    with user_errors():
        return archive(args, beam_flags)


def archive(args: argparse.Namespace, beam_flags: list[str]) -> int:
    """Checks what it can before the pipeline starts (the input's files and kind, the model,
    the output), then runs it and says what it wrote."""
    try:
        import apache_beam  # noqa: F401
    except ImportError:
        raise UserError(INSTALL) from None
    # Beam's INFO lines (type hints converted, state caches, batch statistics) are not news
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    least = {"workers": 1, "batch_size": 1, "chunk_rows": 1, "shards": 0}
    for name, low in least.items():
        value = getattr(args, name)
        if value < low:
            raise UserError(f"--{name.replace('_', '-')} {value}: at least {low}")
    paths = input_files(args.input)
    source = Source(args.workdir or args.onnx, "workdir" if args.workdir else "onnx")
    model = source.load(args.batch_size, not args.no_calibration)
    kind = input_kind(paths)
    work = {"pseudo_label": False, "rank_by_rule": False, "label_weights": None}
    check_fits(args.input, {**work, "all_outputs": False}, [model.trained], kind)
    assert kind is not None
    if kind.by_rule:  # rows that ask about a rule are scored with the rule's text
        raise UserError(
            f"--input {args.input}: {kind.what} is scored with its rules' texts; score it with "
            "jaxtpu predict"
        )
    header, _ = outputs(np.zeros((0, *model.task.label_shape), np.float32), model.task, kind)
    check_output(args.output, args.shards, args.overwrite)
    fmt = model.text_format.to_dict()
    del model  # the launcher's copy: each worker loads its own
    t0 = time.perf_counter()
    rows = run_pipeline(paths, source, fmt, kind.name, header, args, beam_flags)
    seconds = time.perf_counter() - t0
    where = args.output if args.shards == 1 else f"shards of {args.output}"
    print(
        f"wrote {rows} scores of {len(paths)} file(s) to {where} in {seconds:.1f} s on the "
        f"{args.runner} runner"
    )
    return 0


def check_output(output: str, shards: int, overwrite: bool) -> None:
    """An --output that exists is refused without --overwrite, as predict's."""
    if shards == 1 and not overwrite:
        there = storage.exists(output) if storage.is_remote(output) else Path(output).exists()
        if there:
            raise UserError(f"--output {output} exists; pass --overwrite to replace it")
    if not storage.is_remote(output):
        storage.check_output_path(Path(output), "--output")


if __name__ == "__main__":
    sys.exit(main())
