"""`jaxtpu serve` under load: throughput and latency of the server over real comments, next to
the same model's offline batch throughput and what a user would write instead.

`python -m benchmarks.serving.throughput --workdir RUN --out runs/serving [--requests 300]
[--clients 1,8,64] [--backend jaxtpu|onnx-fp32|onnx-int8]`

Each way is a process of its own on this machine; the load generator is this process: an
asyncio closed loop of C clients over aiohttp (each sends its next request when its last is
answered; a request is one real comment of `../shared/data/jigsaw_toxic_dev.csv`, asking for
every attribute of the model), for 1, 8 and 64 clients. The ways:

  serve        `python -m jaxtpu.serve --workdir RUN` (`--backend jaxtpu`, dynamic batching), or
               `--onnx` the run's ONNX export (`--backend onnx-fp32`, `onnx-int8`: written once
               into OUT/onnx by `jaxtpu export --format onnx --quantize int8`)
  offline      the same backend's batch scoring of the same comments in one call (the second
               call: programs compiled), in a process of its own: `jaxtpu.load(RUN).predict`,
               or the server's own onnxruntime model (`jaxtpu.serve.onnxmodel.OnnxModel`) of
               the graph; the throughput the server is measured against
  baseline     a transformers `pipeline("text-classification")` of the run's export
               (`jaxtpu export`, PyTorch eager fp32) behind a minimal Starlette handler, one
               request at a time (`benchmarks.serving.baseline`): what a user writes instead

Then the server at half its saturating rate as an open loop (Poisson arrivals at 0.5 x the
64-client throughput): p99 over p50 there. Everything shares this 2-core machine with the load
generator, so the ratios mean more than the absolute numbers; the CPU is recorded (model,
cores, the flags that change the kernels). OUT/serving.json keeps every figure.

A sitting is one backend with its serve flags, its own offline and baseline rows; `--sitting
BACKEND[:SERVE FLAGS]` (repeated) runs several one after another in this process, e.g. the
four of docs/perspective.md's table:

    python -m benchmarks.serving.throughput --train --workdir runs/serve-run --out runs/serving \\
        --sitting jaxtpu --sitting onnx-fp32 --sitting onnx-int8 \\
        --sitting 'onnx-int8:--workers 2' --report docs/measured/serving.json

`--train` first trains benchmarks.quality.calibration's multilabel MiniLM run into a new --workdir;
`--report FILE` (with `--train` only: a kept report is of a run this code trained) keeps the
sittings as a measured report (kind `serving`, `table`: a row per sitting against the goals).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.quality import calibration
from benchmarks.shared.machine import cpu_line, cpu_record
from benchmarks.shared.measured import keep as keep_report
from benchmarks.shared.measured import start as start_report
from parity_tests.competitions import REAL_CSV


def comments(n: int, path: Path = REAL_CSV) -> list[str]:
    """The first `n` non-empty comments of the real file."""
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            text = (row.get("comment_text") or "").strip()
            if text:
                out.append(text[:5000])
            if len(out) == n:
                break
    return out


def _start(cmd: list[str], marker: str, timeout: float = 600) -> tuple[subprocess.Popen, str]:
    """A server process and its base URL, read from its first line that starts with
    `marker` and holds http://."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    deadline = time.time() + timeout
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(marker) and "http://" in line:
            url = line.split("http://", 1)[1].split()[0]
            _drain(proc)
            return proc, "http://" + url.split("/v1alpha1")[0].rstrip("/")
        if time.time() > deadline:
            break
    proc.kill()
    sys.exit(f"benchmarks.serving.throughput: {' '.join(cmd)} did not start")


def _drain(proc: subprocess.Popen) -> None:
    """Reads what the server prints from now on, in a thread, keeping its last lines
    (`proc.tail`): an unread pipe fills and blocks the server's next print, stalling it."""
    import collections
    import threading

    proc.tail = collections.deque(maxlen=200)  # type: ignore[attr-defined]

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            proc.tail.append(line)  # type: ignore[attr-defined]

    threading.Thread(target=read, daemon=True).start()


def _wait_ready(url: str, timeout: float = 600) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    sys.exit(f"benchmarks.serving.throughput: {url} did not become ready")


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)  # Ctrl-C: no drain (SIGTERM drains for --drain-seconds)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def _summary(latencies: list[float], wall: float, errors: int) -> dict[str, float]:
    ms = np.asarray(latencies) * 1000
    return {
        "requests": len(latencies),
        "errors": errors,
        "throughput": len(latencies) / wall if wall else 0.0,
        "p50_ms": float(np.percentile(ms, 50)) if len(ms) else float("nan"),
        "p95_ms": float(np.percentile(ms, 95)) if len(ms) else float("nan"),
        "p99_ms": float(np.percentile(ms, 99)) if len(ms) else float("nan"),
    }


class _Timings:
    """Latencies of the answered requests and the count of the refused ones."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0

    async def post(self, http: Any, url: str, body: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        async with http.post(url, json=body) as r:
            await r.read()
            status = r.status
        if status == 200:
            self.latencies.append(time.perf_counter() - t0)
        else:
            self.errors += 1


def _session(connections: int) -> Any:
    """The load generator's HTTP client: aiohttp's, keep-alive connections (its parser is C:
    the generator takes less of the cores it shares with the server than with httpx)."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=connections)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120))


async def closed_loop(url: str, body_of, texts: list[str], clients: int) -> dict[str, float]:
    """`clients` clients, each sending its next request when the last is answered, until every
    text has been sent once."""
    queue = list(reversed(texts))
    timings = _Timings()

    async def client(http: Any) -> None:
        while queue:
            await timings.post(http, url, body_of(queue.pop()))

    async with _session(clients) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        wall = time.perf_counter() - t0
    return _summary(timings.latencies, wall, timings.errors)


async def open_loop(url: str, body_of, texts: list[str], rate: float) -> dict[str, float]:
    """Requests arriving as a Poisson process of `rate` per second, whatever the answers."""
    rng = random.Random(0)
    timings = _Timings()
    async with _session(256) as http:
        tasks = []
        t0 = time.perf_counter()
        for text in texts:
            tasks.append(asyncio.create_task(timings.post(http, url, body_of(text))))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    return _summary(timings.latencies, wall, timings.errors)


BACKENDS = ("jaxtpu", "onnx-fp32", "onnx-int8")
LOADERS = {  # how each backend's offline process loads the model (sys.argv[1]: its source)
    "jaxtpu": "import jaxtpu; m=jaxtpu.load(sys.argv[1])",
    "onnx": "from jaxtpu.serve.onnxmodel import OnnxModel; m=OnnxModel(sys.argv[1], 64)",
}


def offline(source: str, texts: list[str], backend: str = "jaxtpu") -> float:
    """Comments/s of the backend's batch scoring of `texts` (second call), in a process."""
    code = (
        "import json,sys,time\n"
        f"{LOADERS[backend.split('-')[0]]}\n"
        "texts=json.load(open(sys.argv[2]))\n"
        "m.predict(texts); t=time.perf_counter(); m.predict(texts)\n"
        "print(len(texts)/(time.perf_counter()-t))\n"
    )
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"serving-texts-{os.getpid()}.json"
    path.write_text(json.dumps(texts))
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, source, str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
    finally:
        path.unlink(missing_ok=True)
    return float(out.stdout.strip().splitlines()[-1])


def _check_run(workdir: str) -> None:
    """One line, before any work, when --workdir is not a finished run."""
    wd = Path(workdir)
    if not (wd / "config.json").is_file():
        sys.exit(
            f"benchmarks.serving.throughput: --workdir {workdir}: not a jaxtpu run directory "
            "(no config.json)"
        )
    if not (wd / "checkpoints" / "best").is_dir():
        sys.exit(
            f"benchmarks.serving.throughput: --workdir {workdir}: no best checkpoint (the run has "
            "not evaluated)"
        )


def _table(result: dict[str, Any]) -> str:
    lines = [
        "| way | clients | comments/s | p50 ms | p95 ms | p99 ms | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['way']} | {row['clients']} | {row['throughput']:.1f} | {row['p50_ms']:.0f} | "
            f"{row['p95_ms']:.0f} | {row['p99_ms']:.0f} | {row['errors']} |"
        )
    lines.append(f"| offline ({result['backend']}) | - | {result['offline']:.1f} | | | | |")
    r = result["ratios"]
    lines += [
        "",
        f"serve at {r['clients']} clients / offline: {r['serve64_over_offline']:.2f} "
        "(goal >= 0.8); "
        f"serve / baseline at {r['clients']}: {r['serve64_over_baseline']:.2f} (goal >= 3); "
        f"p99/p50 at half the saturating rate: {r['p99_over_p50_half_load']:.2f} (goal <= 3)",
        "open loop (Poisson arrivals), p50 / p99 ms: "
        + "; ".join(
            f"{x['fraction']:.0%} of the saturating rate ({x['rate']:.1f}/s) "
            f"{x['p50_ms']:.0f} / {x['p99_ms']:.0f}"
            for x in result.get("open_loop", [])
        )
        + " (goal: p99 <= 800 at 80%, Coral's timeout)",
        cpu_line(result["cpu"]),
    ]
    return "\n".join(lines)


def source_of(workdir: str, backend: str, out: Path) -> tuple[str, str]:
    """(the serve flag, its path) of the backend: the run, or its ONNX export (written once
    into OUT/onnx, with the int8 twin)."""
    if backend == "jaxtpu":
        return "--workdir", workdir
    export = out / "onnx"
    if not export.exists():
        cmd = [sys.executable, "-m", "jaxtpu.export", "--workdir", workdir]
        cmd += ["--out", str(export), "--format", "onnx", "--quantize", "int8"]
        subprocess.run(cmd, check=True)
    # a graph file each: the directory would time both and choose (`onnxmodel.pick_graph`)
    return "--onnx", str(export / ("model_int8.onnx" if backend == "onnx-int8" else "model.onnx"))


def serve_rows(
    sitting: tuple[str, str],
    source: tuple[str, str],
    texts: list[str],
    levels: list[int],
    use_wrk: bool = False,
) -> dict[str, Any]:
    """The server's rows at each level (and with `use_wrk` a row of wrk's at the top one), its
    open loops at `OPEN_LOOP` of its saturating rate and its model version; `sitting`:
    (backend, serve flags)."""
    import httpx

    backend, flags = sitting
    serve = [sys.executable, "-m", "jaxtpu.serve", *source, "--port", "0"]
    proc, url = _start(serve + flags.split(), "serving")
    rows = []
    try:
        _wait_ready(url)
        card = httpx.get(f"{url}/v1/model").json()
        names = [a["name"] for a in card["attributes"]]

        def body(text: str) -> dict[str, Any]:
            return {"comment": {"text": text}, "requestedAttributes": {n: {} for n in names}}

        analyze = f"{url}/v1alpha1/comments:analyze"
        asyncio.run(closed_loop(analyze, body, texts[:32], 8))  # warm
        for c in levels:
            row = asyncio.run(closed_loop(analyze, body, texts, c))
            rows.append({"way": f"serve {backend}", "clients": c, **row})
            print(
                f"serve {backend}, {c} clients: {row['throughput']:.1f}/s, "
                f"p50 {row['p50_ms']:.0f} ms, p99 {row['p99_ms']:.0f} ms",
                flush=True,
            )
        if use_wrk:
            from benchmarks.serving.wrk import wrk_row

            row = wrk_row(analyze, [body(t) for t in texts], max(levels))
            rows.append({"way": f"serve {backend} (wrk)", "clients": max(levels), **row})
            print(f"serve {backend}, wrk at {max(levels)} connections: "
                  f"{row['throughput']:.1f}/s, p99 {row['p99_ms']:.0f} ms", flush=True)  # fmt: skip
        top = max(r["throughput"] for r in rows)
        loads = []
        for fraction in OPEN_LOOP:
            row = asyncio.run(open_loop(analyze, body, texts, top * fraction))
            loads.append({"fraction": fraction, "rate": top * fraction, **row})
            print(f"serve {backend}, open loop at {fraction:.0%} of {top:.1f}/s: p50 "
                  f"{row['p50_ms']:.0f} ms, p99 {row['p99_ms']:.0f} ms", flush=True)  # fmt: skip
    finally:
        _stop(proc)
    half = next(x for x in loads if x["fraction"] == 0.5)
    return {"rows": rows, "half_load": half, "open_loop": loads, "model_version": card["version"]}


# the open-loop rates, as fractions of the saturating rate (the best closed-loop throughput)
OPEN_LOOP = (0.5, 0.8, 0.95)


def baseline_rows(workdir: str, out: Path, texts: list[str], levels: list[int]) -> list[dict]:
    """The pipeline baseline's rows at each level (its export written once into OUT)."""
    export = out / "export"
    if not export.exists():
        cmd = [sys.executable, "-m", "jaxtpu.export", "--workdir", workdir, "--out", str(export)]
        subprocess.run(cmd, check=True)
    proc, url = _start(
        [sys.executable, "-m", "benchmarks.serving.baseline", str(export)], "baseline"
    )
    rows = []
    try:
        _wait_ready(url)
        analyze = f"{url}/v1alpha1/comments:analyze"
        for c in levels:
            row = asyncio.run(closed_loop(analyze, lambda t: {"comment": {"text": t}}, texts, c))
            rows.append({"way": "baseline", "clients": c, **row})
            print(f"baseline, {c} clients: {row['throughput']:.1f}/s", flush=True)
    finally:
        _stop(proc)
    return rows


def ratios(result: dict[str, Any], clients: int) -> dict[str, Any]:
    """Item 6's goals as ratios, at the highest client count."""

    def at(way: str) -> float:
        row = next((r for r in result["rows"] if (r["way"], r["clients"]) == (way, clients)), None)
        return row["throughput"] if row else float("nan")

    half = result["half_load"]
    return {
        "clients": clients,
        "serve64_over_offline": at(f"serve {result['backend']}") / result["offline"],
        "serve64_over_baseline": at(f"serve {result['backend']}") / at("baseline"),
        "p99_over_p50_half_load": half["p99_ms"] / half["p50_ms"],
    }


SITTING_LABELS = {  # how docs/perspective.md's table names each backend's serve command
    "jaxtpu": "`--workdir` (jaxtpu, {precision})",
    "onnx-fp32": "`--onnx DIR/model.onnx` (fp32)",
    "onnx-int8": "`--onnx DIR/model_int8.onnx`",
}


def _cpu(cpu: dict[str, Any] | None) -> str:
    """A sitting's CPU in a few words: its model name and its widest int8/bf16 units (what
    moves these rows most: AMX, AVX-512 VNNI, else AVX2 or older)."""
    if not cpu:
        return "?"
    flags = set(cpu.get("flags", ()))
    units = "AMX" if "amx_int8" in flags else "AVX-512 VNNI" if "avx512_vnni" in flags else "AVX2"
    return f"{cpu.get('model', '?')}, {units}"


def _python_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The server's rows of the Python generator (wrk's row apart)."""
    return [r for r in rows if r["way"].startswith("serve ") and not r["way"].endswith("(wrk)")]


def table(sittings: list[dict[str, Any]]) -> str:
    """A row per sitting (kind `serving`): the server's throughput at each client count, its
    latency alone and at the top count, against its offline rate and the baseline, and its
    tail at half load, each ratio beside its goal; where the sitting has them, wrk's rate at
    the top count against the offline rate and the p99 of the open loops at 50, 80 and 95% of
    the saturating rate ('-' where it has not: a report from before they were measured)."""
    levels = [r["clients"] for r in _python_rows(sittings[0]["rows"])]
    top = levels[-1]
    lines = [
        f"| CPU | serve | comments/s at {' / '.join(map(str, levels))} clients | p50 at "
        f"{levels[0]} / p99 at {top} (ms) | offline comments/s | {top} clients / offline "
        "(goal 0.8) | "
        f"wrk at {top} / offline (goal 0.85) | baseline at {top} | / baseline (goal 3) | "
        "p99/p50 at half load (goal 3) | p99 ms at 50 / 80 / 95% load (goal 800 at 80%) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in sittings:
        serve = _python_rows(s["rows"])
        wrk = [r for r in s["rows"] if r["way"].endswith("(wrk)")]
        base = [r for r in s["rows"] if r["way"] == "baseline" and r["clients"] == top]
        label = SITTING_LABELS[s["backend"]].format(precision=s.get("precision", "?"))
        if s["serve_flags"]:
            label += f", `{s['serve_flags']}`"
        r = s["ratios"]
        rates = " / ".join(f"{x['throughput']:.1f}" for x in serve)
        baseline = f"{base[0]['throughput']:.1f}" if base else "-"
        by_wrk = f"{wrk[0]['throughput'] / s['offline']:.2f}" if wrk else "-"
        loads = s.get("open_loop")
        tails = " / ".join(f"{x['p99_ms']:.0f}" for x in loads) if loads else "-"
        lines.append(
            f"| {_cpu(s.get('cpu'))} | {label} | {rates} | "
            f"{serve[0]['p50_ms']:.0f} / {serve[-1]['p99_ms']:.0f} | "
            f"{s['offline']:.1f} | {r['serve64_over_offline']:.2f} | {by_wrk} | {baseline} | "
            f"{r['serve64_over_baseline']:.2f} | {r['p99_over_p50_half_load']:.2f} | {tails} |"
        )
    return "\n".join(lines)


def sittings_of(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[tuple[str, str]]:
    """(backend, serve flags) of each sitting: each `--sitting BACKEND[:FLAGS]`, else the one
    of --backend and --serve-flags."""
    if not args.sitting:
        return [(args.backend, args.serve_flags)]
    out = []
    for spec in args.sitting:
        backend, _, flags = spec.partition(":")
        if backend not in BACKENDS:
            p.error(f"--sitting {spec!r}: the backend is one of {', '.join(BACKENDS)}")
        out.append((backend, flags.strip()))
    return out


def precision_of(workdir: str) -> str:
    """The run's precision, as its config.json recorded it."""
    record = json.loads((Path(workdir) / "config.json").read_text())
    return str(record.get("config", {}).get("train", {}).get("precision", "?"))


def sitting(
    args: argparse.Namespace, which: tuple[str, str], out: Path, texts: list[str], levels: list[int]
) -> dict[str, Any]:
    """One sitting: the backend's offline rate, the server's rows and the baseline's."""
    backend, flags = which
    result: dict[str, Any] = {
        "cpu": cpu_record(),
        "requests": len(texts),
        "serve_flags": flags,
        "backend": backend,
        "precision": "fp32" if backend.startswith("onnx") else precision_of(args.workdir),
    }
    source = source_of(args.workdir, backend, out)
    print(f"offline: {backend} batch scoring of {len(texts)} comments ...", flush=True)
    result["offline"] = offline(source[1], texts, backend)
    result.update(serve_rows(which, source, texts, levels, args.wrk))
    if not args.no_baseline:
        result["rows"] += baseline_rows(args.workdir, out, texts, levels)
    result["ratios"] = ratios(result, max(levels))
    print(_table(result))
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.serving.throughput",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 3)[3],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--workdir", required=True, help="A finished jaxtpu run (toxicity or multilabel)."
    )
    p.add_argument("--out", required=True, help="Directory for serving.json and the export.")
    p.add_argument("--requests", type=int, default=300, help="Requests per load level.")
    p.add_argument("--clients", default="1,8,64", help="Concurrent clients of each level.")
    p.add_argument("--no-baseline", action="store_true", help="Leave out the pipeline baseline.")
    p.add_argument(
        "--wrk",
        action="store_true",
        help="Also load the server with Debian's wrk (a generator in C, not sharing the "
        "Python generator's interpreter) at the top client count for 20 s.",
    )
    p.add_argument(
        "--serve-flags", default="", help="More flags for jaxtpu serve, e.g. '--batch-size 4'."
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="jaxtpu",
        help="What the server scores with: the run on JAX, or its ONNX export on onnxruntime "
        "(fp32, or the int8 twin), exported once into --out.",
    )
    p.add_argument(
        "--sitting",
        action="append",
        metavar="BACKEND[:FLAGS]",
        help="A sitting: a backend and its serve flags, e.g. 'onnx-int8:--workers 2'; "
        "repeated, they run one after another (instead of --backend and --serve-flags).",
    )
    p.add_argument(
        "--train",
        action="store_true",
        help="First train benchmarks.quality.calibration's multilabel MiniLM run into a new "
        "--workdir.",
    )
    p.add_argument("--report", metavar="FILE", help="Keep the sittings as a report (--train).")
    args = p.parse_args(argv)
    if args.report and not args.train:
        p.error("--report: with --train only (a kept report is of a run this code trained)")
    if args.train and Path(args.workdir).exists():
        p.error(f"--train: --workdir {args.workdir} exists; give a new directory")
    which = sittings_of(p, args)
    if not args.train:
        _check_run(args.workdir)  # a mistyped run is named first, with or without the data
    if not REAL_CSV.exists():
        sys.exit(f"benchmarks.serving.throughput: needs the real comments at {REAL_CSV}")
    started = start_report(args.report, "benchmarks.serving.throughput")  # the code and the machine
    if args.train:
        calibration.train(args.workdir, str(REAL_CSV), calibration.TRAIN_ROWS)
        _check_run(args.workdir)
    levels = [int(x) for x in args.clients.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    texts = comments(args.requests)
    sittings = []
    for one in which:
        sittings.append(sitting(args, one, out, texts, levels))
        (out / "serving.json").write_text(json.dumps(sittings, indent=1))
    print(table(sittings))
    if args.report:
        kept = keep_report(
            args.report, "serving", sittings, "benchmarks.serving.throughput", argv, started
        )
        print(f"kept {kept}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
