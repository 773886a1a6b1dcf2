"""`python -m benchmarks.training.device_check --out DIR [--dry-run]`: the one check to run when an
accelerator is lent for a few minutes (a GPU, or a TPU VM), made ready before there is one.

It needs the repository and its set-up (`make setup ACCEL=cuda` on a GPU), writes everything
under DIR, prints one table and writes DIR/device_check.json and DIR/device_check.md:

  devices   what JAX and torch find (platform, kind, count, a GPU's compute capability)
  parity    MiniLM (the shipped pretrained checkpoint, a seeded head) on 16 real comments:
            logits and every gradient, jaxtpu against plain torch on the same device, in
            fp32, bf16 (where the device has it) and fp16 (`parity_tests.forward`)
  steps     training steps per second at 128 tokens, global batch 32 (`benchmarks.training.worker`,
            5 s of steps each after the compile): MiniLM in each precision as above, jaxtpu
            jit on every local device and torch eager on one, `torch.compile` in the fastest
            precision; a BERT-base-shaped model in that precision, jaxtpu and torch eager; with
            the peak device memory where the device reports it
  scoring   comments per second of `jaxtpu.load(RUN).predict` (its second call, compiled)
            against transformers' `pipeline("text-classification")` on the run's Hugging
            Face export, batches of 32, the same comments

Every part runs its frameworks in processes of their own; a part that fails is reported and
the next one runs, and the JSON is written after each part, so a lease that ends early keeps
what finished. `--parts parity,scoring` runs some of them (a short lease); `--table-of JSON`
prints the table of a saved report. The first MiniLM parity on an H200 took 139 s of
the 8-minute budget (two processes: CUDA's start and the three precisions' compiles).
`--dry-run` runs the same code on
tiny shapes (a 2-layer random model, 8 x 16 tokens, a few steps) on whatever is here, in
about a minute on a CPU: the test suite runs it so the script cannot rot before a GPU comes.
The times are measurements of the machine it ran on; the dry run's are not figures of
anything.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from jaxtpu.core.data.demo import SAMPLE_CSV
from parity_tests.checks import (
    FORWARD_BF16_ATOL,
    FORWARD_FP32_ATOL,
    GRAD_ZERO_SHARE,
    gradient_result,
)
from parity_tests.harness import ROOT, clean_env, run_forwards, shared_init

BUDGET_S = 8 * 60  # the whole check on an accelerator
PARTS = ("parity", "steps", "scoring")
# bf16's and fp16's rounding leaves gradients that are zero in exact arithmetic (attention's
# key bias: softmax ignores a constant added to every score) at up to ~4e-6 of the global norm
# (H200); below this share they are compared absolutely, and reported apart from the worst.
REDUCED_ZERO_SHARE = 1e-4


def call(cmd: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """A worker process (the repository's root, offline for Hugging Face, JAX not grabbing
    the whole GPU so a torch process after it finds memory); raises with its stderr's tail."""
    env = clean_env({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed:\n{proc.stderr[-2000:]}")
    return proc


DEVICES_JAX = """
import json, jax
from importlib.metadata import version
d = jax.devices()
print(json.dumps({"platform": d[0].platform, "kind": d[0].device_kind, "count": len(d),
                  "compute_capability": getattr(d[0], "compute_capability", None),
                  "versions": f"jax {jax.__version__}, flax {version('flax')}"}))
"""
DEVICES_TORCH = """
import json, torch
from importlib.metadata import version
cuda = torch.cuda.is_available()
print(json.dumps({"cuda": cuda, "count": torch.cuda.device_count() if cuda else 0,
                  "versions": f"torch {torch.__version__}, transformers {version('transformers')}",
                  "name": torch.cuda.get_device_name(0) if cuda else "cpu",
                  "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(0)))
                  if cuda else None}))
"""


def devices() -> dict[str, Any]:
    found = {}
    for side, code in (("jax", DEVICES_JAX), ("torch", DEVICES_TORCH)):
        found[side] = json.loads(call([sys.executable, "-c", code]).stdout.strip().splitlines()[-1])
    return found


def precisions(found: dict[str, Any]) -> list[str]:
    """fp32 everywhere; bf16 where the device computes it (a TPU, a CPU, a GPU of compute
    capability 8.0 or more); fp16 on a GPU and on a CPU (for the dry run), not on a TPU."""
    from jaxtpu.core.hardware import precision_problem

    jax = found["jax"]
    out = ["fp32"]
    if not precision_problem("bf16", jax["platform"], jax["compute_capability"]):
        out.append("bf16")
    if jax["platform"] != "tpu":
        out.append("fp16")
    return out


def parity(out: Path, found: dict[str, Any], dry: bool, which: list[str]) -> list[dict]:
    """Logits and gradients of jaxtpu and plain torch on the device, per precision."""
    model_dir = shared_init(out / "init", "toxicity", "tiny" if dry else "minilm")
    torch_side = "cuda" if found["torch"]["cuda"] else "hf"
    sides = {}
    for side in ("jax", torch_side):
        sides[side] = run_forwards(
            side, model_dir, SAMPLE_CSV, out / f"forward-{side}.npz", tuple(which)
        )
    rows = []
    for precision in which:
        mine, ref = sides["jax"][precision], sides[torch_side][precision]
        logits = float(np.max(np.abs(mine["logits"] - ref["logits"])))
        grads = gradient_result(
            "", ref, mine, GRAD_ZERO_SHARE if precision == "fp32" else REDUCED_ZERO_SHARE
        )
        bound = FORWARD_FP32_ATOL if precision == "fp32" else FORWARD_BF16_ATOL
        rows.append(
            {
                "precision": precision,
                "logits_max_abs_diff": logits,
                "logits_bound": bound,
                "grad_worst_rel_diff": grads.measured,
                "grad_worst_tensor": grads.detail.removeprefix("worst tensor "),
                "grad_bound": grads.tolerance if precision == "fp32" else None,
                "passed": logits <= bound and (precision != "fp32" or grads.passed),
            }
        )
    return rows


def step_plan(
    dry: bool, which: list[str], jax_devices: int
) -> list[tuple[str, str, str, str, str]]:
    """(workload, precision, framework, strategy, devices) of each `benchmarks.training.worker`
    process: MiniLM in every precision by jaxtpu jit and torch eager; `torch.compile` and the
    BERT-base-shaped model in the fastest precision (bf16 where the device has it, else fp16)."""
    n = str(jax_devices)
    if dry:
        return [("tiny", "fp16", "jaxtpu", "jit", n), ("tiny", "fp16", "torch", "eager", "1")]
    fast = "bf16" if "bf16" in which else which[-1]
    ways = (("jaxtpu", "jit", n), ("torch", "eager", "1"))
    plan = [("minilm", p, f, s, d) for p in which for f, s, d in ways]
    plan.append(("minilm", fast, "torch", "compile", "1"))
    plan += [("bert-base", fast, "jaxtpu", "jit", n), ("bert-base", fast, "torch", "eager", "1")]
    return plan


def steps(out: Path, found: dict[str, Any], dry: bool, which: list[str]) -> list[dict]:
    """Steps per second of each way and precision (`benchmarks.training.worker`, a process each)."""
    cuda = found["torch"]["cuda"]
    shape = ["--batch", "8", "--seq", "16", "--max-steps", "2", "--min-steps", "1"]
    if not dry:
        shape = ["--batch", "32", "--seq", "128", "--max-steps", "20", "--budget", "5"]
    rows = []
    for workload, precision, framework, parallel, n in step_plan(dry, which, found["jax"]["count"]):
        cmd = [
            *(sys.executable, "-m", "benchmarks.training.worker", "--framework", framework),
            *("--parallel", parallel, "--workload", workload, "--devices", n),
            *("--precision", precision, *shape),
            *(["--device", "cuda"] if framework == "torch" and cuda else []),
        ]
        t0 = time.time()
        record = json.loads(call(cmd).stdout.strip().splitlines()[-1])
        rows.append(
            {
                "workload": workload,
                "precision": precision,
                "way": f"{framework} {parallel}",
                "devices": int(n),
                "steps_per_s": 1.0 / record["median_s"],
                "compile_s": record["compile_s"],
                "device_peak_mb": record.get("peak_device_mb"),
                "process_s": time.time() - t0,
            }
        )
        print(f"device_check: steps {rows[-1]}", flush=True)
    return rows


SCORE_JAX = """
import json, sys, time, jaxtpu
texts = json.load(open(sys.argv[2]))
model = jaxtpu.load(sys.argv[1])
model.predict(texts)  # compiles each length bucket's program
t = time.perf_counter(); model.predict(texts); s = time.perf_counter() - t
print(json.dumps({"per_s": len(texts) / s}))
"""
SCORE_PIPELINE = """
import json, sys, time, torch
from transformers import pipeline
texts = json.load(open(sys.argv[2]))
pipe = pipeline("text-classification", model=sys.argv[1], top_k=None,
                device=0 if torch.cuda.is_available() else -1)
kw = dict(batch_size=32, truncation=True, max_length=int(sys.argv[3]))
pipe(texts[:32], **kw)  # warm-up
t = time.perf_counter(); pipe(texts, **kw); s = time.perf_counter() - t
print(json.dumps({"per_s": len(texts) / s}))
"""


def scoring(out: Path, dry: bool) -> list[dict]:
    """A briefly trained run (its own head, so transformers' pipeline loads its export)
    scored both ways on the same comments."""
    run, export, max_len = out / "run", out / "hf", "16" if dry else "128"
    preset = ["--preset", "tiny"] if dry else ["--preset", "minilm"]
    if not (run / "summary.json").exists():
        call(
            [
                *(sys.executable, "-m", "jaxtpu.train", *preset, "--head", "hf"),
                *("--max-steps", "2", "--precision", "fp32", "--max-len", max_len),
                *("--workdir", str(run), "--no-progress", "--num-devices", "1"),
            ]
        )
    if not export.exists():
        call([sys.executable, "-m", "jaxtpu.export", "--workdir", str(run), "--out", str(export)])
    with open(SAMPLE_CSV, newline="", encoding="utf-8") as f:
        texts = [row["comment_text"] for row in csv.DictReader(f)][: 64 if dry else 2000]
    path = out / "comments.json"
    path.write_text(json.dumps(texts))
    rows = []
    for way, code, model in (
        ("jaxtpu.load().predict", SCORE_JAX, run),
        ("transformers pipeline", SCORE_PIPELINE, export),
    ):
        cmd = [sys.executable, "-c", code, str(model), str(path), max_len]
        rate = json.loads(call(cmd).stdout.strip().splitlines()[-1])["per_s"]
        rows.append({"way": way, "comments": len(texts), "comments_per_s": rate})
    return rows


def table(report: dict[str, Any]) -> str:
    """The report as Markdown: a table of each part that has rows, and each failed part."""
    j, t = report["devices"]["jax"], report["devices"]["torch"]
    lines = [
        f"device check{' (dry run: tiny shapes, not figures)' if report['dry_run'] else ''}: "
        f"jax {j['count']} x {j['kind']} ({j['platform']}), torch {t['name']}; "
        f"{report['seconds']:.0f} s",
        *(["", f"{j['versions']}; {t['versions']}"] if "versions" in j else []),
    ]
    if report.get("parity"):
        lines += [
            "",
            "| parity | logits max abs diff (bound) | worst gradient rel diff (bound) | ok |",
        ]
        lines.append("|---|---|---|---|")
    for r in report.get("parity", []):
        grad = f"{r['grad_worst_rel_diff']:.2g}" + (
            f" ({r['grad_bound']:g})" if r["grad_bound"] else " (reported)"
        )
        if r.get("grad_worst_tensor"):
            grad += f", {r['grad_worst_tensor']}"
        lines.append(
            f"| {r['precision']} | {r['logits_max_abs_diff']:.2g} ({r['logits_bound']:g}) | "
            f"{grad} | {'yes' if r['passed'] else 'NO'} |"
        )
    if report.get("steps"):
        lines += ["", "| workload | precision | way | devices | steps/s | compile s | peak MB |"]
        lines.append("|---|---|---|---|---|---|---|")
    for r in report.get("steps", []):
        peak = "-" if r["device_peak_mb"] is None else f"{r['device_peak_mb']:,.0f}"
        lines.append(
            f"| {r['workload']} | {r['precision']} | {r['way']} | {r['devices']} | "
            f"{r['steps_per_s']:.2f} | {r['compile_s']:.1f} | {peak} |"
        )
    if report.get("scoring"):
        lines += ["", "| scoring | comments | comments/s |", "|---|---|---|"]
    for r in report.get("scoring", []):
        lines.append(f"| {r['way']} | {r['comments']} | {r['comments_per_s']:,.0f} |")
    for name, why in report.get("failed", {}).items():
        lines += ["", f"**{name} failed:** {why.splitlines()[-1] if why else ''}"]
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training.device_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", help="a directory for everything it writes (required to run)")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes (the suite runs this)")
    p.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"comma-separated, of {', '.join(PARTS)} (default: all, in that order)",
    )
    p.add_argument("--table-of", metavar="JSON", help="print the table of a saved report and stop")
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.table_of:
        print(table(json.loads(Path(args.table_of).read_text())), end="")
        return 0
    wanted = [x for x in args.parts.split(",") if x]
    if not args.out or not wanted or set(wanted) - set(PARTS):
        p.error(f"--out DIR is required, and --parts names some of {', '.join(PARTS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    report: dict[str, Any] = {"dry_run": args.dry_run, "devices": devices()}
    report.update({name: [] for name in PARTS})
    which = precisions(report["devices"])
    parts = {
        "parity": lambda: parity(out, report["devices"], args.dry_run, which),
        "steps": lambda: steps(out, report["devices"], args.dry_run, which),
        "scoring": lambda: scoring(out, args.dry_run),
    }
    for name in wanted:
        started = time.time()
        print(f"device_check: {name} ...", flush=True)
        try:
            report[name] = parts[name]()
        except Exception as e:  # a part that fails keeps the parts before and after it
            report.setdefault("failed", {})[name] = f"{type(e).__name__}: {e}"[-3000:]
            print(f"device_check: {name} FAILED: {report['failed'][name]}", flush=True)
        print(f"device_check: {name} done in {time.time() - started:.0f} s", flush=True)
        report["seconds"] = time.time() - t0
        (out / "device_check.json").write_text(json.dumps(report, indent=2) + "\n")
    text = table(report)
    (out / "device_check.md").write_text(text)
    print(text, end="")
    if report["seconds"] > BUDGET_S and not args.dry_run:
        print(f"device_check: took {report['seconds']:.0f} s, over its {BUDGET_S} s budget")
    failed = report.get("failed") or not all(r["passed"] for r in report["parity"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
