"""The Beam pipeline of `jaxtpu archive` (`jaxtpu.serve.archive`): the files it reads, a model
handler of a run or an ONNX export for RunInference, and the pipeline that reads, spreads,
scores and writes. Beam is imported where it is used: the command checks for it first."""

from __future__ import annotations

import argparse
import glob
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from jaxtpu.api import Model
from jaxtpu.core import storage
from jaxtpu.core.data import readers
from jaxtpu.core.data.filekinds import BY_NAME, kind_of
from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.schema import SCORING
from jaxtpu.core.textformat import TextFormat
from jaxtpu.core.versions import jax_needed
from jaxtpu.engine.predictions import csv_bytes, outputs
from jaxtpu.engine.scoring import load_trained
from jaxtpu.serve.onnxmodel import OnnxModel

# --runner -> Beam's runner: the local one is Beam's FnApiRunner itself (Beam's "DirectRunner"
# first tries its Prism runner, a binary it downloads: nothing is downloaded here)
RUNNERS = {
    "direct": "FnApiRunner",
    "dataflow": "DataflowRunner",
    "flink": "FlinkRunner",
    "spark": "SparkRunner",
}


class Source:
    """The model a worker loads: a run directory or an ONNX export (picklable: a path)."""

    def __init__(self, path: str, kind: str) -> None:
        self.path, self.kind = path, kind

    def load(self, batch_size: int, calibrated: bool) -> Any:
        """`jaxtpu.api.Model` of the run, or `OnnxModel` of the export: `logits`, `scorer`,
        `task`, `text_format`, `trained`."""
        if self.kind == "onnx":
            return OnnxModel(self.path, batch_size, calibrated)
        problem = jax_needed(f"--workdir {self.path}")
        if problem:
            raise UserError(problem)
        from jaxtpu.engine import hosts  # JAX: a run's model only

        hosts.use_compilation_cache()
        devices = hosts.scoring_devices(SCORING.num_devices)
        return Model.of(load_trained(self.path), devices, batch_size, calibrated)


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
    """One row as `predict` writes it (`predictions.csv_bytes`), without the line's end (Beam's
    text sink adds it)."""
    return csv_bytes([values]).decode("utf-8").rstrip("\r\n")


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
            items = list(batch)
            scores = model.scorer.scores(items)
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
        flags += [f"--direct_num_workers={args.workers}", "--direct_running_mode=multi_processing"]
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
