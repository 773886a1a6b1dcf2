"""`jaxtpu history ACTION` (`python -m jaxtpu.history`): a platform's Perspective history in,
and jaxtpu's scores on Perspective's scale out.

- `import` reads what a platform holds (Coral Talk's MongoDB exports, or any table of comments
  with Perspective's scores) and writes a history file (`jaxtpu.core.data.history.rows`), which
  `jaxtpu train --perspective` learns from; `--feedback` adds its moderators' decisions to the
  community loop's store.
- `fit-scale` maps a run's scores onto Perspective's scale, per attribute, on history comments
  the run did not train on (`jaxtpu.core.data.history.scale`), kept in its calibration.json: serve,
  predict, `jaxtpu.load()` and every export answer on that scale from then on.
- `compare` scores a history file and prints, per attribute, Perspective's logged scores
  against the run's: what a platform's thresholds would do after switching.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from jaxtpu.core import calibration, files, storage
from jaxtpu.core.data.history import scale
from jaxtpu.core.data.history.coral import read_coral
from jaxtpu.core.data.history.decisions import keep_decisions, open_store
from jaxtpu.core.data.history.rows import history_csv, read_histories, read_history
from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.commands import check_command_flags, command_parser, run_action
from jaxtpu.core.run.exits import user_errors
from jaxtpu.history.runs import compare_run, fit_scales


def import_(argv: Sequence[str]) -> int:
    parser = command_parser(
        "history import",
        "Read a platform's history of Perspective's scores and moderators' decisions (Coral "
        "Talk's MongoDB exports, or a CSV, JSON Lines or Parquet table) and write it as a "
        "history file, which jaxtpu train --perspective, history fit-scale and history compare "
        "read.",
        epilog="Example: jaxtpu history import --comments comments.json --actions "
        "commentModerationActions.json --out history.csv",
    )
    args = parser.parse_args(argv)
    with user_errors():
        check_command_flags("history import", args)
        out = Path(args.out)
        if out.exists() and not args.overwrite:
            raise UserError(f"--out {out}: exists; pass --overwrite to replace it")
        if args.actions and not args.comments:
            raise UserError("--actions goes with --comments (Coral's two collections)")
        if args.comments:
            history = read_coral(args.comments, args.actions)
        else:
            history = read_history(args.table)
        store = open_store(args.feedback) if args.feedback else None  # said before writing
        files.write_text(out, history_csv(history.rows, history.attributes))
        print(history.summary())
        print(f"wrote {len(history.rows):,} rows to {out}")
        if store is not None:
            kept = keep_decisions(store, history)
            print(f"kept {kept:,} decision(s) in --feedback {args.feedback}")
    return 0


def fit_scale(argv: Sequence[str]) -> int:
    parser = command_parser(
        "history fit-scale",
        "Map a run's scores onto Perspective's scale, per attribute the history holds: a "
        "monotone map of the run's calibrated probability onto Perspective's logged score "
        "(--method; every ranking and AUC unchanged), fitted on history comments the run did "
        "not train on, and kept in the run's calibration.json: serve, predict, "
        "jaxtpu.load() and exports made after it answer on Perspective's scale "
        "(--no-calibration: the raw probability). --readout first reads each attribute out "
        "of the model's vector anew, to rank as Perspective does; --ngrams out of the "
        "comment's words too.",
        epilog="Example: jaxtpu history fit-scale --workdir runs/a --history history.csv",
    )
    args = parser.parse_args(argv)
    with user_errors():
        check_command_flags("history fit-scale", args)
        history = read_histories(args.history.split(","))
        cal, lines = fit_scales(
            args.workdir, history, args.method, args.num_devices, args.batch_size, args.readout,
            args.ngrams,
        )  # fmt: skip
        print("\n".join(lines))
        calibration.write(args.workdir, cal)
        print(f"kept in {Path(args.workdir) / calibration.FILE}; the run's version changes with it")
    return 0


def compare(argv: Sequence[str]) -> int:
    parser = command_parser(
        "history compare",
        "Score a history's comments with a run and print, per attribute, Perspective's logged "
        "scores against the run's: rank correlation, mean difference, and at 0.5, 0.7, 0.8 and "
        "0.9 (strictly above, as Coral compares) how many comments each flags, both, and the "
        "F1 of the run's flags against Perspective's.",
        epilog="Example: jaxtpu history compare --workdir runs/a --history history.csv",
    )
    args = parser.parse_args(argv)
    with user_errors():
        check_command_flags("history compare", args)
        if args.report:
            storage.check_output_path(Path(args.report), "--report")
        history = read_histories(args.history.split(","))
        report, way = compare_run(
            args.workdir, history, args.raw, args.num_devices, args.batch_size
        )
        print(f"{history.source} ({len(history.rows):,} comments), {args.workdir} ({way}):\n")
        print(scale.table(report))
        if args.report:
            files.write_text(args.report, json.dumps(report, indent=1) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_action(
        "history",
        {
            "import": (
                "read a platform's history (Coral's exports, or a table) into a history file",
                import_,
            ),
            "fit-scale": ("map a run's scores onto Perspective's scale from a history", fit_scale),
            "compare": (
                "a run's scores against Perspective's on a history, per attribute",
                compare,
            ),
        },
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
