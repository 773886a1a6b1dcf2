"""The parity checks kept as a measured report, the tables docs/parity.md shows.

`python -m benchmarks.quality.parity --quick --out DIR --report docs/measured/parity-quick.json`

runs `python -m parity_tests.report --out DIR` with the same `--quick`, `--full` and `--only`
(its DIR/parity.json and DIR/parity.png are written as always), then keeps its rows (check,
bound, worst measured value, pass or fail, detail; not the loss series) in FILE
(`benchmarks.shared.measured`). A run with failed checks is kept too, its table saying FAIL, and the
exit status is the report's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.shared.measured import keep as keep_report
from benchmarks.shared.measured import start as start_report


def table(rows: list[dict[str, Any]]) -> str:
    """A row per check: what was compared, its bound, the worst value measured, the result and
    the check's own detail."""
    lines = ["| check | bound | measured | result | detail |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['check']} | {r['tolerance']:.0e} | {r['measured']:.1e} | "
            f"{'pass' if r['passed'] else '**FAIL**'} | {r['detail']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.quality.parity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="directory for parity.json, parity.png, runs")
    p.add_argument("--report", required=True, metavar="FILE", help="the measured report to keep")
    p.add_argument("--quick", action="store_true", help="skip the dropout-on outcome checks")
    p.add_argument("--full", action="store_true", help="outcome checks on all real comments")
    p.add_argument("--only", default="", metavar="TEXT", help="checks whose name has TEXT")
    args = p.parse_args(argv)
    # the code and machine that measure
    started = start_report(args.report, "benchmarks.quality.parity")
    from parity_tests import report

    flags = ["--out", args.out, *(["--only", args.only] if args.only else [])]
    flags += [f"--{f}" for f in ("quick", "full") if getattr(args, f)]
    written = Path(args.out) / "parity.json"
    before = written.stat().st_mtime_ns if written.is_file() else None
    rc = report.main(flags)
    if not written.is_file() or written.stat().st_mtime_ns == before:  # nothing measured now
        print(
            f"benchmarks.quality.parity: the checks wrote no {written}; nothing kept",
            file=sys.stderr,
        )
        return rc or 2
    rows = [
        {k: v for k, v in r.items() if k != "series"}
        for r in json.loads(written.read_text())["results"]
    ]
    kept = keep_report(args.report, "parity", rows, "benchmarks.quality.parity", argv, started)
    print(f"kept {kept}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
