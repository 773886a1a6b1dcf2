"""ONNX for CPU scoring: the torch model of a run (`torchxla_ref.models.Classifier`, jaxtpu's
head or the family's own) exported by torch's ONNX exporter, its graph rewritten for
onnxruntime's CPU provider, and its int8 dynamic quantization by onnxruntime.

Why these: the exporter (`torch.onnx.export(dynamo=True)`, torch.export + onnxscript) traces
the very module the parity tests hold to jaxtpu, so the graph is transformers' own code of
each family and no graph is written by hand; onnxruntime's `quantize_dynamic` is the
quantization the deployed toxicity filters use (int8 weights of the MatMuls, activations
quantized per batch at run time). optimum would add a dependency that follows transformers'
releases at its own pace for the same exporter underneath.

Why onnxscript's fusions (`onnxscript.rewriter.ort_fusions.optimize_for_ort`) and not
onnxruntime's transformer optimizer: the exporter's graph is onnxscript's, and its rewriter
is written for that graph. On a MiniLM export onnxruntime's optimizer (model type bert) fused
GELU and skip-LayerNorm but no attention; onnxscript's fuses all of attention (into
onnxruntime's `Attention`), skip-LayerNorm and bias-GELU. The fused graph is what
`model.onnx` holds; the int8 twin quantizes the exporter's graph as it was, whose separate
q, k and v MatMuls `quantize_dynamic` can quantize (the fused `Attention` it leaves in fp32,
and its `QAttention` would drop the padding mask). Families whose layers the rewriter does not
recognise keep those layers as exported; either way export.py checks the graph against
jaxtpu's scores before it is written.

The graph takes `input_ids` and `attention_mask` (int64, batch x length, both dynamic; the
length up to the encoder's position table) and returns `logits` (batch x outputs, fp32; the
probability of a label is its sigmoid).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from jaxtpu.core.hf.encoder import EncoderConfig
from jaxtpu.core.serving.heads import POOLED

OPSET = 18  # torch 2.9's exporter's opset; onnxruntime 1.17 and later run it
# ONNX's protobuf limit: a larger model keeps its weights in a `.data` file beside the graph
INLINE_LIMIT = 2 * 10**9


class _Logits(torch.nn.Module):
    """The classifier with a batch x outputs result whatever the task (one output keeps its
    axis), the shape ONNX consumers expect of `logits`; with jaxtpu's head, each comment's
    vector under it too (`pooled`, batch x hidden: what a community's head reads)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        logits, pooled = self.model.features(input_ids, attention_mask)
        logits = logits.reshape(input_ids.shape[0], -1)
        return logits if pooled is None else (logits, pooled)


def export_onnx(model: torch.nn.Module, out: Path, enc: EncoderConfig) -> Path:
    """Writes `model` (in eval mode, fp32) of encoder `enc` as ONNX at `out`, with dynamic
    batch and length (at most what the encoder numbers: its position table, else
    max_position_embeddings, which DeBERTa's relative positions and the rotary families'
    tables are built for)."""
    max_tokens = enc.max_tokens or enc.max_position_embeddings
    model = _Logits(model.float().eval())
    outputs = ["logits"] if model.model.head_kind == "hf" else ["logits", POOLED]
    ids = torch.full((2, 16), 5, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    batch = torch.export.Dim("batch", min=1)
    length = torch.export.Dim("length", min=2, max=max_tokens)
    shapes = ({0: batch, 1: length}, {0: batch, 1: length})
    out.parent.mkdir(parents=True, exist_ok=True)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    # the exporter warns that torchvision's detection ops are not registered: none is used here
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        # batch and length share their constraints across the two inputs: said once per axis
        warnings.filterwarnings("ignore", message=".*will not be used, since it shares")
        torch.onnx.export(
            model,
            (ids, mask),
            str(out),
            dynamo=True,
            input_names=["input_ids", "attention_mask"],
            output_names=outputs,
            dynamic_shapes=shapes,
            opset_version=OPSET,
            external_data=size >= INLINE_LIMIT,  # one file where ONNX allows it
            verbose=False,
        )
    return out


def optimize_for_onnxruntime(src: Path, dst: Path) -> dict[str, int]:
    """The graph of `src` with onnxscript's fusions for onnxruntime (see the module's
    docstring), its constants folded, written whole at `dst` (weights beside it in
    `<dst>.data` when ONNX's protobuf limit needs it). Returns how many of each of
    onnxruntime's own fused ops (its `com.microsoft` domain: Attention, SkipLayerNormalization,
    BiasGelu, ...) the graph now holds."""
    from onnxscript import ir
    from onnxscript.optimizer import fold_constants, remove_unused_nodes
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    graph = ir.load(src)
    ir.external_data.load_to_model(graph)  # nothing refers back to `src` once written
    graph, _ = optimize_for_ort(graph)
    # the fused Attention's weight is the concatenation of q, k and v: one initializer, not
    # a Concat at every call
    no_limit = 2**62
    fold_constants(graph, input_size_limit=no_limit, output_size_limit=no_limit)
    remove_unused_nodes(graph)
    size = sum(init.const_value.nbytes for init in graph.graph.initializers.values())
    ir.save(graph, dst, external_data=f"{dst.name}.data" if size >= INLINE_LIMIT else None)
    fused = Counter(node.op_type for node in graph.graph if node.domain == "com.microsoft")
    return dict(sorted(fused.items()))


def quantize_int8(src: Path, dst: Path) -> Path:
    """onnxruntime's dynamic int8 quantization of the ONNX model `src` (signed int8 weights)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # It logs a line per tensor it leaves in fp32, and advises its pre-processing, whose
    # symbolic shape inference fails on these graphs ("Incomplete symbolic shape inference").
    with _quiet_root_logger():
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    return dst


@contextlib.contextmanager
def _quiet_root_logger():
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        root.setLevel(level)


def session(path: Path, threads: int = 0):
    """An onnxruntime CPU session of the model at `path` (`threads` 0 = onnxruntime's
    default)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
