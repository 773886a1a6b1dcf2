"""Preflight's memory check and speed estimate for each TPU target, model and length of
docs/tpu.md's table: estimates, not measurements.

`python -m benchmarks.training.estimates --out runs/estimates.json`

Each row is `pf_fit.check` of the model at one length on one target, with jaxtpu's defaults
for a TPU (`--sharding auto`: FSDP under jit; `--matmul-output auto`: bf16), bf16, jit:
MiniLM (the packaged all-MiniLM-L6-v2), BERT-base (12 x 768) and DeBERTa-v3-base (12 x 768,
relative attention, vocabulary 128,100; its config.json written here, random init) at 32
comments per device, the XLM-RoBERTa-large shape (24 x 1024, vocabulary 250,002) at 8 per
device (the Jigsaw Multilingual notebooks' batch). The step time is preflight's estimate with
its method (`speed.add_estimate`): the compiler's cost model on v2/v3, jaxtpu's roofline of the
compiled program elsewhere; both methods' times are in every TPU row, so the v3 rows validate
the roofline against the compiler. The epoch is Jigsaw Toxic Comment's train.csv (159,571
comments) at the row's global batch, every step at the row's length (an upper bound with
length buckets), and on v5e-8 whether the run's epochs fit a Kaggle session.

The ModernBERT rows (`--models` of ModernBERT-base, ModernBERT-large, mmBERT-base; `--lengths
512,1024`, 8 comments per device; config.json files written here from the published shapes)
are docs/big-models.md's table. `--configs DIR` writes those config.json files (and
DeBERTa-v3-large's) for a `--model-dir` of preflight or `benchmarks.training.tpu_tuning`.

Rows print as they finish (a Markdown table at the end); `--out` keeps the reports as JSON
after every row, `--resume` skips the rows a previous `--out` already has, and `--table-of
FILE` prints the table of such a file (one process per target keeps memory down: the TPU
compiler's memory grows with each large program compiled in a process). `--report FILE` keeps
the rows as a kept report (`benchmarks.shared.measured`, kind `estimates`, captioned as an estimate)
that a page renders with `report_table`; it is refused with `--resume`, whose earlier rows were not
computed by this code.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.shared.measured import keep as keep_report
from benchmarks.shared.measured import start as start_report

JIGSAW_TOXIC_TRAIN = 159_571  # rows of the Toxic Comment Classification Challenge's train.csv

# DeBERTa-v3-base's config.json (microsoft/deberta-v3-base), the fields jaxtpu reads
DEBERTA_V3_BASE = {
    "model_type": "deberta-v2",
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 512,
    "type_vocab_size": 0,
    "initializer_range": 0.02,
    "layer_norm_eps": 1e-7,
    "relative_attention": True,
    "max_relative_positions": -1,
    "position_buckets": 256,
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "pos_att_type": ["p2c", "c2p"],
    "position_biased_input": False,
    "pad_token_id": 0,
    "vocab_size": 128100,
}

# ModernBERT-base and -large, and mmBERT-base (ModernBERT's layers, Gemma's 256k vocabulary),
# the fields jaxtpu reads (answerdotai/ModernBERT-base, -large, jhu-clsp/mmBERT-base), in the
# hub's older form: every third layer global, a 128-token window, rotary bases 160k / 10k.
MODERNBERT_BASE = {
    "model_type": "modernbert",
    "vocab_size": 50368,
    "hidden_size": 768,
    "num_hidden_layers": 22,
    "num_attention_heads": 12,
    "intermediate_size": 1152,
    "max_position_embeddings": 8192,
    "norm_eps": 1e-5,
    "pad_token_id": 50283,
    "global_attn_every_n_layers": 3,
    "local_attention": 128,
    "global_rope_theta": 160000.0,
    "local_rope_theta": 10000.0,
    "classifier_pooling": "mean",
}
MODERNBERT_LARGE = {
    **MODERNBERT_BASE,
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "intermediate_size": 2624,
}
MMBERT_BASE = {**MODERNBERT_BASE, "vocab_size": 256000, "pad_token_id": 0}
# DeBERTa-v3-large's (microsoft/deberta-v3-large): the base's options, 24 x 1024
DEBERTA_V3_LARGE = {
    **DEBERTA_V3_BASE,
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "intermediate_size": 4096,
}
CONFIGS = {
    "deberta-v3-base": DEBERTA_V3_BASE,
    "deberta-v3-large": DEBERTA_V3_LARGE,
    "modernbert-base": MODERNBERT_BASE,
    "modernbert-large": MODERNBERT_LARGE,
    "mmbert-base": MMBERT_BASE,
}

XLMR_LARGE = {
    "num_layers": 24,
    "hidden_size": 1024,
    "num_heads": 16,
    "intermediate_size": 4096,
    "vocab_size": 250002,
}

MODELS: dict[str, tuple[str, dict[str, Any], int]] = {
    "MiniLM (6 x 384)": ("minilm", {}, 32),
    "BERT-base (12 x 768)": ("bert-base", {}, 32),
    "DeBERTa-v3-base (12 x 768)": ("bert-base", {"model_dir": "deberta-v3-base"}, 32),
    "XLM-R-large (24 x 1024)": ("bert-base", XLMR_LARGE, 8),
    # at --lengths 512,1024: the lengths ModernBERT makes practical for long comments
    "ModernBERT-base (22 x 768)": ("bert-base", {"model_dir": "modernbert-base"}, 8),
    "ModernBERT-large (28 x 1024)": ("bert-base", {"model_dir": "modernbert-large"}, 8),
    "mmBERT-base (22 x 768; 256k vocab)": ("bert-base", {"model_dir": "mmbert-base"}, 8),
}
MODERN = [name for name, (_, shape, _) in MODELS.items() if "bert-" in shape.get("model_dir", "")]

TARGETS = "v3-8,v5e-1,v5e-4,v5e-8,v5e-16,v6e-1,v6e-8,v5p-8,v4-8,v4-32"


def config_dir(root: Path, name: str) -> Path:
    """A checkpoint directory holding only the config.json of `CONFIGS[name]`: preflight
    creates no weight and reads no data here."""
    path = root / name
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(CONFIGS[name]))
    return path


def row_cells(r: Any, col: dict[str, Any]) -> list[str]:
    """The Markdown cells of one report (preflight's own formulas where it has them)."""
    from jaxtpu.preflight.report import span

    steps = math.ceil(JIGSAW_TOXIC_TRAIN / r.global_batch) if r.global_batch else 0
    ratio = (
        f"{r.roofline_step_s / r.compiler_step_s:.2f}"
        if r.roofline_step_s and r.compiler_step_s > 0
        else "-"
    )
    epoch = span(steps * r.est_step_s, steps * r.est_step_high_s, lambda x: f"{x / 60:.1f}")
    return [
        col["train step"](r),
        col["fits"](r),
        col["est. step s*"](r),
        r.est_method or "-",
        f"{r.compiler_step_s:.4f}" if r.compiler_step_s > 0 else f"({r.compiler_step_s:.3g})",
        ratio,
        col["est. examples/s*"](r),
        col["MFU bound*"](r),
        epoch,
    ]


def table_of(reports: list[dict[str, Any]], targets: list[str]) -> str:
    """The Markdown table of saved reports, ordered by target (as listed), model (as in
    `MODELS`), then length."""
    from jaxtpu.preflight import report as pf_report

    col = dict(pf_report.COLUMNS)
    names = list(MODELS)
    order = sorted(
        (r for r in reports if r["target"] in targets),
        key=lambda r: (targets.index(r["target"]), names.index(r["model"]), r["max_len"]),
    )
    lines = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    for saved in order:
        fields = {k: v for k, v in saved.items() if k != "model"}
        r = pf_report.Report(**fields)
        lines.append(
            f"| {saved['model']} | {r.target} | {r.max_len} | {r.batch_size} | {r.sharding} | "
            + " | ".join(row_cells(r, col))
            + " |"
        )
    return "\n".join(lines)


def report_table(reports: list[dict[str, Any]]) -> str:
    """A kept report's table (kind `estimates`): its rows in `TARGETS`' order, then model and
    length, and a note that every figure is an estimate."""
    targets = [t for t in TARGETS.split(",") if any(r["target"] == t for r in reports)]
    return (
        table_of(reports, targets)
        + "\n\nEvery figure is preflight's estimate for a TPU that was not there (the compiler's "
        "cost model on v2/v3, jaxtpu's roofline of the compiled program elsewhere): not a "
        "measurement."
    )


HEADER = (
    "| model | target | max len | batch/dev | sharding | train step | fits | est. step s | by "
    "| compiler s | roofline / compiler | est. examples/s | MFU bound | est. Jigsaw epoch min |"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.training.estimates",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--targets", default=TARGETS, help=f"comma-separated [{TARGETS}]")
    p.add_argument("--lengths", default="128,256", help="comma-separated [128,256]")
    p.add_argument(
        "--models",
        default=",".join(m for m in MODELS if m not in MODERN),
        help="comma-separated names [the four of the 128/256 table; the ModernBERT rows: "
        + ",".join(MODERN)
        + "]",
    )
    p.add_argument("--out", default=None, help="JSON file of the reports")
    p.add_argument("--resume", action="store_true", help="keep --out's rows and skip them [off]")
    p.add_argument(
        "--table-of",
        metavar="JSON",
        help="print the Markdown table of an earlier --out file (rows in --targets order, "
        "then --models, then length) and compute nothing",
    )
    p.add_argument(
        "--report",
        metavar="FILE",
        help="also keep the rows as a report (benchmarks.shared.measured, kind estimates) for "
        "the docs",
    )
    p.add_argument(
        "--configs",
        metavar="DIR",
        help="write each published shape's config.json as DIR/NAME/ (a --model-dir for "
        f"preflight or tpu_tuning; {', '.join(CONFIGS)}) and compute nothing",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.report and args.resume:
        p.error("--report: not with --resume (the rows kept before were not computed by this run)")
    if args.table_of:
        print(table_of(json.loads(Path(args.table_of).read_text()), args.targets.split(",")))
        return 0
    if args.configs:
        try:
            Path(args.configs).mkdir(parents=True, exist_ok=True)
            for name in CONFIGS:
                print(config_dir(Path(args.configs), name))
        except OSError as e:
            p.error(f"--configs {args.configs}: cannot write there ({e.strerror or e})")
        return 0

    from jaxtpu.core.flags import presets
    from jaxtpu.engine import hosts
    from jaxtpu.preflight import fit as pf_fit
    from jaxtpu.preflight import report as pf_report
    from jaxtpu.preflight import speed as pf_speed
    from jaxtpu.preflight import targets as pf_targets

    started = start_report(args.report, "benchmarks.training.estimates")  # the code and the machine
    hosts.set_cpu_device_count(8)
    col = dict(pf_report.COLUMNS)
    reports: list[dict[str, Any]] = []
    if args.resume and args.out and Path(args.out).exists():
        reports = json.loads(Path(args.out).read_text())
    done = {(r["model"], r["target"], r["max_len"]) for r in reports}
    rows = []
    root = Path(tempfile.mkdtemp(prefix="jaxtpu-estimates-"))
    for target in args.targets.split(","):
        n = pf_targets.TPU_TARGETS[target].devices
        devices, capacity = pf_targets.target_devices(target, n)
        for name in args.models.split(","):
            preset, shape, batch = MODELS[name]
            if shape.get("model_dir") in CONFIGS:
                shape = {"model_dir": str(config_dir(root, shape["model_dir"]))}
            for length in map(int, args.lengths.split(",")):
                if (name, target, length) in done:
                    continue
                cfg = presets.PRESETS[preset]().replace(
                    max_len=length, batch_size=batch, parallel="jit", num_devices=n, **shape
                )
                r = pf_fit.check(cfg, target, devices, capacity)
                if r.est_step_s and target == pf_speed.KAGGLE_TARGET:
                    steps = math.ceil(JIGSAW_TOXIC_TRAIN / r.global_batch) * cfg.train.epochs
                    r.extra["kaggle"] = pf_speed.kaggle_verdict(
                        steps * r.est_step_s, steps * r.est_step_high_s
                    )
                reports.append({"model": name, **asdict(r)})
                row = f"| {name} | {target} | {length} | {batch} | {r.sharding} | " + " | ".join(
                    row_cells(r, col)
                )
                rows.append(row + " |")
                print(rows[-1], flush=True)
                if args.out:
                    Path(args.out).write_text(json.dumps(reports, indent=2))
    print("\n" + HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    print("\n".join(rows))
    if args.report:
        kept = keep_report(
            args.report, "estimates", reports, "benchmarks.training.estimates", argv, started
        )
        print(f"kept {kept}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
