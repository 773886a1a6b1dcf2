"""Debian's `wrk`, a load generator in C, driven from Python: its requests per second and
latency percentiles against a server (benchmarks.serving.throughput --wrk)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

WRK_SECONDS = 20


def wrk_row(url: str, bodies: list[dict[str, Any]], connections: int) -> dict[str, float]:
    """Debian's `wrk` (a load generator in C) on `connections` keep-alive connections for
    `WRK_SECONDS`, cycling through `bodies`: its requests/s and latency percentiles."""
    if shutil.which("wrk") is None:
        raise SystemExit(
            "benchmarks.serving.throughput: --wrk needs Debian's wrk (apt-get install wrk)"
        )
    target = urlsplit(url)
    with tempfile.TemporaryDirectory() as tmp:
        lines = Path(tmp) / "bodies.txt"
        lines.write_text("".join(json.dumps(b) + "\n" for b in bodies))
        script = Path(tmp) / "post.lua"
        script.write_text(
            f'local bodies = {{}}\nfor line in io.lines("{lines}") do\n'
            "  bodies[#bodies + 1] = line\nend\n"
            "local i = 0\nrequest = function()\n  i = i + 1\n"
            f'  return wrk.format("POST", "{target.path}", {{["Content-Type"] = '
            '"application/json"}, bodies[(i % #bodies) + 1])\nend\n'
        )
        out = subprocess.run(
            ["wrk", "-t2", f"-c{connections}", f"-d{WRK_SECONDS}s", "--latency", "-s",
             str(script), f"{target.scheme}://{target.netloc}"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    def ms(name: str) -> float:
        m = re.search(rf"^\s+{name}%\s+([0-9.]+)(us|ms|s)", out, re.M)
        if not m:
            return float("nan")
        return float(m[1]) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m[2]]

    rate = float(re.search(r"Requests/sec:\s+([0-9.]+)", out)[1])
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"requests": round(rate * WRK_SECONDS), "errors": int(bad[1]) if bad else 0,
            "throughput": rate, "p50_ms": ms("50"), "p95_ms": float("nan"),
            "p99_ms": ms("99")}  # fmt: skip
