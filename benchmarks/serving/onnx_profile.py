"""Where an ONNX export's time goes in onnxruntime: each graph of an export directory run on
the same length-sorted batches of 32 as `benchmarks.serving.scoring`, with onnxruntime's own
profiler, its kernel time summed by op type.

`python -m benchmarks.serving.onnx_profile --onnx runs/scoring/onnx \
    --comments runs/scoring/comments-2000.csv`

It says why int8 gains what it gains over fp32: dynamic quantization speeds up the matrix
multiplications only, while the normalizations, softmax and GELU stay in fp32.
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path


def profile(path: Path, batches: list[dict]) -> tuple[float, dict[str, float]]:
    """Total kernel seconds of the graph at `path` over `batches` (its int64 inputs by name),
    and seconds per op type."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "profile")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        for batch in batches:
            session.run(None, batch)
        events = json.loads(Path(session.end_profiling()).read_text())
    by_op: collections.Counter = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"] / 1e6
    return sum(by_op.values()), dict(by_op.most_common())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--onnx", required=True, help="a `jaxtpu export --format onnx` directory")
    p.add_argument("--comments", required=True, help="a CSV with comment_text (scoring's file)")
    p.add_argument("--top", type=int, default=8, help="op types shown (default: %(default)s)")
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    from benchmarks.serving.scoring import BATCH, _texts, onnx_batches

    directory = Path(args.onnx)
    if not (directory / "jaxtpu_onnx.json").is_file():
        p.error(f"--onnx {directory}: no jaxtpu_onnx.json (not an ONNX export of jaxtpu)")
    if not Path(args.comments).is_file():
        p.error(f"--comments {args.comments}: not found")
    meta = json.loads((directory / "jaxtpu_onnx.json").read_text())
    texts, _ = _texts(args.comments, 10**9)
    tok = AutoTokenizer.from_pretrained(str(directory))
    batches = list(onnx_batches(tok, texts, meta["max_len"]))  # scoring's onnx ways' batches
    print(f"{len(texts)} comments in {len(batches)} batches of {BATCH}, in the file's order")
    for kind, name in meta["files"].items():
        total, by_op = profile(directory / name, batches)
        shares = ", ".join(
            f"{op} {s:.2f} s ({s / total:.0%})" for op, s in list(by_op.items())[: args.top]
        )
        print(f"{kind} ({name}): {total:.2f} s of kernels: {shares}")


if __name__ == "__main__":
    main()
