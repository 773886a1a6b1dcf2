"""The TPU compiler's estimated step time (preflight's speed estimate) for each TPU generation,
model and length of the README's table: an estimate, not a measurement.

`python -m benchmarks.estimates --out runs/estimates.json`

Each row is `pf_fit.check` of the model at one length on one target, with jaxtpu's defaults
for a TPU (`--sharding auto`: FSDP under jit; `--matmul-output auto`: bf16), bf16, jit:
MiniLM (the packaged all-MiniLM-L6-v2) and BERT-base (12 x 768) at 32 comments per core,
the XLM-RoBERTa-large shape (24 x 1024, vocabulary 250,002) at 8 per core (the Jigsaw
Multilingual notebooks' batch). Rows print as they finish (a Markdown table at the end);
`--out` keeps the reports as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

MODELS = {
    "MiniLM (6 x 384)": ("minilm", {}, 32),
    "BERT-base (12 x 768)": ("bert-base", {}, 32),
    "XLM-R-large (24 x 1024)": (
        "bert-base",
        {
            "num_layers": 24,
            "hidden_size": 1024,
            "num_heads": 16,
            "intermediate_size": 4096,
            "vocab_size": 250002,
        },
        8,
    ),
}


# preflight's table columns each row shows, in order
ESTIMATE_COLUMNS = ("est. step s*", "est. examples/s*", "est. tokens/s*", "MFU bound*", "fits")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.estimates",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--targets", default="v2-8,v3-8,v4-8,v5e-8,v6e-8")
    p.add_argument("--lengths", default="128,224")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated names")
    p.add_argument("--out", default=None, help="JSON file of the reports")
    args = p.parse_args(argv)

    from jaxtpu import hosts
    from jaxtpu.core.flags import presets
    from jaxtpu.preflight import fit as pf_fit
    from jaxtpu.preflight import report as pf_report
    from jaxtpu.preflight import targets as pf_targets

    hosts.set_cpu_device_count(8)
    col = dict(pf_report.COLUMNS)
    rows, reports = [], []
    for target in args.targets.split(","):
        devices, capacity = pf_targets.target_devices(target, 8)
        for name in args.models.split(","):
            preset, shape, batch = MODELS[name]
            for length in map(int, args.lengths.split(",")):
                cfg = presets.PRESETS[preset]().replace(
                    max_len=length, batch_size=batch, parallel="jit", **shape
                )
                r = pf_fit.check(cfg, target, devices, capacity)
                reports.append({"model": name, **asdict(r)})
                cells = [col[c](r) for c in ESTIMATE_COLUMNS]  # preflight's own formulas
                if not r.est_step_s:
                    why = r.extra.get("no_estimate", r.error)[:40]
                    cells[0] = f"no usable estimate ({why})"
                row = (
                    f"| {name} | {target} | {length} | {batch} | {r.sharding} | "
                    + " | ".join(cells)
                    + " |"
                )
                rows.append(row)
                print(row, flush=True)
                if args.out:
                    Path(args.out).write_text(json.dumps(reports, indent=2))
    print(
        "\n| model | target | max len | batch/core | sharding | est. step s | est. examples/s "
        "| est. tokens/s | MFU bound | fits |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
