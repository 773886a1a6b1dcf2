"""`jaxtpu feedback ACTION` (`python -m jaxtpu.feedback`): what `jaxtpu serve --feedback` kept
of comments:suggestscore. `delete --feedback URL --client-token T` (or `--session-id S`, or
`--text T`) removes suggestions (a user's erasure request); `export --feedback URL --out FILE`
writes them as training rows for a run's columns (`jaxtpu.core.serving.decisions`), which
`jaxtpu train` reads: by default only the moderators' (those of keys marked `moderator`, and
those of a server without keys, which cannot tell who sent them).
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Sequence
from pathlib import Path

from jaxtpu.core import files
from jaxtpu.core.errors import UserError
from jaxtpu.core.flags.commands import check_command_flags, command_parser, run_action
from jaxtpu.core.run.exits import user_errors
from jaxtpu.core.serving.attributes import Attribute, attribute_map
from jaxtpu.core.serving.decisions import parse_decisions, parse_since, training_rows
from jaxtpu.core.serving.feedback import Record, Store, StoreError
from jaxtpu.core.tasks import LABELS
from jaxtpu.engine.scoring import run_attributes


def delete(argv: Sequence[str]) -> int:
    parser = command_parser(
        "feedback delete",
        "Remove suggestions (comments:suggestscore) from the store jaxtpu serve --feedback "
        "keeps them in: a clientToken's, a sessionId's or a comment text's (a user's erasure "
        "request), of every key or of one (--owner).",
        epilog="Examples: jaxtpu feedback delete --feedback feedback.db --client-token "
        "comment:1234; jaxtpu feedback delete --feedback feedback.db --text 'the comment'",
    )
    args = parser.parse_args(argv)
    with user_errors():
        check_command_flags("feedback delete", args)
        which = {
            "client_token": args.client_token,
            "session_id": args.session_id,
            "text": args.text,
        }
        name, value = next((k, v) for k, v in which.items() if v is not None)
        flag = f"--{name.replace('_', '-')}"
        shown = value if name != "text" else f"{value[:40]!r}"
        try:
            n = Store(args.feedback, create=False).delete(**{name: value}, owner=args.owner)
        except StoreError as e:
            raise UserError(str(e)) from None
        of = f" of --owner {args.owner!r}" if args.owner is not None else ""
        if not n:
            raise UserError(
                f"{flag} {shown}: no suggestion{of} with it in --feedback {args.feedback}; "
                "nothing removed"
            )
        print(f"removed {n} suggestion(s){of} of {flag} {shown}")
    return 0


def export(argv: Sequence[str]) -> int:
    parser = command_parser(
        "feedback export",
        "Write the suggestions jaxtpu serve --feedback kept (the latest per clientToken) as a "
        "training file of a run's columns: a suggested score labels its attribute's column, a "
        "moderator's decision (Coral Talk's DELETED or APPROVED) the decision attribute's; a "
        "column not mentioned is blank, left out of the loss.",
        epilog="Example: jaxtpu feedback export --feedback feedback.db --community "
        "Coral:https://news.example/ --workdir runs/a --out community.csv",
    )
    args = parser.parse_args(argv)
    with user_errors():
        check_command_flags("feedback export", args)
        out = Path(args.out)
        if out.exists() and not args.overwrite:
            raise UserError(f"--out {out}: exists; pass --overwrite to replace it")
        attributes, columns = _run_map(args.workdir)
        decisions = parse_decisions(args.decisions)
        since = parse_since(args.since) if args.since else None
        try:
            store = Store(args.feedback, create=False)
            records = store.records(args.community, since)
            communities = store.communities() if not records else []
        except StoreError as e:
            raise UserError(str(e)) from None
        if not records:
            where = f" of --community {args.community}" if args.community else ""
            when = f" since {args.since}" if args.since else ""
            known = f"; it holds {', '.join(communities)}" if communities else ""
            raise UserError(f"--feedback {args.feedback}: no suggestion{where}{when}{known}")
        records = _sent_by(records, args.sent_by)
        rows = training_rows(records, attributes, columns, decisions, args.decision_attribute)
        for name, n in sorted(rows.skipped.items()):
            print(f"left out: {n} score(s) of {name}, neither an attribute of the run nor a "
                  "decision (--decisions)", file=sys.stderr)  # fmt: skip
        if not rows.rows:
            raise UserError(f"--feedback {args.feedback}: no suggestion labels a column of the run")
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(rows.header)
        writer.writerows(rows.rows)
        files.write_text(out, buffer.getvalue())
        print(f"wrote {len(rows.rows)} training rows of {len(records)} suggestion(s) to {out}")
    return 0


def _sent_by(records: list[Record], sent_by: str) -> list[Record]:
    """The suggestions `--sent-by` takes, saying on stderr what it left out and which it took
    without knowing who sent them.

    Raises:
      UserError: it leaves none.
    """
    if sent_by == "all":
        return records
    kept = [r for r in records if r.moderator or not r.owner]
    unowned = sum(1 for r in kept if not r.owner)
    others = sorted({r.owner for r in records if r.owner and not r.moderator})
    if unowned:
        print(f"taken: {unowned} suggestion(s) kept by a server without --api-keys, which "
              "cannot tell who sent them", file=sys.stderr)  # fmt: skip
    if len(kept) < len(records):
        left = len(records) - len(kept)
        print(f"left out: {left} suggestion(s) of keys not marked moderator "
              f"({', '.join(others)}); --sent-by all takes them", file=sys.stderr)  # fmt: skip
    if not kept:
        raise UserError(
            f"no suggestion of a moderators' key (marked moderator in --api-keys) among "
            f"{len(records)}, all of {', '.join(others)}; mark the moderators' key, or pass "
            "--sent-by all"
        )
    return kept


def _run_map(workdir: str | None) -> tuple[tuple[Attribute, ...], tuple[str, ...]]:
    """The run's attributes and score columns (its config.json), or the Toxic Comment labels."""
    if workdir is None:
        return attribute_map(LABELS, False), LABELS
    attributes, cfg = run_attributes(Path(workdir))
    return attributes, cfg.task.score_columns(True)


def main(argv: Sequence[str] | None = None) -> int:
    return run_action(
        "feedback",
        {
            "delete": ("erase the suggestions of a clientToken, a sessionId or a text", delete),
            "export": ("write the suggestions as a training file for a run's columns", export),
        },
        argv,
    )


if __name__ == "__main__":
    sys.exit(main())
