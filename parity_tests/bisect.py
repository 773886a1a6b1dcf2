"""`python -m parity_tests.bisect --model-dir DIR --out OUT`: where does the port part ways?

Runs one Hugging Face directory (encoder + `head.safetensors`, e.g. a `jaxtpu.export`) and
the same real comments through jaxtpu and through transformers' PyTorch model (and, with
`--xla`, the torch_xla device), each in its own process (`parity_tests.forward`), captures
every layer's output (embeddings; per encoder layer its attention block, feed-forward
activation and output; pooler; head) and, for one training step, every parameter's gradient,
and prints a table: point, max abs difference, difference relative to the reference's scale,
the tolerance for the precision, pass/fail, and the first point where the sides part.
`OUT/bisect.json` holds the same, `OUT/bisect.png` plots the error by layer, and
`OUT/<side>.npz` keeps each side's captured outputs and gradients.

The reference is transformers in fp32. Forward: max |a - b| / max |b| over real tokens (padding
positions carry no information and are left out). Gradients: ||a - b|| / ||b|| per tensor,
listed in backward order (head first) so that a backward-only bug is found where it starts;
when the forward already parts, every gradient downstream of that point parts too.
`--plant-fault KIND:LAYER` plants a known porting bug on the JAX side to see the report find it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.runspec import RunSpec
from jaxtpu.core.flags.schema import Config
from parity_tests.forward import FAULTS, capture_points, encoder, parse_fault
from parity_tests.harness import run_forward

# Relative to the activation's scale. Measured on MiniLM and 16 real comments (docs/migrating.md,
# the bisection): fp32 worst point 1.2e-6 (jaxtpu) and 1.5e-6 (torch_xla); 2e-5 leaves room
# for deeper models and longer inputs and still catches the subtlest planted fault measured
# (tanh GELU in MiniLM's layer 3: 3.5e-5 at that layer's feed-forward activation). bf16
# against the fp32 reference: worst 7.0e-3 (jaxtpu) and 1.2e-2 (torch_xla); gradients 1.8e-2
# and 4.9e-2.
FORWARD_RTOL = {"fp32": 2e-5, "bf16": 5e-2}
GRAD_RTOL = {"fp32": 1e-3, "bf16": 1e-1}
# Gradients that are mathematically zero (the attention key bias: softmax ignores a constant
# per row) come out as rounding noise; below this share of the global norm a tensor is compared
# against the share itself (tolerance 1 in the table). Measured on MiniLM: fp32 noise up to
# 3.8e-10 of the norm, bf16 up to 1.5e-5 (torch_xla) and 1.9e-6 (jaxtpu).
GRAD_ZERO_SHARE = {"fp32": 1e-6, "bf16": 1e-4}


@dataclass
class Row:
    point: str
    max_abs: float
    relative: float
    tolerance: float
    passed: bool


def forward_rows(side: dict, ref: dict, mask: np.ndarray, precision: str) -> list[Row]:
    """One row per captured output, in forward order; padding positions left out."""
    rows = []
    for key in [k for k in ref if k.startswith("act/")]:
        a, b = side[key], ref[key]
        if a.ndim == 3:  # (batch, tokens, features): real tokens only
            a, b = a[mask > 0], b[mask > 0]
        diff = float(np.abs(a - b).max())
        rel = diff / max(float(np.abs(b).max()), 1e-12)
        tol = FORWARD_RTOL[precision]
        rows.append(Row(key.removeprefix("act/"), diff, rel, tol, rel <= tol))
    return rows


def gradient_rows(side: dict, ref: dict, precision: str) -> list[Row]:
    """One row per parameter, in backward order (head, pooler, last layer, ..., embeddings)."""
    keys = [k for k in ref if k.startswith("grad/")][::-1]
    norm = float(np.sqrt(sum(np.sum(ref[k].astype(np.float64) ** 2) for k in keys)))
    rows = []
    for k in keys:
        if k not in side:
            rows.append(Row(k.removeprefix("grad/"), float("inf"), float("inf"), 0.0, False))
            continue
        diff = float(np.linalg.norm(side[k] - ref[k]))
        size = float(np.linalg.norm(ref[k]))
        floor = GRAD_ZERO_SHARE[precision] * norm
        if size < floor:
            rows.append(Row(k.removeprefix("grad/"), diff, diff / floor, 1.0, diff <= floor))
            continue
        tol = GRAD_RTOL[precision]
        rows.append(Row(k.removeprefix("grad/"), diff, diff / size, tol, diff / size <= tol))
    return rows


def first_failure(rows: list[Row]) -> str | None:
    return next((r.point for r in rows if not r.passed), None)


def run_worker(side: str, args: argparse.Namespace, precision: str, out: Path) -> dict:
    flags = [
        "--n",
        str(args.n),
        "--max-len",
        str(args.max_len),
        "--precision",
        precision,
        "--grads",
        "--capture",
    ]
    if side == "jax" and args.plant_fault:
        flags += ["--plant-fault", args.plant_fault]
    try:
        return run_forward(side, args.model_dir, args.csv, out, *flags)
    except AssertionError as e:
        tail = (str(e).strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"error: the {side} side failed: {tail}") from None


def table(title: str, rows: list[Row]) -> str:
    head = f"{'point':<52} {'max abs':>10} {'relative':>10} {'tolerance':>10}  result"
    lines = [title, head, "-" * len(head)]
    lines += [
        f"{r.point:<52} {r.max_abs:>10.3g} {r.relative:>10.3g} {r.tolerance:>10.3g}  "
        f"{'pass' if r.passed else 'FAIL'}"
        for r in rows
    ]
    first = first_failure(rows)
    lines.append(f"first point where the sides part: {first}" if first else "all points pass")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.2 * len(report["gradients"][0]["rows"])), 8))
    for ax, kind in zip(axes, ("forward", "gradients"), strict=True):
        for entry in report[kind]:
            rows = entry["rows"]
            ax.semilogy(
                range(len(rows)),
                [max(r["relative"], 1e-12) for r in rows],
                marker="o",
                ms=3,
                label=entry["side"],
            )
            ax.set_xticks(range(len(rows)), [r["point"] for r in rows], rotation=90, fontsize=6)
        ax.axhline(report[kind][0]["rows"][0]["tolerance"], color="gray", ls=":", lw=1)
        ax.set_ylabel("relative difference")
        ax.set_title(f"{kind} vs transformers fp32" + (" (backward order)" * (kind != "forward")))
        ax.legend(fontsize=7)
    fig.suptitle(f"layer-by-layer parity, {report['precision']}, {report['model_dir']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bisect(args: argparse.Namespace, work: Path) -> dict:
    """Runs the sides (their outputs kept in `work` as `<side>.npz`) and compares them."""
    enc = encoder(args.model_dir)
    sides = [("jax", "jaxtpu")] + [("xla", "torch_xla")] * bool(args.xla)
    points = len(capture_points(enc))
    print(f"[1/{len(sides) + 1}] transformers fp32 (reference), {points} points", flush=True)
    ref = run_worker("hf", args, "fp32", work / "hf.npz")
    mask = ref["attention_mask"]
    report: dict = {
        "model_dir": str(args.model_dir),
        "precision": args.precision,
        "comments": args.n,
        "max_len": args.max_len,
        "plant_fault": args.plant_fault,
        "forward": [],
        "gradients": [],
    }
    for i, (side, name) in enumerate(sides, 2):
        print(f"[{i}/{len(sides) + 1}] {name} {args.precision}", flush=True)
        out = run_worker(side, args, args.precision, work / f"{side}.npz")
        fwd = forward_rows(out, ref, mask, args.precision)
        grads = gradient_rows(out, ref, args.precision)
        for kind, rows in (("forward", fwd), ("gradients", grads)):
            report[kind].append(
                {
                    "side": name,
                    "first_failure": first_failure(rows),
                    "rows": [asdict(r) for r in rows],
                }
            )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    from parity_tests.checks import REAL_CSV

    p = argparse.ArgumentParser(
        prog="python -m parity_tests.bisect",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--model-dir",
        required=True,
        help="Hugging Face directory with head.safetensors (python -m jaxtpu.export writes one).",
    )
    p.add_argument("--out", required=True, help="directory for bisect.json and bisect.png")
    p.add_argument(
        "--csv",
        default=str(REAL_CSV),
        help="labelled classification CSV (comment_text, toxic) [default: the real comments]",
    )
    p.add_argument("--n", type=int, default=16, help="comments in the batch [default: 16]")
    p.add_argument("--max-len", type=int, default=64, help="tokens per comment [default: 64]")
    p.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="precision of the compared sides; the reference stays fp32 [default: fp32]",
    )
    p.add_argument("--xla", action="store_true", help="also compare the torch_xla device")
    p.add_argument(
        "--plant-fault",
        metavar="KIND:LAYER",
        help="plant a known porting bug in one encoder layer of the JAX side, to see the report "
        "find it: " + "; ".join(f"{k}: {v}" for k, v in FAULTS.items()),
    )
    args = p.parse_args(argv)
    if not Path(args.csv).exists():
        p.error(f"--csv {args.csv}: no such file")
    if not (Path(args.model_dir) / "head.safetensors").exists():
        p.error(
            f"--model-dir {args.model_dir}: no head.safetensors (export a run with "
            "python -m jaxtpu.export)"
        )
    try:  # the trainers' checks: a readable config.json, --max-len within the position table
        spec = RunSpec.resolve(Config().replace(model_dir=args.model_dir, max_len=args.max_len))
    except UserError as e:
        p.error(str(e))
    if args.plant_fault:
        try:
            parse_fault(args.plant_fault, spec.encoder.num_hidden_layers)
        except ValueError as e:
            p.error(str(e))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = bisect(args, out)
    (out / "bisect.json").write_text(json.dumps(report, indent=1))
    for kind in ("forward", "gradients"):
        for entry in report[kind]:
            rows = [Row(**r) for r in entry["rows"]]
            print(table(f"\n{kind}: {entry['side']} {args.precision} vs transformers fp32", rows))
    plot(report, out / "bisect.png")
    print(f"wrote {out / 'bisect.json'} and {out / 'bisect.png'}")
    failed = any(e["first_failure"] for kind in ("forward", "gradients") for e in report[kind])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
