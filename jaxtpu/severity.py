"""`jaxtpu severity-weights`: search the label weights that turn a multi-label run's six
probabilities into a severity score, on a pairs file (`less_toxic`, `more_toxic`), to maximise
agreement (the Rate Severity winners' recipe; the rule is `jaxtpu.core.severity`).

`jaxtpu evaluate --label-weights W` reports the agreement of given weights on a pairs file,
and `jaxtpu predict --label-weights W` scores a Rate Severity file (`comment_id`, `text`) with
them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from jaxtpu.core import storage
from jaxtpu.core.flags.commands import check_command_flags, command_parser
from jaxtpu.core.run.exits import user_errors
from jaxtpu.core.severity import (
    check_grid,
    format_weights,
    search_weights,
)
from jaxtpu.core.tasks import LABELS
from jaxtpu.engine.scoring import load_multilabel, pair_probabilities


def main(argv: Sequence[str] | None = None) -> int:
    p = command_parser(
        "severity-weights",
        "Search the weights of a multi-label run's six label probabilities whose sum ranks a "
        "pairs file's comments best (agreement; coordinate ascent on a grid from the built-in "
        "severity weights, see jaxtpu/core/severity.py), and print the --label-weights to score "
        "with.",
    )
    args = p.parse_args(argv)
    with user_errors():
        check_grid(args.step, args.top)  # before any work
        if args.out:  # replaced when it exists, as before
            storage.check_output_file(args.out, "--out", overwrite=True)
        check_command_flags("severity-weights", args)
        from jaxtpu.engine import hosts

        hosts.use_compilation_cache()
        devices = hosts.scoring_devices(args.num_devices)
        models = load_multilabel(args.workdir)
        local = storage.local_input(args.input, "--input")  # a copy, for one in a bucket
        with storage.named(local, args.input):
            less, more = pair_probabilities(models, local, devices, args.batch_size)
        found = search_weights(less, more, args.step, args.top)
        report = {
            "label_weights": format_weights(found.weights),
            "labels": list(LABELS),
            "agreement": found.agreement,
            "start_agreement": found.start_agreement,
            "pairs": len(less),
            "passes": found.passes,
            "input": str(args.input),
        }
        print(
            f"agreement {found.start_agreement:.4f} with the built-in weights -> "
            f"{found.agreement:.4f} on {len(less)} pairs ({found.passes} passes); "
            f"searched on these pairs: check on others before trusting the gain"
        )
        print(f"--label-weights {report['label_weights']}  ({', '.join(LABELS)})")
        if args.out:
            storage.write_output_text(args.out, json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
