"""A platform's history as rows: each comment's text, the scores Perspective gave it (under the
attributes' names), its moderators' decision, its community and time (framework-free).

`jaxtpu history import` writes them as a history file, a CSV of the columns `id,
comment_text`, one column per Perspective attribute the history holds (`TOXICITY`, ...: a score
in [0, 1], blank where Perspective did not score it), `perspective_model` (the model the score
came from, where the platform kept it), `decision` (a moderator's: 1 rejected, 0 approved,
blank none), `community` and `time` (UTC, ISO 8601). `read_history` reads that file, and any
CSV, JSON Lines or Parquet file with a text column and Perspective attribute columns (their
names in any case: `toxicity` is TOXICITY).
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from jaxtpu.core.data.tables import Structured, open_table
from jaxtpu.core.data.templates import normalize_text
from jaxtpu.core.errors import DataError

# Perspective's attributes: the six in production, then the two experimental ones
ATTRIBUTES = (
    "TOXICITY",
    "SEVERE_TOXICITY",
    "IDENTITY_ATTACK",
    "INSULT",
    "PROFANITY",
    "THREAT",
    "SEXUALLY_EXPLICIT",
    "FLIRTATION",
)
TEXT_COLUMNS = ("comment_text", "text", "comment", "body", "content")
ID_COLUMNS = ("id", "comment_id")


@dataclass
class Row:
    """One comment of a platform's history."""

    id: str
    text: str
    scores: dict[str, float] = field(default_factory=dict)  # attribute -> Perspective's score
    decision: float | None = None  # a moderator's: 1 rejected, 0 approved
    community: str = ""
    time: str = ""  # UTC, ISO 8601
    model: str = ""  # the Perspective model the score came from, where kept


@dataclass
class History:
    """Rows read from a source, what was left out and why (counts), and where they came from."""

    source: str
    rows: list[Row]
    left_out: dict[str, int] = field(default_factory=dict)

    @property
    def attributes(self) -> list[str]:
        """The attributes any row has a score of, in Perspective's order."""
        have = {a for r in self.rows for a in r.scores}
        return [a for a in ATTRIBUTES if a in have]

    def leave_out(self, why: str) -> None:
        self.left_out[why] = self.left_out.get(why, 0) + 1

    def summary(self) -> str:
        """One line: how many rows, scores of which attributes, decisions, and what was left
        out."""
        counts = ", ".join(
            f"{a} {sum(a in r.scores for r in self.rows):,}" for a in self.attributes
        )
        decided = sum(r.decision is not None for r in self.rows)
        left = "; ".join(f"{n:,} {why}" for why, n in self.left_out.items())
        return (
            f"{self.source}: {len(self.rows):,} comments; Perspective's scores: {counts or 'none'}"
            f"; moderators' decisions: {decided:,}" + (f"; left out: {left}" if left else "")
        )


def score_value(path: object, where: str, column: str, value: object) -> float | None:
    """A Perspective score cell: None when blank, else a number in [0, 1] (one line naming the
    file, row and column otherwise)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = math.nan
    if not 0.0 <= number <= 1.0:
        raise DataError(
            f"{path}: {where}: {column}={str(value)[:40]!r} is not a Perspective score (a number "
            "in [0, 1])"
        )
    return number


def _decision(path: object, where: str, value: str | None) -> float | None:
    if value is None or not value.strip():
        return None
    if value.strip() not in ("0", "1", "0.0", "1.0"):
        raise DataError(
            f"{path}: {where}: decision={value[:40]!r} is not a moderator's decision (1 rejected, "
            "0 approved, blank none)"
        )
    return float(value)


def read_history(path: str | os.PathLike) -> History:
    """The rows of a history file, or of any CSV, JSON Lines or Parquet file with a text column
    and Perspective attribute columns. A row with an empty text, or with neither a score nor a
    decision, is left out and counted.

    Raises:
      DataError: no text column, no attribute column (and no decision column), a score that is
        not in [0, 1], a decision that is not 0 or 1.
    """
    table = open_table(path)
    header = table.header
    text = next((c for c in TEXT_COLUMNS if c in header), None)
    attrs = {c: c.upper() for c in header if c.upper() in ATTRIBUTES}
    if text is None or not (attrs or "decision" in header):
        raise DataError(
            f"{path}: expected a text column ({', '.join(TEXT_COLUMNS)}) and Perspective's scores "
            f"as columns named by attribute ({', '.join(ATTRIBUTES)}) or a decision column; "
            f"found: {', '.join(header)[:300]}"
        )
    ident = next((c for c in ID_COLUMNS if c in header), None)
    out = History(str(path), [])
    for n, (where, row) in enumerate(table.rows(), 1):
        value = row.get(text)
        if isinstance(value, Structured):
            raise DataError(f"{path}: {where}: {text} holds JSON, not the comment's text")
        body = normalize_text(value) if isinstance(value, str) else ""
        if not body:
            out.leave_out("with an empty text")
            continue
        scores = {}
        for column, attr in attrs.items():
            score = score_value(path, where, column, row.get(column))
            if score is not None:
                scores[attr] = score
        decision = _decision(path, where, row.get("decision"))
        if not scores and decision is None:
            out.leave_out("with neither a score nor a decision")
            continue
        out.rows.append(
            Row(
                (row.get(ident) or "").strip() if ident else str(n),
                body,
                scores,
                decision,
                (row.get("community") or "").strip(),
                (row.get("time") or "").strip(),
                (row.get("perspective_model") or "").strip(),
            )
        )
    if not out.rows:
        raise DataError(f"{path}: no comment with a score or a decision in it ({out.summary()})")
    return out


def read_histories(paths: Sequence[str]) -> History:
    """The rows of several history files (`read_history`), as one history."""
    parts = [read_history(p.strip()) for p in paths if p.strip()]
    if not parts:
        raise DataError("--history: give one or more files, comma-separated")
    joined = History(", ".join(Path(h.source).name for h in parts), [])
    for h in parts:
        joined.rows += h.rows
        for why, n in h.left_out.items():
            joined.left_out[why] = joined.left_out.get(why, 0) + n
    return joined


def history_csv(rows: Sequence[Row], attributes: Iterable[str]) -> str:
    """The history file's text for `rows`, one column per attribute in `attributes`."""
    attributes = list(attributes)
    buffer = io.StringIO()
    w = csv.writer(buffer)
    w.writerow(["id", "comment_text", *attributes, "perspective_model", "decision", "community",
                "time"])  # fmt: skip
    for r in rows:
        scores = [repr(r.scores[a]) if a in r.scores else "" for a in attributes]
        decision = "" if r.decision is None else str(int(r.decision))
        w.writerow([r.id, r.text, *scores, r.model, decision, r.community, r.time])
    return buffer.getvalue()
