"""`jaxtpu serve` under a flood and beside a span-heavy request, measured on a real server of a
run: what issue 86 asked to be shown.

`python -m benchmarks.serving.hostile --workdir RUN [--out DIR]`

- The flood: a server with `--max-queue 4`, 200 requests sent at once (200 threads, one
  request each, real comments): how many were answered 200 and 429, the queue's peak from
  `/metrics` (`jaxtpu_queue_peak_requests`), the largest `Retry-After` and how long the whole
  flood took.
- Fairness: on a fresh server, ordinary requests alone (one every 50 ms: their latency), then a
  request of 100 sentences with `spanAnnotations` and, 0.2 s after it, the same ordinary
  requests: the span-heavy request's time and the ordinary requests' latency beside it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.serving.throughput import _start, _stop, _wait_ready, comments
from benchmarks.shared.machine import cpu_line, cpu_record
from jaxtpu.core.serving.perspective import MAX_SPANS
from jaxtpu.core.serving.spans import sentences


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], float]:
    req = urllib.request.Request(
        f"{url}/v1alpha1/comments:analyze",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()
            return r.status, dict(r.headers), time.perf_counter() - t0
    except urllib.error.HTTPError as e:
        e.read()
        return e.code, dict(e.headers), time.perf_counter() - t0


def _server(workdir: str, *flags: str) -> tuple[Any, str]:
    cmd = [sys.executable, "-m", "jaxtpu.serve", "--workdir", workdir, "--port", "0", *flags]
    proc, url = _start(cmd, "serving")
    _wait_ready(url)
    return proc, url


def flood(workdir: str, texts: list[str]) -> dict[str, Any]:
    proc, url = _server(workdir, "--max-queue", "4")
    try:
        start = threading.Barrier(len(texts))

        def one(text: str) -> tuple[int, dict[str, str], float]:
            start.wait()
            return _post(url, {"comment": {"text": text}, "requestedAttributes": {"TOXICITY": {}}})

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
            answers = list(pool.map(one, texts))
        took = time.perf_counter() - t0
        with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
            metrics = r.read().decode()
    finally:
        _stop(proc)
    peak = re.search(r"^jaxtpu_queue_peak_requests (\S+)", metrics, re.M)
    codes = [a[0] for a in answers]
    waits = [
        int(a[1].get("retry-after", a[1].get("Retry-After", 0))) for a in answers if a[0] == 429
    ]
    return {
        "requests": len(texts),
        "answered_200": codes.count(200),
        "answered_429": codes.count(429),
        "other": len(codes) - codes.count(200) - codes.count(429),
        "queue_peak": float(peak[1]) if peak else None,
        "max_retry_after_s": max(waits, default=0),
        "flood_s": round(took, 2),
    }


def fairness(workdir: str, texts: list[str], ordinary: int = 20) -> dict[str, Any]:
    proc, url = _server(workdir)
    body = lambda t: {"comment": {"text": t}, "requestedAttributes": {"TOXICITY": {}}}  # noqa: E731

    def ordinary_latencies() -> list[float]:
        with concurrent.futures.ThreadPoolExecutor(ordinary) as pool:
            futures = []
            for t in texts[:ordinary]:
                futures.append(pool.submit(_post, url, body(t)))
                time.sleep(0.05)
            return [f.result()[2] for f in futures]

    try:
        alone = ordinary_latencies()
        lines = [t[a:b] for t in texts[ordinary:] for a, b in sentences(t)][:MAX_SPANS]
        long_text = "\n".join(lines)  # the most sentences a request may have
        heavy = {**body(long_text), "spanAnnotations": True}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            span = pool.submit(_post, url, heavy)
            time.sleep(0.2)
            beside = ordinary_latencies()
            status, _, span_s = span.result()
    finally:
        _stop(proc)
    return {
        "span_request_status": status,
        "span_sentences": len(lines),
        "span_request_s": round(span_s, 2),
        "ordinary_alone_p50_s": round(statistics.median(alone), 3),
        "ordinary_alone_max_s": round(max(alone), 3),
        "ordinary_beside_p50_s": round(statistics.median(beside), 3),
        "ordinary_beside_max_s": round(max(beside), 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serving.hostile", description=__doc__)
    p.add_argument("--workdir", required=True, help="a finished toxicity or multilabel run")
    p.add_argument("--out", default="runs/serve-hostile", help="where hostile.json goes")
    args = p.parse_args(argv)
    if not (Path(args.workdir) / "config.json").is_file():
        p.error(f"--workdir {args.workdir}: not a jaxtpu run directory (no config.json)")
    texts = [" ".join(t.split()) or "empty" for t in comments(220)]
    result = {
        "flood": flood(args.workdir, texts[:200]),
        "fairness": fairness(args.workdir, texts),
        "cpu": cpu_record(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hostile.json").write_text(json.dumps(result, indent=1))
    for part in ("flood", "fairness"):
        print(f"{part}: " + ", ".join(f"{k} {v}" for k, v in result[part].items()))
    print(cpu_line(result["cpu"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
