"""`python -m benchmarks.training.compare --out DIR`: step time of jaxtpu vs torch_xla on the same
devices.

Runs every configuration in its own process (`benchmarks.training.worker`), in one sitting, and the
matmul peak of the machine in each precision, then prints a table (compile seconds, median
step with p10-p90 spread, samples/s, tokens/s, model FLOPs utilisation against the measured
peak, peak host memory), writes `DIR/benchmarks.json` (one record per configuration) and
`DIR/benchmarks.png` (bar chart of median step time).

  --quick   MiniLM, bf16: jaxtpu pmap, jit and shard_map on 8 devices, with 1 and with K steps per
            device call (strategy "jit/8" = --steps-per-call 8), jit on 2 devices (one per
            core of this machine), torch_xla SPMD on 8, and the plain-PyTorch CPU reference
            rows (eager and torch.compile, bf16 autocast). About 9 minutes here.
  (default) jaxtpu pmap, jit and shard_map for tiny, minilm and bert-base, fp32 and bf16, 1 and 8
            devices, plus the --quick jaxtpu rows; torch_xla SPMD and spawn for tiny and SPMD
            for the target row (MiniLM bf16, 8 devices); the reference rows. About 25 minutes.
  --all     also every other torch_xla row (XLA:CPU runs a MiniLM step in 30+ s: hours).
  --memory  only what the memory options cost in step time: jit MiniLM bf16 with --sharding
            fsdp and with --remat layer, each beside the same row without (8 devices, and 2
            devices with 8 steps per call). About 6 minutes.
  --epoch   real data instead (`benchmarks.training.epoch`): MiniLM bf16, one epoch of the
            10,000 real comments at max length 128 and 256; jaxtpu in its best CPU
            configuration (jit on 2 devices, FSDP, 8 steps per call) padded and in length
            buckets, and plain PyTorch on the CPU (eager, torch.compile) fed random batches
            with dynamic padding and the same bucketed batches, plus PyTorch eager bucketed
            with jaxtpu's host-memory setting.
            Each row trains the whole epoch (or --epoch-batches of it, projected); writes
            DIR/epoch.json after every row, each naming the commit that ran it; --resume
            runs only the rows an interrupted run of the same rows did not finish (with
            --report, only when those rows are this same commit's). About 80 minutes.

Every row runs its framework as that framework's own command does; jaxtpu's commands put
glibc's malloc on transparent huge pages (`jaxtpu.core.hostmem`), plain PyTorch does not, and
the rows marked +hp ran with it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.shared import measured
from benchmarks.shared.machine import cpu_line, cpu_record
from benchmarks.shared.measured import keep as keep_report
from benchmarks.shared.measured import start as start_report
from jaxtpu.core import files, hostmem
from parity_tests.harness import ROOT, clean_env


def matrix(quick: bool, all_configs: bool, memory_only: bool = False) -> list[dict[str, Any]]:
    def cfg(fw, st, wl, pr, dev, k=1, **memory):  # memory: sharding=..., remat=... (jit)
        c = {"framework": fw, "parallel": st, "workload": wl, "precision": pr, "devices": dev}
        return {**c, **({"steps_per_call": k} if k > 1 else {}), **memory}

    refs = [
        cfg("torch", "eager", "minilm", "bf16", 1),
        cfg("torch", "compile", "minilm", "bf16", 1),
    ]
    # One virtual device per physical core, and K steps per device call (lax.scan): the best
    # jaxtpu configurations on a small CPU.
    best = [
        cfg("jaxtpu", "pmap", "minilm", "bf16", 8, 4),
        cfg("jaxtpu", "jit", "minilm", "bf16", 8, 4),
        cfg("jaxtpu", "shard_map", "minilm", "bf16", 8, 4),
        cfg("jaxtpu", "jit", "minilm", "bf16", 2),
        cfg("jaxtpu", "jit", "minilm", "bf16", 2, 8),
    ]
    # What the memory options (--sharding fsdp, --remat) cost in speed, on 8 and on 2 devices.
    memory = [
        cfg("jaxtpu", "jit", "minilm", "bf16", 8, sharding="fsdp"),
        cfg("jaxtpu", "jit", "minilm", "bf16", 8, remat="layer"),
        cfg("jaxtpu", "jit", "minilm", "bf16", 2, 8, sharding="fsdp"),
        cfg("jaxtpu", "jit", "minilm", "bf16", 2, 8, remat="layer"),
    ]
    if memory_only:  # each memory option next to the same row without it
        plain = [
            cfg("jaxtpu", "jit", "minilm", "bf16", 8),
            cfg("jaxtpu", "jit", "minilm", "bf16", 2, 8),
        ]
        return [plain[0], *memory[:2], plain[1], *memory[2:]]
    if quick:
        return [
            cfg("jaxtpu", "pmap", "minilm", "bf16", 8),
            cfg("jaxtpu", "jit", "minilm", "bf16", 8),
            cfg("jaxtpu", "shard_map", "minilm", "bf16", 8),
            *best,
            *memory,
            cfg("torch_xla", "spmd", "minilm", "bf16", 8),
            *refs,
        ]
    out = []
    for wl, pr, dev in itertools.product(("tiny", "minilm", "bert-base"), ("fp32", "bf16"), (1, 8)):
        out += [cfg("jaxtpu", st, wl, pr, dev) for st in ("pmap", "jit", "shard_map")]
        # torch_xla on XLA:CPU takes 30+ s per MiniLM step: beyond tiny, only the target row
        # (MiniLM bf16 on 8 devices) unless --all
        if wl == "tiny" or (wl, pr, dev) == ("minilm", "bf16", 8) or all_configs:
            out.append(cfg("torch_xla", "spmd", wl, pr, dev))
        if dev == 1 and (wl == "tiny" or all_configs):
            out.append(cfg("torch_xla", "spawn", wl, pr, dev))
    return out + best + memory + refs + [cfg("torch", "eager", "minilm", "fp32", 1)]


# jaxtpu's best configuration on this 2-core CPU (docs/benchmarks.md): jit on 2 devices (one
# per core), FSDP, 8 steps per device call.
JAX_BEST = ["--devices", "2", "--steps-per-call", "8", "--sharding", "fsdp"]
EPOCH_MAX_LENS = (128, 256)  # the epoch benchmark's lengths (--epoch-max-len picks one)
EPOCH_ROWS = [  # (framework, strategy, batching, huge pages for malloc, jaxtpu compile cache)
    ("jaxtpu", "jit", "padded", "auto", "cold"),
    ("jaxtpu", "jit", "bucketed", "auto", "cold"),
    # second runs of the same configurations: their programs load from the persistent cache
    ("jaxtpu", "jit", "padded", "auto", "warm"),
    ("jaxtpu", "jit", "bucketed", "auto", "warm"),
    ("torch", "eager", "random", "auto", None),
    ("torch", "compile", "random", "auto", None),
    ("torch", "eager", "bucketed", "auto", None),
    ("torch", "compile", "bucketed", "auto", None),
    # plain PyTorch given the host-memory setting jaxtpu's commands use, for a fair reading
    ("torch", "eager", "bucketed", "on", None),
]


def run_worker(args: list[str], timeout: float, module: str = "worker") -> dict[str, Any]:
    cmd = [sys.executable, "-m", f"benchmarks.training.{module}", *args]
    # Each row chooses its host-memory setting itself (--huge-pages): none is inherited.
    env = {k: v for k, v in clean_env().items() if k != hostmem.TUNABLES}
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]}
    return json.loads(lines[-1])


def progress(i: int, n: int, name: str, status: str, started: float) -> None:
    print(f"[{i}/{n}] {name}: {status} ({time.time() - started:.0f}s)", flush=True)


def write_record(
    path: Path, t0: float, records: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """The run's JSON (returned, and written to `path`): when, how long, what else the table
    needs, and one record per row."""
    record = {
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "seconds": time.time() - t0,
        "cpu": cpu_record(),
        **extra,
        "results": records,
    }
    files.write_text(path, json.dumps(record, indent=1))  # a killed run keeps the old file
    return record


def _strategy(r: dict[str, Any]) -> str:
    """'jit', 'jit/8' with --steps-per-call 8, '+fsdp' / '+remat' with a memory option, 'x2'
    on 2 devices (epoch rows), '+hp' with malloc on huge pages, '+warm' with its programs
    loaded from the persistent compilation cache."""
    k = r.get("steps_per_call", 1)
    name = r["parallel"] + (f"/{k}" if k > 1 else "")
    if r.get("sharding") == "fsdp":
        name += "+fsdp"
    if r.get("remat", "none") != "none":
        name += "+remat"
    if r.get("huge_pages"):
        name += "+hp"
    if r.get("compile_cache") == "warm":
        name += "+warm"
    return name


def table(
    records: list[dict[str, Any]], peaks: dict[str, float], cpu: dict[str, Any] | None = None
) -> str:
    head = (
        f"{'framework':<10} {'parallel':<16} {'workload':<9} {'prec':<4} {'dev':>3} "
        f"{'compile s':>9} {'median s':>9} {'p10-p90 s':>13} {'samples/s':>9} "
        f"{'tokens/s':>9} {'MFU %':>6} {'host MB':>8}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        name = f"{r['framework']:<10} {_strategy(r):<16} {r['workload']:<9} {r['precision']:<4} "
        name += f"{r['devices']:>3} "
        if "error" in r:
            lines.append(name + f"  error: {r['error']}")
            continue
        lines.append(
            name + f"{r['compile_s']:>9.1f} {r['median_s']:>9.3f} "
            f"{r['p10_s']:>6.3f}-{r['p90_s']:<6.3f} {r['samples_per_s']:>9.1f} "
            f"{r['tokens_per_s']:>9.0f} {r['mfu'] * 100:>6.1f} {r['peak_host_mb']:>8.0f}"
        )
    lines.append(
        "matmul peak (2048^3 GEMM via XLA, 1 device): "
        + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in peaks.items())
    )
    lines.append(cpu_line(cpu))
    return "\n".join(lines)


def markdown(saved: dict[str, Any]) -> str:
    """A kept report's table (`benchmarks.shared.measured`): one row per configuration, median
    seconds per step first; the matmul peak the MFU column is against under it."""
    lines = [
        "| framework | strategy | model | precision | devices | median s/step | p10-p90 s | "
        "samples/s | MFU | compile s | peak host MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in saved["results"]:
        head = f"| {r['framework']} | {_strategy(r)} | {r['workload']} | {r['precision']} | "
        head += f"{r['devices']} |"
        if "error" in r:
            lines.append(head + f" error: {r['error']} | | | | | |")
            continue
        lines.append(
            head + f" {r['median_s']:.3f} | {r['p10_s']:.3f}-{r['p90_s']:.3f} | "
            f"{r['samples_per_s']:.1f} | {r['mfu'] * 100:.1f} % | {r['compile_s']:.1f} | "
            f"{r['peak_host_mb']:,.0f} |"
        )
    peaks = ", ".join(f"{k} {v:.0f}" for k, v in saved["matmul_peak_gflops"].items())
    return (
        "\n".join(lines)
        + f"\n\nMatmul peak (a 2048^3 GEMM through XLA, 1 device), GFLOP/s: {peaks}."
    )


def _x_padded(records: list[dict[str, Any]]) -> list[float]:
    """Each epoch row's time over jaxtpu padded's at the same length (a `+warm` row: over
    padded `+warm`'s, when the run has one); nan for a failed row."""
    base = {
        (r["max_len"], r.get("compile_cache") or "cold"): r["epoch_s"]
        for r in records
        if "epoch_s" in r and r["batching"] == "padded" and r["framework"] == "jaxtpu"
    }
    out = []
    for r in records:
        key = (r["max_len"], r.get("compile_cache") or "cold")
        key = key if key in base else (r["max_len"], "cold")
        out.append(r["epoch_s"] / base[key] if "epoch_s" in r and key in base else float("nan"))
    return out


EPOCH_NOTE = (
    "epoch s = compile s + steady s (every batch of the epoch, timed); real tok/s "
    "= the epoch's real tokens / steady s; tokens = tokens computed / tokens at "
    "full padding; +hp = malloc on transparent huge pages; +warm = programs loaded "
    "from the persistent compilation cache (a second run); x padded = epoch s / "
    "jaxtpu padded's (a +warm row: / padded +warm's); cores = CPU cores busy "
    "while the epoch's steps ran; wait % = share of the timed steps' wall time spent "
    "waiting for the next batch (near 0: the host keeps up)"
)


def epoch_markdown(saved: dict[str, Any]) -> str:
    """A kept report's epoch table (kind `epoch`): a row per framework and batching at each
    length, its epoch against jaxtpu padded's, what compiling took, the steady rate and the
    share of tokens computed; the columns' meaning under it."""
    lines = [
        "| len | framework | batching | epoch s | x padded | compile s | steady s | "
        "real tok/s | tokens | compiles | cores | wait % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    records = saved["results"]
    for r, rel in zip(records, _x_padded(records), strict=True):
        way = _strategy(r)  # torch's: eager or compile, +hp
        if r["framework"] == "jaxtpu":
            name = f"jaxtpu {way}"
        else:
            name = f"torch.{way}" if way.startswith("compile") else f"torch {way}"
        batching = "random, dynamic padding" if r["batching"] == "random" else r["batching"]
        head = f"| {r['max_len']} | {name} | {batching} |"
        if "error" in r:
            lines.append(head + f" error: {r['error']} | | | | | | | | |")
            continue
        lines.append(
            head + f" {r['epoch_s']:.0f} | {rel:.2f} | {r['compile_s']:.1f} | "
            f"{r['epoch_s'] - r['compile_s']:.0f} | {r['real_tokens_per_s']:.0f} | "
            f"{r['tokens_vs_full_padding']:.2f} | {r['compiles']} | "
            f"{r.get('steady_cpu_cores', float('nan')):.2f} | "
            f"{100 * r.get('data_wait_share', float('nan')):.2f} |"
        )
    return "\n".join(lines) + "\n\n" + EPOCH_NOTE[0].upper() + EPOCH_NOTE[1:] + "."


def epoch_table(records: list[dict[str, Any]]) -> str:
    """The epoch rows, with each row's time relative to jaxtpu padded at the same length (a
    `+warm` jaxtpu row: relative to padded `+warm`, when the run has one)."""
    head = (
        f"{'len':>4} {'framework':<9} {'parallel':<16} {'batching':<9} {'epoch s':>8} "
        f"{'x padded':>8} {'compile s':>9} {'steady s':>8} {'real tok/s':>10} {'tokens':>6} "
        f"{'lengths':>7} {'compiles':>8} {'wait %':>6} {'cores':>5}"
    )
    lines = [head, "-" * len(head)]
    relative = _x_padded(records)
    for r, rel in zip(records, relative, strict=True):
        name = f"{r['max_len']:>4} {r['framework']:<9} {_strategy(r):<16} {r['batching']:<9} "
        if "error" in r:
            lines.append(name + f"error: {r['error']}")
            continue
        lines.append(
            name + f"{r['epoch_s']:>8.0f} {rel:>8.2f} {r['compile_s']:>9.1f} "
            f"{r['epoch_s'] - r['compile_s']:>8.0f} "
            f"{r['real_tokens_per_s']:>10.0f} {r['tokens_vs_full_padding']:>6.2f} "
            f"{r['lengths']:>7} {r['compiles']:>8} {100 * r['data_wait_share']:>6.2f} "
            f"{r.get('steady_cpu_cores', float('nan')):>5.2f}"
        )
    lines.append(EPOCH_NOTE)
    return "\n".join(lines)


def finished_rows(
    path: Path, configs: Sequence[tuple[Any, ...]], num_batches: int
) -> tuple[list[dict[str, Any]], float]:
    """The rows an interrupted run of the same `configs` left in `path` (the longest run of
    them, in order, that finished without error) and the seconds that run took."""
    if not path.exists():
        return [], 0.0
    try:
        saved = json.loads(path.read_text())
        if saved.get("num_batches") != num_batches:
            return [], 0.0
        kept = []
        for r, (max_len, fw, st, kind, _huge, cache) in zip(
            saved["results"], configs, strict=False
        ):
            row = (r.get("max_len"), r.get("framework"), r.get("parallel"), r.get("batching"))
            same = row == (max_len, fw, st, kind) and r.get("compile_cache") == cache
            if not same or "error" in r:
                break
            kept.append(r)
        return kept, float(saved["seconds"]) if kept else 0.0
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise SystemExit(
            f"--resume: {path} is not an epoch run's record ({type(e).__name__}: {e}); "
            "move it away or run without --resume"
        ) from None


def epoch_configs(max_lens: Sequence[int]) -> list[tuple[Any, ...]]:
    """The epoch rows of `max_lens`, in the order they run: (max length, *EPOCH_ROWS row)."""
    return [(n, *row) for n in max_lens for row in EPOCH_ROWS]


def run_epoch(
    out: Path,
    num_batches: int,
    timeout: float,
    code: str,
    max_lens: Sequence[int] = EPOCH_MAX_LENS,
    kept: tuple[list[dict[str, Any]], float] = ([], 0.0),
) -> dict[str, Any]:
    """Every epoch row of `max_lens`, each in its own process and named as computed by the
    commit `code`; OUT/epoch.json after each row (an interrupted run keeps the rows it
    finished). `kept`: `finished_rows()` of a resumed run, whose rows are not run again.
    Returns the record written last."""
    configs = epoch_configs(max_lens)
    records, before = list(kept[0]), kept[1]
    if records:
        at = sorted({str(r.get("commit", "an unnamed commit")) for r in records})
        print(f"--resume: {len(records)} finished rows kept from {out / 'epoch.json'} "
              f"(computed at {', '.join(at)}; this run: {code})")  # fmt: skip
    t0 = time.time() - before  # the record's seconds: both sittings
    saved = None
    todo = configs[len(records) :]
    for i, (max_len, fw, st, kind, huge, cache) in enumerate(todo, len(records) + 1):
        flags = [
            "--framework",
            fw,
            "--parallel",
            st,
            "--batching",
            kind,
            "--huge-pages",
            huge,
            "--max-len",
            str(max_len),
            "--num-batches",
            str(num_batches),
        ]
        flags += [*JAX_BEST, "--compile-cache", cache] if fw == "jaxtpu" else []
        t = time.time()
        r = {
            "framework": fw,
            "parallel": st,
            "batching": kind,
            "max_len": max_len,
            **run_worker(flags, max(timeout, 3600.0), "epoch"),
            "commit": code,
        }
        status = r.get("error") or f"epoch {r['epoch_s']:.0f}s"
        name = f"{max_len} {fw} {st} {kind} huge pages {huge}" + (f" {cache}" if cache else "")
        progress(i, len(configs), name, status, t)
        records.append(r)
        # after every row: an interrupted run keeps the rows it finished
        saved = write_record(out / "epoch.json", t0, records, num_batches=num_batches)
    if saved is None:  # every row had finished before
        saved = write_record(out / "epoch.json", t0, records, num_batches=num_batches)
    print(epoch_table(records))
    print(f"wrote {out / 'epoch.json'} in {time.time() - t0:.0f}s")
    return saved


def plot(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if "error" not in r]
    if not ok:
        return
    labels = [
        f"{r['framework']} {_strategy(r)}\n{r['workload']} {r['precision']} x{r['devices']}"
        for r in ok
    ]
    colors = {"jaxtpu": "tab:blue", "torch_xla": "tab:orange", "torch": "tab:gray"}
    fig, ax = plt.subplots(figsize=(max(6, 0.55 * len(ok) + 2), 5))
    low = [r["median_s"] - r["p10_s"] for r in ok]
    high = [r["p90_s"] - r["median_s"] for r in ok]
    ax.bar(
        range(len(ok)),
        [r["median_s"] for r in ok],
        yerr=[low, high],
        color=[colors[r["framework"]] for r in ok],
    )
    ax.set_xticks(range(len(ok)), labels, rotation=90, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("median step time, s (log; bars p10-p90)")
    ax.set_title(
        f"train step, global batch {ok[0]['batch']} x seq {ok[0]['seq']} (lower is better)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training.compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="directory for benchmarks.json and .png")
    p.add_argument("--quick", action="store_true", help="MiniLM bf16 on 8 devices + references")
    p.add_argument("--all", action="store_true", help="also every other torch_xla row (slow)")
    p.add_argument(
        "--memory",
        action="store_true",
        help="only the memory-option rows (jit --sharding fsdp, --remat layer) and the same rows "
        "without them (MiniLM bf16 on 8 devices, and on 2 with 8 steps per call)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds of timed steps per configuration (at least 3 steps, at most 10); "
        "default 20 with --quick, 8 otherwise",
    )
    p.add_argument("--timeout", type=float, default=1500, help="seconds per configuration")
    p.add_argument("--epoch", action="store_true", help="the real-data epoch benchmark instead")
    p.add_argument(
        "--epoch-batches",
        type=int,
        default=0,
        help="--epoch: batches of the epoch each row runs (0, the default: the whole epoch)",
    )
    p.add_argument(
        "--epoch-max-len",
        type=int,
        choices=EPOCH_MAX_LENS,
        action="append",
        help="--epoch: run only this max length's rows (repeatable; default: 128 and 256)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="--epoch: keep the rows an interrupted run of the same rows left in DIR/epoch.json "
        "(in order, up to its first failed row) and run only the rest; with --report, rows "
        "computed at another commit (or a checkout with changes) are refused before any row "
        "runs, since a report's caption names one commit",
    )
    p.add_argument(
        "--report",
        metavar="FILE",
        help="also keep the results as a measured report (benchmarks.shared.measured), e.g. "
        "docs/measured/compare-quick.json, the table docs/benchmarks.md shows (with --epoch: "
        "kind epoch, whole epochs only)",
    )
    p.add_argument(
        "--replot",
        action="store_true",
        help="only print the table and redraw the plot from DIR/benchmarks.json (no runs)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.replot and args.epoch:
        print(epoch_table(json.loads((out / "epoch.json").read_text())["results"]))
        return 0
    if args.resume and not args.epoch:
        p.error("--resume: of --epoch rows only")
    if args.epoch and args.report and args.epoch_batches:
        p.error("--report: of whole epochs only (--epoch-batches projects the rows)")
    if args.epoch:
        out.mkdir(parents=True, exist_ok=True)
        started = start_report(args.report, "benchmarks.training.compare")  # the code and machine
        max_lens = args.epoch_max_len or EPOCH_MAX_LENS
        code = started["commit"] if started else measured.commit()
        kept = ([], 0.0)
        if args.resume:
            kept = finished_rows(out / "epoch.json", epoch_configs(max_lens), args.epoch_batches)
        why = measured.other_code([r.get("commit") for r in kept[0]], code)
        if args.report and why:
            p.error(f"--resume --report: {out / 'epoch.json'}: {why}")
        saved = run_epoch(out, args.epoch_batches, args.timeout, code, max_lens, kept)
        if args.report:
            path = keep_report(
                args.report, "epoch", saved, "benchmarks.training.compare", argv, started
            )
            print(f"kept as {path}")
        return 0
    if args.replot:
        saved = json.loads((out / "benchmarks.json").read_text())
        print(f"measured {saved['created']} in {saved['seconds']:.0f}s")
        print(table(saved["results"], saved["matmul_peak_gflops"], saved.get("cpu")))
        plot(saved["results"], out / "benchmarks.png")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    # the code and machine that measure
    started = start_report(args.report, "benchmarks.training.compare")
    t0 = time.time()
    peaks = {}
    for precision in ("fp32", "bf16"):
        res = run_worker(["--peak", "--precision", precision, "--devices", "1"], 300)
        peaks[precision] = res.get("peak_gflops", float("nan"))
    print(f"matmul peak: {peaks}", flush=True)
    configs = matrix(args.quick, args.all, args.memory)
    records = []
    for i, c in enumerate(configs, 1):
        flags = [x for k, v in c.items() for x in ("--" + k.replace("_", "-"), str(v))]
        flags += ["--budget", str(args.budget or (20.0 if args.quick else 8.0))]
        t = time.time()
        r = {**c, **run_worker(flags, args.timeout)}
        if "median_s" in r:
            r["mfu"] = r["model_gflop"] / r["median_s"] / peaks[r["precision"]]
            status = f"median {r['median_s']:.3f}s, compile {r['compile_s']:.1f}s"
        else:
            status = r["error"]
        progress(i, len(configs), " ".join(map(str, c.values())), status, t)
        records.append(r)
    saved = write_record(out / "benchmarks.json", t0, records, matmul_peak_gflops=peaks)
    print(table(records, peaks, cpu_record()))
    if args.report:
        kept = keep_report(
            args.report, "compare", saved, "benchmarks.training.compare", argv, started
        )
        print(f"kept as {kept}")
    plot(records, out / "benchmarks.png")
    print(
        f"wrote {out / 'benchmarks.json'} and {out / 'benchmarks.png'} in {time.time() - t0:.0f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
