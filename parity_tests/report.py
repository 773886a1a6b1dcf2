"""`python -m parity_tests.report --out DIR`: run the parity checks and report them for people.

Prints a table (check, tolerance, measured worst value, pass/fail), writes `DIR/parity.json`
with those fields (plus the loss series) and `DIR/parity.png`: per configuration, the two loss
curves overlaid and their relative difference below. `--from-json` re-prints and re-plots an
earlier `parity.json` without running anything.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

from parity_tests import checks, families, family_checks, fp16, lora


def run_all(work: Path, full: bool, quick: bool, only: str = "") -> list[checks.Result]:
    work.mkdir(parents=True, exist_ok=True)
    steps = [
        ("forward + gradients", lambda: checks.forward_and_gradients(work)),
        ("trajectories toxicity", lambda: checks.trajectories(work, "toxicity")),
        ("trajectories ranking", lambda: checks.trajectories(work, "ranking")),
        ("spawn trajectory", lambda: [checks.spawn_trajectory(work)]),
        ("fp16 trajectories", lambda: fp16.fp16_trajectories(work)),
        ("families: forward + gradients", lambda: checks.families_forward(work)),
        (
            "decoders: forward + gradients",
            lambda: checks.families_forward(work, families.DECODER_NAMES),
        ),
        *[
            (f"lora: forward + gradients {f}", lambda f=f: lora.forward_and_gradients(work, f))
            for f in families.DECODER_NAMES
        ],
        *[
            (f"trajectory {f} {t}", lambda f=f, t=t: [family_checks.family_trajectory(work, f, t)])
            for f, t in checks.FAMILY_TRAJECTORIES + checks.REPORT_FAMILY_TRAJECTORIES
        ],
        *[
            (
                f"trajectory {f} {t} {v}",
                lambda f=f, t=t, v=v: [family_checks.family_trajectory(work, f, t, v)],
            )
            for f, t, v in checks.REPORT_VARIANT_TRAJECTORIES
        ],
        *[
            (f"bucketed trajectory {t}", lambda t=t: [checks.bucketed_trajectory(work, t)])
            for t in checks.BUCKETED_TASKS
        ],
    ]
    if not quick:
        steps += [
            ("outcome toxicity", lambda: [checks.outcome(work, "toxicity", full)]),
            ("outcome ranking", lambda: [checks.outcome(work, "ranking", full)]),
        ]
    steps = [(name, fn) for name, fn in steps if only in name]
    if not steps:
        raise SystemExit(f"--only {only!r}: no check is named so")
    results: list[checks.Result] = []
    for i, (name, fn) in enumerate(steps, 1):
        t0 = time.time()
        print(f"[{i}/{len(steps)}] {name} ...", flush=True)
        results.extend(fn())
        print(f"[{i}/{len(steps)}] {name}: {time.time() - t0:.0f}s", flush=True)
    return results


def table(rows: list[dict]) -> str:
    head = f"{'check':<72} {'tolerance':>10} {'measured':>10}  result  detail"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['check']:<72} {r['tolerance']:>10.3g} {r['measured']:>10.3g}  "
            f"{'pass' if r['passed'] else 'FAIL':<6}  {r['detail']}"
        )
    passed = sum(r["passed"] for r in rows)
    lines.append(f"{passed} passed, {len(rows) - passed} failed")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [r for r in rows if len(r["series"]) == 2]
    if not curves:
        return
    ncols = min(4, len(curves))
    nrows = math.ceil(len(curves) / ncols)
    fig, axes = plt.subplots(
        2 * nrows,
        ncols,
        figsize=(4.2 * ncols, 5.2 * nrows),
        squeeze=False,
        gridspec_kw={"height_ratios": [3, 1] * nrows},
    )
    for i, r in enumerate(curves):
        top, bottom = axes[2 * (i // ncols)][i % ncols], axes[2 * (i // ncols) + 1][i % ncols]
        (name_a, a), (name_b, b) = r["series"].items()
        steps = range(1, len(a) + 1)
        top.plot(steps, a, label=name_a, lw=2)
        top.plot(steps, b, label=name_b, lw=1, ls="--")
        top.set_title(textwrap.fill(r["check"], 48), fontsize=7)
        top.set_ylabel("loss (logged)")
        top.legend(fontsize=7)
        rel = [abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=False)]
        bottom.semilogy(steps[: len(rel)], [max(v, 1e-9) for v in rel], color="tab:red")
        if r["check"].startswith("trajectory"):  # the tolerance is on these relative diffs
            bottom.axhline(r["tolerance"], color="gray", ls=":", lw=1)
        bottom.set_ylabel("rel. diff")
        bottom.set_xlabel("logged step")
    for j in range(len(curves), nrows * ncols):
        axes[2 * (j // ncols)][j % ncols].axis("off")
        axes[2 * (j // ncols) + 1][j % ncols].axis("off")
    fig.suptitle("jaxtpu vs torch_xla: loss curves (top) and relative difference (bottom)")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))  # room for the title
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m parity_tests.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, help="directory for parity.json, parity.png, runs")
    p.add_argument("--quick", action="store_true", help="skip the dropout-on outcome checks")
    p.add_argument(
        "--full",
        action="store_true",
        help="outcome checks on all 10,000 real comments at length 128 (slow)",
    )
    p.add_argument(
        "--only",
        default="",
        metavar="TEXT",
        help="run only the checks whose step name contains TEXT (e.g. 'families', "
        "'trajectory modernbert') [every check]",
    )
    p.add_argument(
        "--from-json",
        action="store_true",
        help="re-print and re-plot DIR/parity.json instead of running",
    )
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.from_json:
        rows = json.loads((out / "parity.json").read_text())["results"]
    else:
        if not checks.REAL_CSV.exists():
            print(f"error: real comments not found at {checks.REAL_CSV}", file=sys.stderr)
            return 2
        t0 = time.time()
        rows = [r.to_json() for r in run_all(out / "runs", args.full, args.quick, args.only)]
        record = {
            "created": time.strftime("%Y-%m-%d %H:%M:%S"),
            "seconds": time.time() - t0,
            "results": rows,
        }
        (out / "parity.json").write_text(json.dumps(record, indent=1))
    print(table(rows))
    plot(rows, out / "parity.png")
    print(f"wrote {out / 'parity.json'} and {out / 'parity.png'}")
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
