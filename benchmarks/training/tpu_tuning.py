"""Each speed choice of the code, re-examined against the TPU compiler's cost model: the
estimated step time (`pf_speed.estimate`, the compiler's `optimal_seconds` for the unrolled
train step, an estimate, not a measurement) of the choices measured on this CPU ('default':
hash dropout, fp32 results of the bf16 matmuls, exact GELU, ZeRO-1) and of each alternative,
one change at a time; 'tpu' is what --sharding auto and --matmul-output auto pick on a TPU.

`python -m benchmarks.training.tpu_tuning --preset bert-base --target v3-8 --max-len 128
--batch-size 32`

The alternatives the code does not offer as flags are swapped in for this process only:
  dropout=prng       JAX's own PRNG bits (`jax.random.bits`, threefry) for the dropout masks
                     instead of the counter hash (`ops.hash_bits`)
  matmul_out=bf16    --matmul-output bf16: the bf16 matmuls return bf16 (fp32 accumulation,
                     then rounded) instead of fp32
  gelu=tanh          tanh-approximated GELU instead of the exact erf form
  dropout=off        no dropout at all: what masks cost in the step
  sharding=...       the state replicated, or FSDP, instead of ZeRO-1
  layernorm_out=bf16 LayerNorm returns bf16 (computed in fp32): a bf16 residual stream, as
                     Flax models with dtype=bfloat16 have (PyTorch's autocast keeps fp32)
A variant of several changes joins them with '+', e.g. matmul_out=bf16+sharding=fsdp.
Scanned layers and K steps per call cannot be compared this way: the cost model counts a
loop's body once (`pf_speed.unrolled`), and what K saves (host dispatch) is not in the
device program at all.

Rows print as JSON lines; `--out FILE` keeps them. The floor is the model's FLOPs at the
target's bf16 peak (`EncoderConfig.train_flops`). `--breakdown N` also prints, for each
variant, the N groups of the compiled step's operations whose memory traffic adds the most
time beyond their FLOPs (`jaxtpu.preflight.roofline`): where the step's distance from its floor
comes from. Each row also has that roofline's own step time (`roofline_step_s`): jaxtpu's
estimate from the compiled program, not the compiler's, and the only one for targets whose
cost model gives no usable step time (v4, v5e and v6e with every libtpu on PyPI here).
`--program` also keeps what the compiler wrote into each program (its matmul FLOPs, operations
in on-chip memory, async copies and slices, loops, windowed matmul loops).
`--report FILE` keeps the rows as a kept report (`benchmarks.shared.measured`, kind `tpu_tuning`,
captioned as an estimate; `table`: a row per variant against the floor, and with `--breakdown`
each variant's groups, kept in its row).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.shared.measured import keep as keep_report
from benchmarks.shared.measured import start as start_report

VARIANTS = (
    "default",
    "dropout=prng",
    "matmul_out=bf16",
    "gelu=tanh",
    "dropout=off",
    "sharding=replicated",
    "sharding=fsdp",
    "layernorm_out=bf16",
    "tpu",
)


CHOICES = {  # what each variant is, as docs/tpu.md's table says it
    "default": "as measured on the CPU: hash dropout, fp32 matmul results, erf GELU, ZeRO-1",
    "dropout=prng": "dropout masks from JAX's PRNG (threefry) instead of the counter hash",
    "matmul_out=bf16": "bf16 matmul results (`--matmul-output bf16`), forward and backward",
    "gelu=tanh": "tanh GELU instead of exact erf",
    "dropout=off": "no dropout at all (what the masks cost)",
    "sharding=replicated": "state replicated instead of ZeRO-1",
    "sharding=fsdp": "FSDP over the devices instead of ZeRO-1 (`--sharding fsdp`)",
    "layernorm_out=bf16": "LayerNorm results in bf16 (a bf16 residual stream)",
    "tpu": "bf16 matmul results and FSDP (what a TPU gets with `auto`)",
}


def _roofline(r: dict[str, Any]) -> str:
    """The roofline's step, a range where the program keeps arrays on the chip (v4 and later:
    on-chip bytes free, or at the HBM rate), one figure where both ends agree within 1% (v2, v3)."""
    lo, hi = r["roofline_step_s"], r.get("roofline_high_s", r["roofline_step_s"])
    return f"{lo:.4f}" if abs(hi - lo) <= 0.01 * lo else f"{lo:.4f}-{hi:.4f}"


def table(rows: list[dict[str, Any]]) -> str:
    """A kept report's table (kind `tpu_tuning`): a row per variant, the compiler's estimated
    step and its ratio to the FLOP floor, jaxtpu's roofline of the same program (and, with
    `--rates-of`, that program's roofline at other targets' rates); what was compiled above
    it, with `--breakdown` each variant's groups below, and that these are estimates."""
    r0 = rows[0]
    model = ", ".join(f"{k} {v}" for k, v in json.loads(r0["model"] or "{}").items())
    rates = [k[len("roofline_at_") : -2] for k in r0 if k.startswith("roofline_at_")]
    floors = {r["target"]: r["floor_s"] for r in rows}  # several where reports of two join
    on = ", ".join(f"{t} ({floor:.4f} s)" for t, floor in floors.items())
    several = len(floors) > 1
    lines = [
        f"{r0['preset']}{' with ' + model if model else ''}, length {r0['max_len']}, "
        f"{r0['batch_per_device']} per device, bf16, jit, on {on}; x floor: the estimate "
        "over the model's FLOPs at the target's bf16 peak (in parentheses).",
        "",
        f"| choice | variant |{' target |' * several} est. s/step | x floor | roofline s/step |"
        + "".join(f" at {t}'s rates |" for t in rates),
        "|---|---|---|---|---|" + "---|" * (len(rates) + several),
    ]
    for r in rows:
        est = f"{r['est_step_s']:.4f}" if r["est_step_s"] > 0 else f"({r['est_step_s']:.3g})"
        floor = f"{r['vs_floor']:.2f}" if r["vs_floor"] else "-"
        choice = CHOICES.get(r["variant"], r["variant"])
        target = f" {r['target']} |" * several
        there = "".join(f" {r[f'roofline_at_{t}_s']:.4f} |" for t in rates)
        lines.append(
            f"| {choice} | `{r['variant']}` |{target} {est} | {floor} | {_roofline(r)} |{there}"
        )
    if any(r.get("program") for r in rows):
        lines += ["", *program_table(rows)]
    for r in rows:
        if r.get("breakdown"):
            lines += ["", *breakdown_table(r)]
    return "\n".join(lines) + (
        "\n\nEstimates, not measurements: the TPU compiler's cost model (`optimal_seconds`) of "
        "the unrolled train step compiled for a TPU that was not there (in parentheses where it "
        "is negative, as on v4, v5e and v6e off a TPU), and jaxtpu's roofline of that program."
    )


def program_table(rows: list[dict[str, Any]]) -> list[str]:
    """What the compiler wrote into each variant's program (`--program`) as Markdown lines: its
    matmul FLOPs, its bytes by the compiler's count and by the roofline's two readings, and the
    operations of `jaxtpu.preflight.roofline.program_counts`."""
    lines = [
        "The compiled programs (matmul GFLOP per device by the roofline's count; GB per step by "
        "the compiler's `bytes accessed`, by the roofline with on-chip arrays at the HBM rate, "
        "and by the roofline with them free; operations as written, a loop's body once):",
        "",
        "| target | variant | matmul GFLOP | compiler GB | roofline GB, on-chip counted | "
        "roofline GB, HBM only | on-chip results | async copies | async slices | loops | "
        "windowed matmul loops |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r.get("program")
        if not p:
            continue
        lines.append(
            f"| {r['target']} | `{r['variant']}` | {p['matmul_gflop']:.1f} | "
            f"{r['est_gb_per_step']:.2f} | {r['roofline_high_gb_per_step']:.2f} | "
            f"{r['roofline_gb_per_step']:.2f} | {p['on_chip']:,} | {p['copy_starts']:,} | "
            f"{p['slice_starts']:,} | {p['loops']:,} | {p['windowed']:,} |"
        )
    return lines


def breakdown_table(row: dict[str, Any]) -> list[str]:
    """A variant's `--breakdown` groups (`jaxtpu.preflight.roofline`: the operations the step
    runs, grouped by the JAX operation they came from, layers folded) as Markdown lines, the
    most time beyond their FLOPs first, then the whole step."""
    lines = [
        f"Where `{row['variant']}`'s step goes beyond its FLOPs (jaxtpu's roofline of the compiled "
        "program: each operation costs max(its matmul FLOPs at the peak, its bytes at the HBM "
        "rate), grouped by the JAX operation it came from, layers folded):",
        "",
        "| operation (forward/backward, path) | ops per step | GB | est. ms | ms beyond FLOPs |",
        "|---|---|---|---|---|",
    ]
    for g in row["breakdown"]:
        name = " ".join(g["group"].split())
        name = f"**{name}**" if name == "all operations" else f"`{name}`"
        lines.append(
            f"| {name} | {g['count']:,} | {g['bytes'] / 1e9:.2f} | {g['seconds'] * 1e3:.2f} | "
            f"{g['beyond_flops'] * 1e3:.2f} |"
        )
    return lines


@contextmanager
def swapped(variant: str) -> Iterator[dict[str, Any]]:
    """The variant's code swapped in for the block (each of its '+'-joined changes); yields
    the config overrides it needs."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from jaxtpu.models import layers, ops

    saved = {name: getattr(ops, name) for name in ("hash_bits", "gelu")}
    saved_ln = layers.layer_norm
    overrides: dict[str, Any] = {}
    for change in variant.split("+"):
        if change == "dropout=prng":
            ops.hash_bits = lambda key, shape: jax.random.bits(key, shape, jnp.uint32)
        elif change == "gelu=tanh":
            ops.gelu = lambda x: jax.nn.gelu(x, approximate=True)
        elif change == "matmul_out=bf16":
            overrides.update(matmul_output="bf16")
        elif change == "tpu":
            overrides.update(matmul_output="auto", sharding="auto")
        elif change == "layernorm_out=bf16":
            layers.layer_norm = lambda cfg, name, param_dtype: nn.LayerNorm(
                epsilon=cfg.layer_norm_eps,
                dtype=jnp.bfloat16,
                param_dtype=param_dtype,
                name=name,
            )
        elif change == "dropout=off":
            overrides.update(dropout=0.0, encoder_dropout=0.0)
        elif change.startswith("sharding="):
            overrides.update(sharding=change.split("=")[1])
        elif change != "default":
            raise SystemExit(f"unknown variant {change}; choose from {', '.join(VARIANTS)}")
    try:
        yield overrides
    finally:
        for name, fn in saved.items():
            setattr(ops, name, fn)
        layers.layer_norm = saved_ln


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training.tpu_tuning",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", default="bert-base", help="a jaxtpu preset [bert-base]")
    p.add_argument("--target", default="v3-8", help="a preflight TPU target [v3-8]")
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32, help="per device [32]")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated [all]")
    p.add_argument(
        "--model",
        default="",
        help="random-init shape overrides as JSON, e.g. "
        '\'{"num_layers": 24, "hidden_size": 1024, ...}\' [none]',
    )
    p.add_argument(
        "--rates-of",
        default="",
        metavar="TARGETS",
        help="also the roofline of the program compiled for --target at these other targets' "
        "per-device bf16 peak and HBM bandwidth, e.g. v5e-8,v6e-8: what the --target "
        "program would take there (docs/tpu.md's cross-check of the v5e estimate) [none]",
    )
    p.add_argument("--out", default=None, help="also append the rows to this JSON-lines file")
    p.add_argument(
        "--report",
        metavar="FILE",
        help="also keep the rows as a report (benchmarks.shared.measured, kind tpu_tuning) for "
        "the docs",
    )
    p.add_argument(
        "--program",
        action="store_true",
        help="also keep what the compiler wrote into each variant's program: its matmul "
        "GFLOP per device, operations in on-chip memory, async copies and slices, loops and "
        "windowed matmul loops (jaxtpu.preflight.roofline.program_counts)",
    )
    p.add_argument(
        "--breakdown",
        type=int,
        default=0,
        metavar="N",
        help="also print the N operation groups that memory traffic slows the "
        "most, per variant (jaxtpu.preflight.roofline) [0: none]",
    )
    return p


def _variant_row(
    args: argparse.Namespace, base: Any, variant: str, devices: list[Any]
) -> tuple[dict[str, Any], list[Any]]:
    """One variant compiled for the target: its row (with the roofline's `--breakdown` groups
    when asked) and the roofline's operation groups."""
    from dataclasses import asdict

    from jaxtpu.core.flags.runspec import RunSpec
    from jaxtpu.preflight import roofline as hlo_roofline
    from jaxtpu.preflight import speed as pf_speed
    from jaxtpu.preflight import targets as pf_targets

    target = pf_targets.TPU_TARGETS[args.target]
    peak, bandwidth = target.peak_flops_per_device(), target.bandwidth_per_device()
    with swapped(variant) as overrides:
        cfg = base.replace(**overrides)
        spec = RunSpec.resolve(cfg, len(devices))
        t0 = time.perf_counter()
        pf_speed._ESTIMATES.clear()  # keyed by the config: a swapped kernel is not in it
        compiled = pf_speed.compile_unrolled(cfg, devices)
        e = pf_speed.estimate(cfg, devices, target, compiled)
        seconds, roofline_s = e.compiler_s, e.roofline_s
        flops = spec.encoder.train_flops(args.batch_size, args.max_len, cfg.model.remat)[0]
        text = compiled.text  # the program's text, read once for every roofline below
        ops = hlo_roofline.roofline(text, peak, bandwidth)
        floor = flops / peak
        row = {
            "preset": args.preset,
            "model": args.model,
            "target": args.target,
            "max_len": args.max_len,
            "batch_per_device": args.batch_size,
            "variant": variant,
            "est_step_s": seconds,
            "est_gb_per_step": e.compiler_bytes / 1e9,
            "floor_s": floor,
            "vs_floor": seconds / floor if seconds > 0 else None,
            "roofline_step_s": roofline_s,
            "roofline_high_s": e.roofline_high_s,
            "roofline_gb_per_step": e.roofline_bytes / 1e9,  # HBM bytes
            "roofline_high_gb_per_step": e.roofline_high_bytes / 1e9,  # on-chip too
            "roofline_vs_floor": roofline_s / floor,
            "compile_s": round(time.perf_counter() - t0, 1),
        }
    for other in filter(None, args.rates_of.split(",")):
        there = pf_targets.TPU_TARGETS[other]
        rates = there.peak_flops_per_device(), there.bandwidth_per_device()
        row[f"roofline_at_{other}_s"] = hlo_roofline.total(
            hlo_roofline.roofline(text, *rates)
        ).seconds
    if args.breakdown:  # the groups memory traffic slows the most, then the whole step
        top = [*ops[: args.breakdown], hlo_roofline.total(ops)]
        row["breakdown"] = [asdict(r) for r in top]
    if args.program:
        row["program"] = {
            "matmul_gflop": hlo_roofline.total(ops).flops / 1e9,
            **hlo_roofline.program_counts(text),
        }
    return row, ops


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)

    from jaxtpu.core.flags import presets
    from jaxtpu.engine import hosts
    from jaxtpu.preflight import roofline as hlo_roofline
    from jaxtpu.preflight import targets as pf_targets

    # the code and the machine

    started = start_report(args.report, "benchmarks.training.tpu_tuning")
    hosts.set_cpu_device_count(8)
    devices, _ = pf_targets.target_devices(args.target, 8)
    base = presets.PRESETS[args.preset]().replace(
        max_len=args.max_len,
        batch_size=args.batch_size,
        parallel="jit",
        sharding="zero1",
        matmul_output="fp32",
        **json.loads(args.model or "{}"),
    )
    rows = []
    for variant in args.variants.split(","):
        row, ops = _variant_row(args, base, variant, devices)
        print(json.dumps({k: v for k, v in row.items() if k != "breakdown"}), flush=True)
        rows.append(row)
        if args.breakdown:
            print(hlo_roofline.table(ops, args.breakdown, max(row["est_step_s"], 0.0)), flush=True)
        if args.out:
            with Path(args.out).open("a") as f:
                f.write(json.dumps(row) + "\n")
    if args.report:
        kept = keep_report(
            args.report, "tpu_tuning", rows, "benchmarks.training.tpu_tuning", argv, started
        )
        print(f"kept {kept}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
