"""`python -m jaxtpu.archive` (`jaxtpu archive`): score a file, or a glob of files, too large
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
import csv
import glob
import io
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from jaxtpu.core import storage
from jaxtpu.core.data import readers
from jaxtpu.core.data.filekinds import kind_of
from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.schema import SCORING
from jaxtpu.core.run.exits import user_errors
from jaxtpu.core.textformat import TextFormat

# --runner -> Beam's runner: the local one is Beam's FnApiRunner itself (Beam's "DirectRunner"
# first tries its Prism runner, a binary it downloads: nothing is downloaded here)
RUNNERS = {
    "direct": "FnApiRunner",
    "dataflow": "DataflowRunner",
    "flink": "FlinkRunner",
    "spark": "SparkRunner",
}
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
    from jaxtpu.engine.predictions import check_fits, outputs

    work = {"pseudo_label": False, "rank_by_rule": False, "label_weights": None}
    check_fits(args.input, {**work, "all_outputs": False}, [model.trained], kind)
    assert kind is not None
    if kind.by_rule or kind.name == "rules":
        raise UserError(
            f"--input {args.input}: {kind.what} is scored with its rules' texts; score it with "
            "jaxtpu predict"
        )
    import numpy as np

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


class Source:
    """The model a worker loads: a run directory or an ONNX export (picklable: a path)."""

    def __init__(self, path: str, kind: str) -> None:
        self.path, self.kind = path, kind

    def load(self, batch_size: int, calibrated: bool) -> Any:
        """`jaxtpu.api.Model` of the run, or `OnnxModel` of the export: `logits`, `scorer`,
        `task`, `text_format`, `trained`."""
        if self.kind == "onnx":
            from jaxtpu.serve.onnxmodel import OnnxModel

            return OnnxModel(self.path, batch_size, calibrated)
        from jaxtpu.core.versions import jax_needed

        problem = jax_needed(f"--workdir {self.path}")
        if problem:
            raise UserError(problem)
        from jaxtpu.api import Model
        from jaxtpu.engine import hosts
        from jaxtpu.engine.scoring import load_trained

        hosts.use_compilation_cache()
        devices = hosts.scoring_devices(SCORING.num_devices)
        return Model.of(load_trained(self.path), devices, batch_size, calibrated)


def input_files(pattern: str) -> list[str]:
    """The files `pattern` names (a path or a glob, local or in a bucket), sorted; none is
    one line."""
    if storage.is_remote(pattern):
        fs, path = storage.filesystem(pattern)
        scheme = pattern.split("://", 1)[0]
        found = sorted(f"{scheme}://{p}" for p in fs.glob(path))
    else:
        found = sorted(p for p in glob.glob(pattern) if Path(p).is_file())
    if not found:
        raise UserError(f"--input {pattern}: no such file")
    return found


def input_kind(paths: list[str]) -> Any:
    """The kind of file the inputs are (`jaxtpu.core.data.filekinds`), one for all: every local
    file's header is read; of files in a bucket, the first is fetched and read."""
    kinds = {}
    for path in paths if not storage.is_remote(paths[0]) else paths[:1]:
        kinds[path] = kind_of(readers.columns(storage.local_input(path, "--input")))
    if len({k.name if k else None for k in kinds.values()}) > 1:
        found = ", ".join(f"{p}: {k.what if k else 'unknown'}" for p, k in kinds.items())
        raise UserError(f"--input: its files are of different kinds ({found}); archive one kind")
    return kinds[paths[0]]


def check_output(output: str, shards: int, overwrite: bool) -> None:
    """An --output that exists is refused without --overwrite, as predict's."""
    if shards == 1 and not overwrite:
        there = storage.exists(output) if storage.is_remote(output) else Path(output).exists()
        if there:
            raise UserError(f"--output {output} exists; pass --overwrite to replace it")
    if not storage.is_remote(output):
        storage.check_output_path(Path(output), "--output")


def read_rows(path: str, fmt: dict[str, Any], chunk_rows: int) -> Iterator[tuple[Any, Any]]:
    """((path, row number, id), the row as the scorer takes it) for every row of one file,
    read as `predict` reads it in the model's text format."""
    local = storage.local_input(path, "--input")
    start = 0
    for chunk in readers.comments_to_score(local, chunk_rows, TextFormat.from_dict(fmt)):
        items = chunk.encoded()
        ids = chunk.ids or [str(start + j) for j in range(len(chunk))]
        for j in range(len(chunk)):
            yield (path, start + j, ids[j]), items[j]
        start += len(chunk)


def csv_line(values: Sequence[Any]) -> str:
    """One row as `predict` writes it (its csv writer), without the line's end."""
    text = io.StringIO(newline="")
    csv.writer(text).writerow(values)
    return text.getvalue().rstrip("\r\n")


def handler(source: Source, batch_size: int, calibrated: bool, chunk_rows: int, kind: str) -> Any:
    """Beam's model handler of `source`: each batch of rows scored by `predict`'s scorer, each
    result its output row's values (`predictions.outputs`)."""
    from apache_beam.ml.inference.base import ModelHandler, PredictionResult

    class JaxtpuHandler(ModelHandler):
        def __init__(self) -> None:
            # whole chunks: Beam's adaptive sizing would start at one comment a call
            super().__init__(min_batch_size=chunk_rows, max_batch_size=chunk_rows)

        def load_model(self) -> Any:
            return source.load(batch_size, calibrated)

        def run_inference(self, batch, model, inference_args=None):
            from jaxtpu.core.data.filekinds import BY_NAME
            from jaxtpu.engine.predictions import outputs

            items = list(batch)
            scores = model.scorer.calibrate(model.scorer.logits(items))
            _, values = outputs(scores, model.task, BY_NAME[kind])
            return [PredictionResult(x, v) for x, v in zip(items, values.tolist(), strict=True)]

        def get_metrics_namespace(self) -> str:
            return "jaxtpu"

    return JaxtpuHandler()


def run_pipeline(
    paths: list[str],
    source: Source,
    fmt: dict[str, Any],
    kind: str,
    header: list[str],
    args: argparse.Namespace,
    beam_flags: list[str],
) -> int:
    """Builds and runs the pipeline; the number of rows written."""
    import apache_beam as beam
    from apache_beam.ml.inference.base import KeyedModelHandler, RunInference
    from apache_beam.options.pipeline_options import PipelineOptions

    flags = [f"--runner={RUNNERS[args.runner]}", *beam_flags]
    if args.runner == "direct" and args.workers > 1:
        flags += [f"--direct_num_workers={args.workers}", "--direct_running_mode=multi_processing",
                  "--default_sdk_harness_log_level=WARNING"]  # fmt: skip
    model = KeyedModelHandler(
        handler(source, args.batch_size, not args.no_calibration, args.chunk_rows, kind)
    )
    chunk = args.chunk_rows
    options = PipelineOptions(flags)
    write = {"shard_name_template": ""} if args.shards == 1 else {"file_name_suffix": ".csv"}
    with beam.Pipeline(options=options) as p:
        written = (
            p
            | "files" >> beam.Create(paths)
            | "read" >> beam.FlatMap(read_rows, fmt, chunk)
            | "spread" >> beam.Reshuffle()
            | "score" >> RunInference(model)
            | "row" >> beam.MapTuple(lambda key, result: csv_line([key[2], *result.inference]))
        )
        written | "write" >> beam.io.WriteToText(
            args.output, num_shards=args.shards, header=csv_line(header), **write
        )
    return _scored(p.result)


def _scored(result: Any) -> int:
    """The rows scored: RunInference's own counter of the finished pipeline."""
    from apache_beam.metrics.metric import MetricsFilter

    found = result.metrics().query(MetricsFilter().with_name("num_inferences"))["counters"]
    return int(sum(c.committed or 0 for c in found))


if __name__ == "__main__":
    sys.exit(main())
