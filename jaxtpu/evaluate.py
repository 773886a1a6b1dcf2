"""`python -m jaxtpu.evaluate`: score a labelled file with the best model of a run and report
the metric of the file's kind, as its competition defines it (`jaxtpu.engine.evaluation`).

| file | metric |
|---|---|
| comments with `toxic` (or `target`) | `auc`: ROC AUC |
| the six Toxic Comment labels, for a multi-label run | `mean_column_auc` and each label's |
| identity columns (Unintended Bias) | `jigsaw_bias`, with every subgroup's three AUCs |
| a `lang` column (Multilingual validation) | `mean_language_auc`, with each language's |
| `less_toxic`, `more_toxic` pairs, for a ranking run | `agreement` |

The numbers are the ones training reports for its validation set (`jaxtpu.core.tasks`), from
the same code.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from jaxtpu.core import storage
from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.commands import check_command_flags, command_parser
from jaxtpu.core.flags.schema import SCORING
from jaxtpu.core.run.exits import user_errors
from jaxtpu.core.run.rundir import strict_json
from jaxtpu.core.severity import parse_label_weights
from jaxtpu.engine.evaluation import agreement_report, evaluate


def _print_calibration(report: dict[str, Any]) -> None:
    for column, r in report.get("calibration", {}).items():
        print(
            f"  calibration {column}: ECE {r['ece_before']:.4f} -> {r['ece_after']:.4f}, "
            f"Brier {r['brier_before']:.4f} -> {r['brier_after']:.4f}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    p = command_parser(
        "evaluate",
        "Score a labelled file with the best model of a jaxtpu run, or with a fine-tuned "
        "Hugging Face classifier, and print the metric of its kind: auc, mean_column_auc (six "
        "labels), jigsaw_bias (identity columns), mean_language_auc (a lang column) or "
        "agreement (pairs).",
    )
    args = p.parse_args(argv)
    with user_errors():
        if args.out:
            storage.check_output_file(args.out, "--out", args.overwrite)
        check_command_flags("evaluate", args)
        if args.max_len and not args.model_dir:
            raise UserError("--max-len goes with --model-dir; a run scores with its own")
        if args.model_dir and args.label_weights:
            raise UserError("--label-weights scores the runs' probabilities: give --workdir")
        # a bad value is refused before anything loads
        weights = parse_label_weights(args.label_weights) if args.label_weights else None
        from jaxtpu.engine import hosts

        hosts.use_compilation_cache()
        devices = hosts.scoring_devices(args.num_devices)  # before anything starts JAX
        local = storage.local_input(args.input, "--input")  # a copy, for one in a bucket
        with storage.named(local, args.input):
            if weights is not None:
                report = agreement_report([args.workdir], local, weights, devices, args.batch_size)
            else:
                report = evaluate(
                    args.workdir,
                    local,
                    devices,
                    args.batch_size,
                    args.model_dir,
                    args.max_len or SCORING.max_len,
                )
        report["input"] = args.input
        print(f"{report['metric']}: {report['value']:.6f} ({report['examples']} examples)")
        for key, value in report.items():
            if key not in (
                "metric",
                "value",
                "examples",
                "input",
                "workdir",
                "model_dir",
                "calibration",
                report["metric"],
            ):
                print(f"  {key}: {value:.6f}" if isinstance(value, float) else f"  {key}: {value}")
        _print_calibration(report)
        if args.out:
            storage.write_output_text(args.out, strict_json(report, indent=2) + "\n")
            print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
