"""What the benchmarks that train on the real comments share (`benchmarks.training.precisions`,
`benchmarks.quality.buckets`): their checks before any run, and one `jaxtpu.train` run in a process
of its own, timed from outside."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from jaxtpu.core.errors import UserError
from jaxtpu.core.storage import check_output_path


def check_paths(p: argparse.ArgumentParser, out: Path, csv_path: Path) -> None:
    """The real comments must be there and --out a new or empty directory (as jaxtpu's own
    commands check theirs); else one line (exit 2) before any run."""
    if not csv_path.is_file():
        p.error(f"--csv {csv_path}: not found (see ../shared/data/SOURCES.md)")
    try:
        check_output_path(out, "--out", is_dir=True)
    except UserError as e:
        p.error(str(e))


def train(flags: list[str], workdir: Path) -> tuple[dict[str, Any], float]:
    """`python -m jaxtpu.train FLAGS --workdir WORKDIR`, its output shown; the run's
    summary.json and its wall seconds (process start to exit, on whatever else the machine is
    doing). A run that fails ends the benchmark in one line (its own error is printed above),
    keeping the rows written before it."""
    cmd = [sys.executable, "-m", "jaxtpu.train", *flags, "--workdir", str(workdir)]
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    code = subprocess.run(cmd).returncode
    wall = time.perf_counter() - t0
    if code != 0:
        raise SystemExit(f"the run in {workdir} failed (exit {code}; its output is above)")
    return json.loads((workdir / "summary.json").read_text()), wall
