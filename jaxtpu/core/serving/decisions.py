"""Kept suggestions (`comments:suggestscore`, `jaxtpu.core.serving.feedback`) as training rows
a run's columns can learn from (framework-free): what `jaxtpu feedback export` writes.

A suggestion names attributes. An attribute the run answers (its attribute map: TOXICITY is
`toxic`, ...) gives its column the summary score suggested (0 or 1, or a fraction). A
moderator's decision, as Coral Talk sends it (`DELETED` for a rejected comment, `APPROVED`,
and in older versions `HIGHLIGHTED`, each with the value 1), gives the decision attribute's
column (TOXICITY's by default) the decision's value (`DECISIONS`: rejected 1, approved or
highlighted 0): the community's moderation is its label. A column a suggestion does not
mention is left blank, which training leaves out of the loss for that row (never read as 0).
Suggestions are kept one per clientToken already (the latest); span scores are not rows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jaxtpu.core.errors import UserError
from jaxtpu.core.serving.attributes import Attribute
from jaxtpu.core.serving.feedback import Record

# Coral Talk's decisions and the value each gives the decision attribute's column
DECISIONS = {"DELETED": 1.0, "APPROVED": 0.0, "HIGHLIGHTED": 0.0}


def parse_decisions(text: str) -> dict[str, float]:
    """`--decisions NAME=VALUE,...` (values in [0, 1]); '' is `DECISIONS`."""
    if not text.strip():
        return dict(DECISIONS)
    out = {}
    for item in text.split(","):
        name, eq, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not eq or not name.strip() or not 0 <= number <= 1:
            raise UserError(
                f"--decisions {text!r}: expected NAME=VALUE,... with each value in [0, 1] "
                "(e.g. DELETED=1,APPROVED=0)"
            )
        out[name.strip()] = number
    return out


@dataclass(frozen=True)
class Rows:
    """Training rows: their columns (id, comment_text, the run's columns, community, time)
    and values ('' where a column is not mentioned), and what was left out."""

    header: list[str]
    rows: list[list[Any]]
    skipped: dict[str, int]  # attribute names neither the run answers nor a decision, counted


def training_rows(
    records: Sequence[Record],
    attributes: Sequence[Attribute],
    columns: Sequence[str],
    decisions: Mapping[str, float],
    decision_attribute: str,
) -> Rows:
    """`records` as rows of `columns` (a run's score columns).

    Raises:
      UserError: `decision_attribute` is not one the run answers.
    """
    column_of = {a.name: a.column for a in attributes}
    if decision_attribute not in column_of:
        raise UserError(
            f"--decision-attribute {decision_attribute}: the run answers "
            f"{', '.join(column_of)}; a decision labels one of them"
        )
    header = ["id", "comment_text", *columns, "community", "time"]
    rows, skipped = [], {}
    for i, r in enumerate(records):
        values: dict[str, float] = {}
        for name, score in r.attribute_scores.items():
            if "summaryScore" not in score:
                continue  # spans alone: no row label
            if name in column_of:
                values[column_of[name]] = float(score["summaryScore"])
            elif name in decisions:
                values.setdefault(column_of[decision_attribute], decisions[name])
            else:
                skipped[name] = skipped.get(name, 0) + 1
        if not values:
            continue
        when = dt.datetime.fromtimestamp(r.received, dt.UTC).isoformat(timespec="seconds")
        rows.append(
            [r.client_token or f"suggestion-{i}", r.text]
            + [_format(values[c]) if c in values else "" for c in columns]
            + [r.community_id or "", when]
        )
    return Rows(header, rows, skipped)


def _format(value: float) -> str:
    return str(int(value)) if value in (0.0, 1.0) else repr(value)


def parse_since(text: str) -> float:
    """`--since DATE` (ISO 8601: 2026-11-01 or 2026-11-01T12:00; UTC unless it says) as UTC
    seconds since the epoch."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise UserError(
            f"--since {text!r}: expected an ISO 8601 date or time, e.g. 2026-11-01"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()
