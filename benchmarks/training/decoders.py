"""Qwen3-4B, -8B and -14B with LoRA on the TPUs Kaggle and Colab users have, and Qwen3-4B on
Kaggle's T4 x2 in fp16: preflight's memory per chip, the largest batch that fits and the
estimated step and epoch, for the Agile Community Rules competition (docs/big-models.md's
decoder table, docs/gpu.md's GPU row). Estimates, not measurements: on the GPU target the
memory is XLA:CPU's for the same sharded program and the step its FLOP floor (a lower bound),
`jaxtpu.preflight.targets`.

`python -m benchmarks.training.decoders --out runs/decoders.json` (one process per target keeps the
TPU compiler's memory down: `--targets v5e-8`, then `--targets v6e-8 --resume`, ...;
`--table-of runs/decoders.json` prints the table of what is saved). The step estimate
compiles the unrolled program (every layer, where the search compiles them scanned):
`--no-speed` saves memory and batch only, and `--estimate` adds the estimate to saved rows,
searching first the rows it is asked for that --out does not have yet, so that one command
(`--estimate --targets v5e-8 --out F --report R`) makes a target's rows from nothing. Each row
of --out names the commit that computed it; an interrupted `--report` run is finished by the
same command with `--resume`, at the same commit (the rows it finished are kept, not searched
again; a row of another commit is refused, so a report's caption is every row's code).

Each row is `jaxtpu.preflight.fit.find_batch` of the model at one length on one target:
`--head hf` (transformers' Qwen3ForSequenceClassification head), LoRA rank 16, alpha 32 on
every projection of every layer (the base frozen and held in bf16, no optimizer state for
it), bf16, jit with jaxtpu's TPU defaults (FSDP over every chip), `--scan-layers` and
`--remat layer` (without remat, 36 layers of a 4B model's activations at 8 x 256 tokens
already exceed a v5e chip: the compiler refuses it). The config.json files are written here
from the published shapes (Qwen/Qwen3-4B, -8B, -14B, with the pad token their tokenizer pads
with); no weight is created. The batch is the largest per-chip batch whose train and eval
steps the TPU compiler fits (to within 1/8); the step is preflight's estimate for that batch
(jaxtpu's roofline of the program compiled for the target, a range, `docs/tpu.md`); the epoch
is the competition's train.csv, `RULES_TRAIN` rows, every step at the row's length.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.shared import measured
from benchmarks.shared.measured import keep as keep_report
from benchmarks.shared.measured import start as start_report

# Rows of the Agile Community Rules competition's train.csv (Kaggle's data page). With its
# test file's labelled examples added (`--rule-examples`) a run trains on several times more.
RULES_TRAIN = 2_029

_QWEN3 = {
    "model_type": "qwen3",
    "vocab_size": 151936,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "attention_bias": False,
    "hidden_act": "silu",
    "pad_token_id": 151643,  # <|endoftext|>, what Qwen's tokenizer pads with
}
CONFIGS = {
    "Qwen3-4B": {
        **_QWEN3,
        "hidden_size": 2560,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "intermediate_size": 9728,
        "tie_word_embeddings": True,
    },
    "Qwen3-8B": {
        **_QWEN3,
        "hidden_size": 4096,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "intermediate_size": 12288,
        "tie_word_embeddings": False,
    },
    "Qwen3-14B": {
        **_QWEN3,
        "hidden_size": 5120,
        "num_hidden_layers": 40,
        "num_attention_heads": 40,
        "intermediate_size": 17408,
        "tie_word_embeddings": False,
    },
}
# (model, target): the v5e-1 rows are the 4B's only (a single 16 GiB chip), and so is the
# GPU row: Kaggle's T4 x2 in fp16, the 2025 competition's setup (a T4 has no bfloat16)
ROWS = [
    *(
        (model, target)
        for target in ("v5e-8", "v6e-8", "v5e-1")
        for model in CONFIGS
        if target != "v5e-1" or model == "Qwen3-4B"
    ),
    ("Qwen3-4B", "t4x2"),
]
GPU_PRECISION = "fp16"
LORA = {"lora_rank": 16, "lora_alpha": 32.0}
HEADER = (
    "| model | target | max len | largest batch/chip | params/chip | optimizer/chip "
    "| train step peak | chip | est. step s* | est. comments/s* | est. rules epoch min* "
    "| compile s |"
)


def config_dir(root: Path, name: str, layers: int = 0) -> Path:
    """A directory holding only `CONFIGS[name]` as config.json (with `layers` layers instead
    of its own, when given): preflight reads no weight."""
    path = root / (f"{name}-{layers}-layers" if layers else name)
    path.mkdir(parents=True, exist_ok=True)
    config = {**CONFIGS[name], **({"num_hidden_layers": layers} if layers else {})}
    (path / "config.json").write_text(json.dumps(config))
    return path


def table(reports: list[dict[str, Any]]) -> str:
    """The Markdown table of saved rows (in `ROWS` order, then length), with its notes: what
    `--table-of` prints and the docs show of a kept report (`benchmarks.shared.measured`)."""
    saved = sorted(reports, key=lambda r: (ROWS.index((r["model"], r["target"])), r["max_len"]))
    lines = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|", *map(row, saved)]
    lines += ["", "\\* Estimates (preflight's roofline of the program compiled for the target; "
              "on a GPU target its FLOP floor, a lower bound), not measurements."]  # fmt: skip
    if any(FIT_NOTE in r["est_method"] for r in saved):
        lines += ["", f"\u2020 {FIT_NOTE}, from the model cut to {FIT_LAYERS[0]} and "
                  f"{FIT_LAYERS[1]} layers (--estimate without --whole)."]  # fmt: skip
    return "\n".join(lines)


def row(saved: dict[str, Any]) -> str:
    from jaxtpu.preflight.report import Report, gib, span

    r = Report(**{k: v for k, v in saved.items() if k != "model"})
    largest = r.extra.get("largest_batch", 0)
    if not largest:
        cells = [
            "none (refused at 1)" if r.error else "none",
            gib(r.params),
            gib(r.optimizer),
            "-",
            gib(r.capacity),
            "-",
            "-",
            "-",
        ]
    else:
        chips = math.prod(int(axis.split("=")[1]) for axis in r.mesh.split(","))
        steps = math.ceil(RULES_TRAIN / (largest * chips))
        cells = [
            str(largest),
            gib(r.params),
            gib(r.optimizer),
            gib(r.total),
            gib(r.capacity),
            span(r.est_step_s, r.est_step_high_s, lambda x: f"{x:.3f}")
            + ("†" if FIT_NOTE in r.est_method else ""),  # drawn from 2 and 4 layers
            span(
                largest * chips / (r.est_step_high_s or r.est_step_s) if r.est_step_s else 0,
                largest * chips / r.est_step_s if r.est_step_s else 0,
                lambda x: f"{x:.0f}",
            ),
            span(steps * r.est_step_s, steps * r.est_step_high_s, lambda x: f"{x / 60:.1f}"),
        ]
    return (
        f"| {saved['model']} | {r.target} | {r.max_len} | "
        + " | ".join([*cells, f"{r.compile_s:.0f}"])
        + " |"
    )


def run_config(
    root: Path, model: str, length: int, batch: int, target: str, layers: int = 0
) -> Any:
    """The training flags of one row (see the module docstring): bf16 on a TPU, fp16 on a GPU
    target; of the model cut to `layers` layers, when given."""
    from jaxtpu.core.flags import presets
    from jaxtpu.preflight.targets import GPU_TARGETS, device_count

    return presets.PRESETS["bert-base"]().replace(
        precision=GPU_PRECISION if target in GPU_TARGETS else "bf16",
        model_dir=str(config_dir(root, model, layers)),
        head="hf",
        train_csv="",
        max_len=length,
        batch_size=batch,
        parallel="jit",
        num_devices=device_count(target),
        scan_layers=True,
        remat="layer",
        **LORA,
    )


# `--estimate` without `--whole`: the programs of the model cut to these layer counts.
FIT_LAYERS = (2, 4)
FIT_NOTE = "affine in the layer count"
_FITTED = ("est_step_s", "est_step_high_s", "roofline_step_s", "est_bytes_per_step")


def _layer_fit(a: Any, b: Any, config: dict[str, Any]) -> Any:
    """The estimate of the whole model from those of the model cut to `FIT_LAYERS` layers
    (`a`, `b`): every layer is the same program, so each estimated time and byte count is
    affine in the layer count (the embedding, head and optimizer's share, plus one layer's
    times the count), and the two cut programs fix the line. The model FLOPs are the whole
    model's (`Encoder.train_flops` needs no compile)."""
    (la, lb), layers = FIT_LAYERS, config["num_hidden_layers"]
    t = (layers - la) / (lb - la)
    out = copy.deepcopy(b)
    for name in _FITTED:
        setattr(out, name, getattr(a, name) + (getattr(b, name) - getattr(a, name)) * t)
    out.model_flops = a.model_flops + (b.model_flops - a.model_flops) * t
    out.remat_flops = a.remat_flops + (b.remat_flops - a.remat_flops) * t
    out.est_method = f"{b.est_method}, {FIT_NOTE} ({la} and {lb} layers compiled)"
    out.extra["layer_fit"] = {
        str(k): [r.est_step_s, r.est_step_high_s] for k, r in zip(FIT_LAYERS, (a, b), strict=True)
    }
    return out


def _estimated(root: Path, saved: dict[str, Any], devices: list[Any], layers: int = 0) -> Any:
    """Preflight's step estimate of a saved row at its largest batch (of the model cut to
    `layers` layers, when given), as a `Report`."""
    from jaxtpu.core.flags.runspec import RunSpec
    from jaxtpu.preflight import speed as pf_speed
    from jaxtpu.preflight.report import Report
    from jaxtpu.preflight.targets import platform_of

    n, largest = len(devices), saved["extra"]["largest_batch"]
    cfg = run_config(root, saved["model"], saved["max_len"], largest, saved["target"], layers)
    spec = RunSpec.resolve(cfg, n, platform_of(devices, saved["target"]))
    r = Report(**{k: v for k, v in saved.items() if k != "model"})
    pf_speed.add_estimate(r, cfg, saved["target"], devices, spec)
    return r


def _estimate_saved(
    out: str | None,
    reports: list[dict[str, Any]],
    root: Path,
    targets: list[str],
    models: list[str],
    lengths: list[int],
    whole: bool,
) -> None:
    """`--estimate`: the step estimate of saved rows at their largest batch: of the whole
    program (`whole`), or affine in the layer count from two programs of a few layers
    (`_layer_fit`). A saved estimate of the whole program is kept; `whole` replaces a fit."""
    from jaxtpu.preflight import targets as pf_targets

    for saved in reports:
        largest = saved["extra"].get("largest_batch", 0)
        wanted = saved["target"] in targets and saved["model"] in models
        # a whole program's estimate is kept; a fit is replaced by one (--whole)
        done = saved["est_step_s"] and (FIT_NOTE not in saved["est_method"] or not whole)
        if not wanted or saved["max_len"] not in lengths or done or not largest:
            continue
        t0 = time.time()
        devices, _ = pf_targets.target_devices(
            saved["target"], pf_targets.device_count(saved["target"])
        )
        if whole:
            r = _estimated(root, saved, devices)
            r.extra.pop("layer_fit", None)
        else:
            cut = (_estimated(root, saved, devices, k) for k in FIT_LAYERS)
            r = _layer_fit(*cut, CONFIGS[saved["model"]])
        saved.update(asdict(r))
        Path(out).write_text(json.dumps(reports, indent=2))
        print(row(saved), f"({time.time() - t0:.0f} s)", flush=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training.decoders",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--targets",
        default="v5e-8,v6e-8,v5e-1",
        help="comma-separated, of v5e-8, v6e-8, v5e-1 and t4x2 (Kaggle's T4 x2, fp16, "
        "estimated without a GPU: see jaxtpu preflight) [the three TPUs]",
    )
    p.add_argument("--models", default=",".join(CONFIGS), help="comma-separated [all three]")
    p.add_argument("--lengths", default="256,512", help="comma-separated [256,512]")
    p.add_argument("--batch-size", type=int, default=8, help="where the search starts [8]")
    p.add_argument("--out", default=None, help="JSON file of the reports, kept after every row")
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep --out's rows and skip them; with --report, finish an interrupted run of the "
        "same command (only rows computed at this commit are kept: each row names its commit)",
    )
    p.add_argument("--table-of", metavar="JSON", help="print the table of an --out file")
    p.add_argument(
        "--report",
        metavar="FILE",
        help="also keep this run's rows (those of --targets, --models and --lengths, all "
        "computed by this run: refused when --out already has one of them) as an estimated "
        "report for the docs (benchmarks.shared.measured), e.g. docs/measured/decoders-t4x2.json",
    )
    p.add_argument(
        "--estimate",
        action="store_true",
        help="for the rows of --out (within --targets, --models, --lengths) saved without a step "
        "estimate (by --no-speed): estimate it at the row's largest batch and save the row; "
        "such rows --out does not have yet are searched first (as --no-speed does)",
    )
    p.add_argument(
        "--whole",
        action="store_true",
        help="--estimate compiles the whole unrolled program (every layer, not "
        f"scanned) instead of the model cut to {FIT_LAYERS[0]} and {FIT_LAYERS[1]} layers, "
        "from which the estimate is drawn affine in the layer count (each layer is the same "
        "program)",
    )
    p.add_argument(
        "--no-speed",
        action="store_true",
        help="memory and the largest batch only: no step estimate, whose compilation of the "
        "unrolled program (every layer, not one scanned) takes most of a row's time",
    )
    return p


def _search(
    args: argparse.Namespace,
    reports: list[dict[str, Any]],
    root: Path,
    targets: list[str],
    models: list[str],
    lengths: list[int],
    speed: bool,
    code: str,
) -> None:
    """The largest batch (and, with `speed`, the step estimate) of every wanted row not in
    `reports` yet, each appended (and --out written) as it finishes, named as computed by the
    commit `code`."""
    from jaxtpu.preflight import fit as pf_fit
    from jaxtpu.preflight import targets as pf_targets

    done = {(r["model"], r["target"], r["max_len"]) for r in reports}
    for model, target in ROWS:
        if target not in targets or model not in models:
            continue
        devices, capacity = pf_targets.target_devices(target, pf_targets.device_count(target))
        for length in lengths:
            if (model, target, length) in done:
                continue
            t0 = time.time()
            cfg = run_config(root, model, length, args.batch_size, target)

            def say(tried: Any, where: str = f"{model} {target} {length}") -> None:
                verdict = "fits" if tried.fits else "does not fit"
                print(f"  {where}: batch {tried.batch_size} {verdict} ({tried.compile_s:.0f} s)",
                      file=sys.stderr, flush=True)  # fmt: skip

            r = pf_fit.find_batch(cfg, target, devices, capacity, say, speed=speed)
            r.extra["commit"] = code
            reports.append({"model": model, **asdict(r)})
            if args.out:
                Path(args.out).write_text(json.dumps(reports, indent=2))
            print(row(reports[-1]), f"({time.time() - t0:.0f} s)", flush=True)


def _refuse_other_code(
    p: argparse.ArgumentParser, args: argparse.Namespace, rows: list[dict[str, Any]], code: str
) -> None:
    """--report keeps rows of this run's code only: without --resume none of --out's `rows`
    (those it would report), with --resume those an interrupted run at this same commit
    finished. Else one line (exit 2) before any work."""
    if rows and not args.resume:
        p.error(f"--report keeps only rows this run computes, and --out {args.out} already has "
                f"{len(rows)} of them: give a new --out, or --resume to finish an interrupted "
                "run of this command at its commit")  # fmt: skip
    why = measured.other_code([r["extra"].get("commit") for r in rows], code)
    if why:
        p.error(f"--resume --report: --out {args.out}: {why}")


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.table_of:
        print(table(json.loads(Path(args.table_of).read_text())))
        return 0
    if args.estimate and not args.out:
        p.error("--estimate reads and updates the rows of --out: give --out FILE")
    reports: list[dict[str, Any]] = []
    if (args.resume or args.estimate) and args.out and Path(args.out).exists():
        reports = json.loads(Path(args.out).read_text())
    targets, models = args.targets.split(","), args.models.split(",")
    lengths = list(map(int, args.lengths.split(",")))

    def selected(r: dict[str, Any]) -> bool:
        return r["target"] in targets and r["model"] in models and r["max_len"] in lengths

    # the code and machine that estimate

    started = start_report(args.report, "benchmarks.training.decoders")
    code = started["commit"] if started else measured.commit()
    if args.report:
        _refuse_other_code(p, args, [r for r in reports if selected(r)], code)

    from jaxtpu.engine import hosts

    hosts.set_cpu_device_count(8)
    # the models' config directories, removed when the search ends however it ends
    with tempfile.TemporaryDirectory(prefix="jaxtpu-decoders-") as tmp:
        root = Path(tmp)
        # --estimate searches its rows --out lacks (memory only), then estimates them
        speed = not (args.no_speed or args.estimate)
        _search(args, reports, root, targets, models, lengths, speed, code)
        if args.estimate:
            _estimate_saved(args.out, reports, root, targets, models, lengths, args.whole)
    if args.report:
        kept = keep_report(args.report, "decoders", [r for r in reports if selected(r)],
                           "benchmarks.training.decoders", argv, started)  # fmt: skip
        print(f"kept {kept} (benchmarks.shared.measured)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
