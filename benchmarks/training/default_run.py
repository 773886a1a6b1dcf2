"""The default run, measured: `python -m jaxtpu.train` with no flags (what `make train` runs)
from empty caches, as a first run on a fresh machine does, timed from the outside.

`python -m benchmarks.training.default_run --report docs/measured/default_run.json [--runs 1]`

Each run is a fresh process with its own empty `JAXTPU_CACHE` (no token ids, no compiled
programs) and its own run directory; the figures: the command's wall time (interpreter start
to exit), the run's own (`summary.json`'s `wall_seconds`), the steps, the validation loss and
ROC AUC after the last step, and the logged training losses. With `--runs 2` the second run
finds the first's caches (a second run of the same command on the same machine). The table:
docs/benchmarks.md, "The default run".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.shared.measured import keep as keep_report
from benchmarks.shared.measured import start as start_report
from parity_tests.harness import ROOT, clean_env


def one_run(workdir: Path, cache: Path) -> dict[str, Any]:
    """`python -m jaxtpu.train --workdir WORKDIR` with JAXTPU_CACHE=cache: its figures."""
    env = clean_env({"JAXTPU_CACHE": str(cache)})
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # a cache set elsewhere would not be empty
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "jaxtpu.train", "--workdir", str(workdir), "--no-progress"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    command_s = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise SystemExit(f"default_run: the run failed ({proc.returncode}): {tail[0]}")
    summary = json.loads((workdir / "summary.json").read_text())
    events = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    losses = [e for e in events if e.get("event") == "train"]
    return {
        "command_s": command_s,
        "run_s": summary["wall_seconds"],
        "compile_s": summary.get("compile_seconds"),
        "steps": summary["steps"],
        "val_loss": summary["final"]["val_loss"],
        "val_auc": summary["final"]["val_auc"],
        "devices": summary.get("devices"),
        "train_losses": [[e["step"], e["loss"]] for e in losses],
    }


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| run | caches | steps | validation ROC AUC | validation loss | run s | command s |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(runs, 1):
        caches = "empty" if i == 1 else "the first run's"
        lines.append(
            f"| {i} | {caches} | {r['steps']} | {r['val_auc']:.4f} | {r['val_loss']:.4f} | "
            f"{r['run_s']:.0f} | {r['command_s']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training.default_run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--runs", type=int, default=1, help="runs, the later ones on warm caches [1]")
    p.add_argument(
        "--report",
        metavar="FILE",
        help="keep the results as a measured report (benchmarks.shared.measured), e.g. "
        "docs/measured/default_run.json, the table docs/benchmarks.md shows",
    )
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs: at least 1")
    started = start_report(args.report, "benchmarks.training.default_run")
    runs = []
    with tempfile.TemporaryDirectory(prefix="jaxtpu-default-run-") as tmp:
        cache = Path(tmp) / "cache"
        for i in range(1, args.runs + 1):
            print(f"run {i} of {args.runs} (caches {'empty' if i == 1 else 'warm'})", flush=True)
            runs.append(one_run(Path(tmp) / f"run{i}", cache))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "train_losses"}))
    print(table(runs))
    if args.report:
        kept = keep_report(
            args.report, "default_run", runs, "benchmarks.training.default_run", argv, started
        )
        print(f"kept as {kept}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
