"""`jaxtpu serve --onnx DIR`: an ONNX export (`jaxtpu export --format onnx [--quantize int8]`)
scored by onnxruntime on the CPU, as `jaxtpu.api.Model` scores a run.

The same text handling (`Model.logits`, inherited: whitespace collapsed, the run's rule or
prompt template, recorded in `jaxtpu_onnx.json`), the export's tokenizer, the same fixed length
buckets (powers of two up to the run's --max-len) and the run's calibration (the export's
record). A batch holds only real rows, each padded to its bucket's edge: onnxruntime's kernels
take any batch size, so a lone comment is not padded to a full batch, and a comment's score
does not depend on its bucket's other rows beyond float rounding (`tests/test_serve_onnx.py`
measures it).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from jaxtpu.api import Model
from jaxtpu.core.calibration import Calibration
from jaxtpu.core.data.buckets import edge_of, fixed_edges, real_lengths
from jaxtpu.core.data.demo import sample_comments
from jaxtpu.core.data.tokens import encode_texts, load_tokenizer
from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.schema import Config
from jaxtpu.core.serving.card import digest_file
from jaxtpu.core.serving.heads import POOLED
from jaxtpu.core.tasks import get_task
from jaxtpu.core.textformat import TextFormat
from jaxtpu.engine.scoring import calibrated_logits, scores_of, text_buckets

META = "jaxtpu_onnx.json"  # what `jaxtpu export --format onnx` writes beside the graph


@dataclass
class OnnxExport:
    """What the server reads of an ONNX export, in the fields it reads of a `TrainedModel`:
    the config (task, --max-len, templates), the task, the export's metadata, tokenizer and
    calibration, and the graph file served."""

    cfg: Config
    spec: Any
    meta: dict[str, Any]
    tokenizer_dir: Path
    calibration: Calibration | None
    onnx_file: Path
    params: None = None  # no JAX parameters: the version hashes the graph file instead

    def weights_digest(self) -> str:
        return digest_file(self.onnx_file)


def read_export(path: str | Path) -> OnnxExport:
    """An ONNX export directory (its fp32 graph) or one of its graph files
    (`DIR/model_int8.onnx`).

    Raises:
      UserError: not a jaxtpu ONNX export, a graph file the export does not list, or metadata
        without what scoring needs."""
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    meta_file = directory / META
    if not meta_file.exists():
        raise UserError(
            f"--onnx {path}: not a jaxtpu ONNX export (no {META}); write one with jaxtpu "
            "export --workdir RUN --out DIR --format onnx [--quantize int8]"
        )
    try:
        meta = json.loads(meta_file.read_text())
        files, task, max_len = dict(meta["files"]), str(meta["task"]), int(meta["max_len"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"--onnx {path}: {META} is unreadable or incomplete ({e})") from None
    name = files.get("fp32", "model.onnx") if path.is_dir() else path.name
    if name not in files.values():
        raise UserError(
            f"--onnx {path}: the export lists {', '.join(sorted(files.values()))}, not {name}"
        )
    text = meta.get("text_format", {})
    cfg = Config().replace(
        task=task,
        max_len=max_len,
        precision="fp32",
        tracker="none",  # nothing trains: no tracker's client is needed (a slim install has none)
        # an export of the stop before the TextFormat record names its two templates
        rule_template=text.get("rule_template", "{rule}"),
        prompt_template=text.get("prompt_template", ""),
    )
    try:
        fmt = TextFormat.from_dict(text) if "kind" in text else cfg.text_format
    except ValueError as e:
        raise UserError(f"--onnx {path}: {META}'s text_format: {e}") from None
    labels = tuple(str(c) for c in meta.get("labels", ()))
    base = get_task(task)
    n = len(base.label_columns)
    if labels[:n] != base.label_columns:
        raise UserError(
            f"--onnx {path}: its outputs ({', '.join(labels)}) are not a {task} model's "
            f"({', '.join(base.label_columns)} first)"
        )
    cal = meta.get("calibration")
    return OnnxExport(
        cfg,
        SimpleNamespace(task=base.with_aux(labels[n:], 0.0), text_format=fmt),
        meta,
        directory,
        None if cal is None else Calibration.from_dict(cal, f"{meta_file} calibration"),
        directory / name,
    )


class OnnxScorer:
    """`jaxtpu.engine.scoring.Scorer`'s part the server and `Model` use, on onnxruntime."""

    def __init__(self, export: OnnxExport, batch_size: int, calibrated: bool, threads: int):
        try:
            import onnxruntime as ort
        except ImportError:
            raise UserError("--onnx needs onnxruntime: pip install 'jaxtpu[onnx]'") from None
        self.model = export
        self.calibration = export.calibration if calibrated else None
        self.task = export.spec.task
        self.tokenizer = load_tokenizer(export.tokenizer_dir)
        self.max_len = export.cfg.data.max_len
        self.form = export.spec.text_format.kind
        self.edges = fixed_edges(self.max_len)
        self.global_batch = batch_size
        # an int8 graph quantizes its activations per call (onnxruntime's dynamic
        # quantization: one scale for the whole tensor), so a comment's score would move with
        # the other rows of its call (by up to 4e-4 on the tests' run): it is run one row a
        # call, its score then the same in any batch, as fp32's is, at some throughput
        self.quantized = export.onnx_file.name == (export.meta.get("files") or {}).get("int8")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(
                str(export.onnx_file), options, providers=["CPUExecutionProvider"]
            )
        except Exception as e:  # onnxruntime's own exception types are not public API
            raise UserError(
                f"--onnx {export.onnx_file}: onnxruntime cannot load it ({e})"
            ) from None
        self.pooled = False  # set by a server of communities' heads (`load_served`)
        if self.calibration is not None and self.calibration.needs_pooled and not self.gives_pooled:
            raise UserError(
                f"--onnx {export.onnx_file}: its calibration reads "
                f"{', '.join(r.attribute for r in self.calibration.readouts)} out of the "
                "model's vector, which this graph does not give: export the run again"
            )

    @property
    def gives_pooled(self) -> bool:
        """Whether the graph gives each comment's vector beside its logits (an export of
        jaxtpu's head made since issue 96), which `features` reads for communities' heads."""
        return any(o.name == POOLED for o in self.session.get_outputs())

    def logits(self, texts: list[Any]) -> np.ndarray:
        """The raw outputs of (normalized) texts, text pairs or prompts (the export's text
        format): (N,) or (N, outputs), each
        batch one bucket's rows padded to its edge."""
        return self._run(texts, False)[0]

    def features(self, texts: list[Any]) -> tuple[np.ndarray, np.ndarray]:
        """(`logits`, each text's vector under the head), from one run of the graph."""
        return self._run(texts, True)

    def _run(self, texts: list[Any], pooled: bool) -> tuple[np.ndarray, np.ndarray]:
        out = np.zeros((len(texts), self.task.outputs), np.float32)
        names = ["logits", POOLED] if pooled else ["logits"]
        vectors: np.ndarray | None = None
        if texts:
            ids, mask = encode_texts(texts, self.tokenizer, self.max_len, self.form)
            edge = edge_of(real_lengths(mask), self.edges, self.max_len)
            step = 1 if self.quantized else self.global_batch
            for length in np.unique(edge):
                members = np.flatnonzero(edge == length)
                for start in range(0, members.size, step):
                    rows = members[start : start + step]
                    feeds = {
                        "input_ids": ids[rows, :length].astype(np.int64),
                        "attention_mask": mask[rows, :length].astype(np.int64),
                    }
                    got = self.session.run(names, feeds)
                    out[rows] = got[0]
                    if pooled:
                        if vectors is None:
                            vectors = np.zeros((len(texts), got[1].shape[-1]), np.float32)
                        vectors[rows] = got[1]
        logits = out[:, 0] if self.task.label_shape == () else out
        return logits, (np.zeros((len(texts), 0), np.float32) if vectors is None else vectors)

    def buckets(self, texts: list[Any]) -> np.ndarray:
        return text_buckets(texts, self.tokenizer, self.max_len, self.edges, self.form)

    def calibrate(
        self, logits: np.ndarray, pooled: np.ndarray | None = None, texts: Any = None
    ) -> np.ndarray:
        return calibrated_logits(self.calibration, logits, pooled, texts)

    def scores(self, texts: list[Any]) -> np.ndarray:
        return scores_of(self, texts)


class OnnxModel(Model):
    """`jaxtpu.api.Model` over an ONNX export: its `logits` and `predict` as a run's."""

    def __init__(
        self, path: str | Path, batch_size: int, calibrated: bool = True, threads: int = 0
    ) -> None:
        export = read_export(path)
        self.trained = export
        self.scorer = OnnxScorer(export, batch_size, calibrated, threads)
        self.task = self.scorer.task
        self.backend = None
        self.text_format = export.spec.text_format


# int8 is served from an export's directory only when it is this much faster than fp32 here:
# its logits move by up to about 0.15 from fp32's (the export's own report), and a small,
# noisy lead would let two replicas of one machine type choose differently
INT8_LEAD = 1.15
TIMED_COMMENTS = 64  # the packaged real comments both graphs are timed on, at start


def pick_graph(
    path: str | Path, batch_size: int, calibrated: bool = True, threads: int = 0
) -> tuple[OnnxModel, dict[str, Any] | None]:
    """The graph to serve for `--onnx PATH`: a graph file as named; for an export's directory
    with an int8 twin, whichever of the two scores `TIMED_COMMENTS` real comments faster on
    this CPU (the int8 graph only when `INT8_LEAD` times faster: where the CPU has VNNI or AMX,
    about 1.7x; on AVX2 about 7%), with the timing as a record for the card; None when nothing
    was chosen."""
    path = Path(path)
    fp32 = OnnxModel(path, batch_size, calibrated, threads)
    files = fp32.trained.meta.get("files") or {}
    if not path.is_dir() or "int8" not in files or not (path / files["int8"]).is_file():
        return fp32, None
    int8 = OnnxModel(path / files["int8"], batch_size, calibrated, threads)
    texts = sorted(sample_comments(TIMED_COMMENTS), key=len)  # length-sorted, as served
    seconds = {}
    for name, model in (("fp32", fp32), ("int8", int8)):
        model.logits(texts)  # the first run allocates; timed: the best of three after it
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            model.logits(texts)
            best = min(best, time.perf_counter() - t0)
        seconds[name] = best
    chosen = "int8" if seconds["fp32"] >= INT8_LEAD * seconds["int8"] else "fp32"
    record = {
        "chosen": chosen,
        "seconds": {k: round(v, 4) for k, v in seconds.items()},
        "comments": len(texts),
        "rule": f"int8 when at least {INT8_LEAD}x faster than fp32 on this CPU, timed at start",
    }
    return (int8 if chosen == "int8" else fp32), record
