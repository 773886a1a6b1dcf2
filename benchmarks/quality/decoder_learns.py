"""A tiny decoder learns on the real comments: the training path of the decoder families, with
and without LoRA, shown on data rather than on parity alone.

`python -m benchmarks.quality.decoder_learns --out runs/decoder-learns`

Builds the Qwen3 test checkpoint (`parity_tests.families`: 2 layers, width 32, its byte-level
BPE trained on the packaged sample; random weights) and trains it as a toxicity classifier
with `--head hf` on the real comments of `../shared/data/jigsaw_toxic_dev.csv` (`--max-rows`,
a seeded stratified 10% held out), bf16 on 8 CPU devices: every weight, then LoRA (rank 16 on
every projection; the base frozen, only the adapters and the head train). Prints each run's
validation ROC AUC and steps. One seed, one machine: a demonstration that training moves the
metric, not a benchmark of the families' quality.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REAL_CSV = ROOT.parent / "shared" / "data" / "jigsaw_toxic_dev.csv"
RUNS = {
    "every weight": ["--lr", "1e-3"],
    "LoRA r=16": ["--lora-rank", "16", "--lr", "2e-3"],
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.quality.decoder_learns",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="directory for the checkpoint and the runs")
    p.add_argument("--csv", default=str(REAL_CSV), help="labelled comments [%(default)s]")
    p.add_argument("--max-rows", type=int, default=6000, help="[%(default)s]")
    p.add_argument("--epochs", type=int, default=4, help="[%(default)s]")
    args = p.parse_args(argv)
    if not Path(args.csv).exists():
        raise SystemExit(f"--csv {args.csv}: no such file (../shared/data, see SOURCES.md)")
    from parity_tests.families import build

    out = Path(args.out)
    base = build("qwen3", out / "qwen3-tiny")
    print("| run | steps | validation ROC AUC | trained params |")
    print("|---|---|---|---|")
    for name, flags in RUNS.items():
        wd = out / name.split()[0].lower().replace("=", "")
        cmd = [sys.executable, "-m", "jaxtpu.train", "--model-dir", str(base), "--head", "hf"]
        cmd += ["--train-csv", args.csv, "--max-rows", str(args.max_rows), "--max-len", "64"]
        cmd += ["--epochs", str(args.epochs), "--batch-size", "8", "--num-devices", "8"]
        cmd += ["--workdir", str(wd), "--no-progress", *flags]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{name}: {' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        summary = json.loads((wd / "summary.json").read_text())
        said = proc.stdout + proc.stderr
        trained = next(
            (line.split(": ")[-1] for line in said.splitlines() if "params train" in line),
            "all",
        )
        final = summary["final"]
        print(f"| {name} | {summary['steps']} | {final['val_auc']:.4f} | {trained} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
