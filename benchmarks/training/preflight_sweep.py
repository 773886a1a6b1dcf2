"""`jaxtpu preflight`'s answer for a TPU slice, kept as a report: what a run needs per device
with each memory option (and with `--find-batch`, the largest batch that fits), by the TPU
compiler's own memory analysis of the program compiled for that slice on this machine.

    python -m benchmarks.training.preflight_sweep --report docs/measured/sweep-xlmr-large.json -- \\
        --model-dir= --num-layers 24 --hidden-size 1024 --num-heads 16 \\
        --intermediate-size 4096 --vocab-size 250002 --max-len 224 --batch-size 8 \\
        --parallel jit --target v3-8 --scan-layers --sweep replicated,zero1,fsdp,fsdp+layer \\
        --find-batch

Everything after `--` is preflight's own flags, run as `python -m jaxtpu.preflight` in a process
of its own (its `--json` goes to a temporary file); the report is that JSON, kind `preflight`,
and `table` is preflight's own table of it. The figures are the compiler's for a TPU that was
not there: the caption says estimated, not measured.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.shared.measured import keep as keep_report
from benchmarks.shared.measured import start as start_report


def table(record: dict[str, Any]) -> str:
    """Preflight's own table of its saved reports (with the largest batch when it searched)."""
    from jaxtpu.preflight.report import Report
    from jaxtpu.preflight.report import table as preflight_table

    reports = [Report(**r) for r in record["reports"]]
    return preflight_table(reports, any("largest_batch" in r.extra for r in reports))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    flags = args[args.index("--") + 1 :] if "--" in args else []
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training.preflight_sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--report", metavar="FILE", required=True, help="the report to keep")
    mine = p.parse_args(args[: args.index("--")] if "--" in args else args)
    if not flags:
        p.error("give preflight's flags after --, e.g. -- --preset minilm --target v3-8")
    if any(f == "--json" or f.startswith("--json=") for f in flags):
        p.error("--json: the report is written from preflight's JSON; leave --json out")
    # the code and machine
    started = start_report(mine.report, "benchmarks.training.preflight_sweep")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "preflight.json"
        cmd = [sys.executable, "-m", "jaxtpu.preflight", *flags, "--json", str(out)]
        print("$", " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0 or not out.is_file():
            print(
                "benchmarks.training.preflight_sweep: preflight failed; nothing kept",
                file=sys.stderr,
            )
            return 1
        record = json.loads(out.read_text())
    module = "benchmarks.training.preflight_sweep"
    kept = keep_report(mine.report, "preflight", record, module, args, started)
    print(f"kept {kept}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
