"""What a checkpoint costs in a bucket: the time a run's save of its latest state (params and
both AdamW moments, fp32: what `--resume` needs) stalls training, and the time until it is in
the bucket, for the MiniLM and BERT-base shapes, written synchronously and with
`--async-checkpoint`, to a Google Cloud Storage emulator on loopback and to the local disk.

`python -m benchmarks.training.bucket --out runs/bucket [--repeats 3]`

Each figure is the median of `--repeats` saves of new steps through `jaxtpu.engine.checkpoint.
Checkpoints` (the class a run saves with), one process, the state on the host as numpy arrays
(`JaxBackend.save_latest` copies it there first; that copy is not counted). The emulator
(fake-gcs-server on loopback, `devtools.gcs_emulator`) measures jaxtpu's and orbax's
client-side work and the HTTP traffic on this machine, not a real bucket's bandwidth: a
Cloud TPU VM writes to GCS at several hundred MB/s to a few GB/s, so the bucket figures
here are for the order of magnitude and for sync against async. Writes `bucket.json`;
`--table` prints it as Markdown, `--report FILE` keeps it for the docs
(`benchmarks.shared.measured`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.shared.measured import keep as keep_report
from benchmarks.shared.measured import start as start_report

SHAPES = {
    "MiniLM (6 x 384)": dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12,
                             intermediate_size=1536),
    "BERT-base (12 x 768)": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                                 intermediate_size=3072),
}  # fmt: skip


def train_state(shape: dict) -> dict:
    """A train state of the BERT family at `shape` (vocabulary 30,522): params and two
    moments of the same shapes, random fp32, as numpy arrays."""
    import jax
    import numpy as np

    from jaxtpu.core.hf.encoder import EncoderConfig
    from jaxtpu.core.hf.modelspec import ModelSpec
    from jaxtpu.models.encoder import abstract_params, create_module

    enc = EncoderConfig.from_hf_dict(
        {"model_type": "bert", "vocab_size": 30522, "max_position_embeddings": 512, **shape}
    )
    shapes = abstract_params(create_module(ModelSpec(enc, head_dropout=0.1)), (128,))
    rng = np.random.default_rng(0)

    def fill(s):
        return rng.standard_normal(s.shape, dtype=np.float32)

    params = jax.tree_util.tree_map(fill, shapes)
    moments = {
        "mu": jax.tree_util.tree_map(fill, shapes),
        "nu": jax.tree_util.tree_map(fill, shapes),
    }
    return {"step": np.int32(0), "params": params, "opt_state": moments}


def measure(where: str, state: dict, async_save: bool, repeats: int) -> dict:
    """Median seconds a save stalls the caller and until it is written, over `repeats`."""
    from jaxtpu.engine.checkpoint import Checkpoints

    ckpts = Checkpoints(where, async_save=async_save)
    stalls, totals = [], []
    for step in range(1, repeats + 1):
        t0 = time.perf_counter()
        ckpts.save_latest(step, state, {"step": step})
        t1 = time.perf_counter()
        ckpts.wait()
        t2 = time.perf_counter()
        stalls.append(t1 - t0)
        totals.append(t2 - t0)
    return {"stall_s": statistics.median(stalls), "written_s": statistics.median(totals)}


def table(rows: list[dict]) -> str:
    lines = [
        "| model | state | to | save | training stalls | in place after |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['gb']:.2f} GB | {r['to']} | {r['mode']} | "
            f"{r['stall_s']:.2f} s | {r['written_s']:.2f} s |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="directory for bucket.json")
    p.add_argument("--repeats", type=int, default=3, help="saves per figure [default: 3]")
    p.add_argument("--table", action="store_true", help="print OUT/bucket.json as Markdown")
    p.add_argument(
        "--report",
        metavar="FILE",
        help="also keep the results as a measured report (benchmarks.shared.measured), e.g. "
        "docs/measured/bucket.json, the table docs/cloud.md shows",
    )
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.table:
        print(table(json.loads((out / "bucket.json").read_text())))
        return
    out.mkdir(parents=True, exist_ok=True)
    # the code and machine that measure
    started = start_report(args.report, "benchmarks.training.bucket")
    import jax
    import numpy as np

    from devtools.gcs_emulator import GcsEmulator

    rows = []
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        emulator = GcsEmulator(Path(tmp) / "gcs")
        emulator.start()
        os.environ["STORAGE_EMULATOR_HOST"] = emulator.url
        try:
            for model, shape in SHAPES.items():
                state = train_state(shape)
                gb = sum(np.asarray(x).nbytes for x in jax.tree_util.tree_leaves(state)) / 1e9
                targets = {
                    "local disk": str(Path(tmp) / "local"),
                    "emulated GCS": emulator.bucket(),
                }
                for to, base in targets.items():
                    for mode in ("sync", "async"):
                        where = f"{base}/{mode}-{len(rows)}"
                        row = {"model": model, "gb": gb, "to": to, "mode": mode,
                               **measure(where, state, mode == "async", args.repeats)}  # fmt: skip
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        (out / "bucket.json").write_text(json.dumps(rows, indent=2))
        finally:
            emulator.stop()
    print(table(rows))
    if args.report:
        kept = keep_report(args.report, "bucket", rows, "benchmarks.training.bucket", argv, started)
        print(f"kept as {kept}")


if __name__ == "__main__":
    main()
