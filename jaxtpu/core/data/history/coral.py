"""A Coral Talk newsroom's MongoDB exports as history rows (framework-free; MongoDB's own codec,
pymongo's `bson`, reads them: no MongoDB server is needed).

Coral keeps each comment in the `comments` collection with its revisions (an edit adds one);
the latest revision's `body` is the text readers saw, in HTML, and its
`metadata.perspective = {score, model}` the score Perspective gave it and the attribute it was
asked for (`model`: TOXICITY by default, SEVERE_TOXICITY in older versions). Staff comments,
comments caught by the banned-word list and those Perspective did not answer in time have
none. Moderators' decisions are the `commentModerationActions` collection: `commentID`,
`commentRevisionID`, `status` and `moderatorID` (null for the system's own actions, such as a
deleted account's comments, whose body is emptied).

A comment's decision is the latest action of a moderator (`moderatorID` set) on its latest
revision: REJECTED 1, APPROVED 0 (a moderator who changed their mind is read as they ended);
system actions, other statuses (NONE, PREMOD, SYSTEM_WITHHELD) and comments nobody reviewed
carry none. Its community is Coral's tenant and site (`tenantID/siteID`); its time, its latest
revision's.

Files: `mongoexport --collection comments` (JSON lines, or one array with --jsonArray) in
MongoDB Extended JSON, relaxed or canonical, and `mongodump`'s `comments.bson`, told apart by
the `.bson` suffix.
"""

from __future__ import annotations

import datetime as dt
import html.parser
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jaxtpu.core.data.history.rows import ATTRIBUTES, History, Row, score_value
from jaxtpu.core.errors import DataError, UserError

DECISIONS = {"REJECTED": 1.0, "APPROVED": 0.0}
_BREAKS = {"br", "p", "div", "li", "blockquote", "ul", "ol"}


def _bson() -> Any:
    try:
        import bson
        from bson import json_util
    except ImportError:
        raise UserError(
            "reading Coral's MongoDB exports needs pymongo's bson codec: pip install "
            "'jaxtpu[serve]'"
        ) from None
    return bson, json_util


def documents(path: str | os.PathLike, collection: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, document) of a mongodump BSON file or a mongoexport JSON file (lines, or one
    array), in MongoDB Extended JSON, relaxed or canonical."""
    bson, json_util = _bson()
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: no such file (Coral's {collection} collection, exported)")
    if p.suffix.lower() == ".bson":
        with open(p, "rb") as f:
            try:
                for i, doc in enumerate(bson.decode_file_iter(f), 1):
                    yield f"document {i}", doc
            except bson.errors.InvalidBSON as e:
                raise DataError(f"{p}: not a mongodump BSON file of {collection} ({e})") from None
        return
    with open(p, encoding="utf-8") as f:
        head = f.read(1 << 16).lstrip()
        f.seek(0)
        try:
            if head.startswith("["):
                for i, doc in enumerate(json_util.loads(f.read()), 1):
                    yield f"document {i}", doc
                return
            for number, line in enumerate(f, 1):
                if line.strip():
                    yield f"line {number}", json_util.loads(line)
        except (ValueError, TypeError) as e:
            raise DataError(
                f"{p}: not mongoexport's Extended JSON of {collection} ({str(e)[:120]})"
            ) from None


def _text_of(body: str) -> str:
    """The text a reader saw of an HTML body: tags dropped, entities decoded, a line break for
    each break and block, whitespace collapsed as jaxtpu reads every comment."""
    parts: list[str] = []

    class Reader(html.parser.HTMLParser):
        def handle_starttag(self, tag: str, attrs: Any) -> None:
            if tag in _BREAKS:
                parts.append("\n")

        def handle_data(self, data: str) -> None:
            parts.append(data)

    reader = Reader(convert_charrefs=True)
    reader.feed(body)
    reader.close()
    return " ".join("".join(parts).split())


def _when(value: Any) -> str:
    if isinstance(value, dt.datetime):
        when = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return when.astimezone(dt.UTC).isoformat(timespec="seconds")
    return str(value or "")


def _check(path: Any, where: str, doc: Any, needs: tuple[str, ...], collection: str) -> None:
    if not isinstance(doc, dict) or any(k not in doc for k in needs):
        found = ", ".join(list(doc)[:12]) if isinstance(doc, dict) else type(doc).__name__
        raise DataError(
            f"{path}: {where} is not a document of Coral's {collection} collection (expected "
            f"{', '.join(needs)}; found {found})"
        )


def decisions(path: str | os.PathLike) -> dict[tuple[str, str], tuple[Any, float]]:
    """Each (comment, revision)'s latest moderator decision: (when, 1 rejected or 0 approved)."""
    out: dict[tuple[str, str], tuple[Any, float]] = {}
    for where, doc in documents(path, "commentModerationActions"):
        _check(path, where, doc, ("commentID", "status"), "commentModerationActions")
        if doc.get("moderatorID") is None or doc["status"] not in DECISIONS:
            continue  # the system's, or no decision
        key = (str(doc["commentID"]), str(doc.get("commentRevisionID", "")))
        when = doc.get("createdAt")
        if key not in out or _when(when) >= _when(out[key][0]):
            out[key] = (when, DECISIONS[doc["status"]])
    return out


def read_coral(comments: str | os.PathLike, actions: str | os.PathLike | None) -> History:
    """The history of a Coral site: each comment's latest revision as a row, with its
    Perspective score and, from `actions` when given, its moderators' decision.

    Raises:
      DataError: a file that is not of the collection it is given as, or holds no comment.
    """
    decided = decisions(actions) if actions is not None else {}
    out = History(str(comments), [])
    seen = 0
    for where, doc in documents(comments, "comments"):
        _check(comments, where, doc, ("id", "revisions"), "comments")
        seen += 1
        revisions = doc["revisions"] or [{}]
        latest = revisions[-1]
        text = _text_of(str(latest.get("body") or ""))
        if not text:
            out.leave_out("with an empty body (a deleted account's, or media alone)")
            continue
        row = Row(str(doc["id"]), text, community=_community(doc))
        row.time = _when(latest.get("createdAt") or doc.get("createdAt"))
        scored = (latest.get("metadata") or {}).get("perspective")
        if isinstance(scored, dict) and scored.get("score") is not None:
            row.model = str(scored.get("model") or "TOXICITY")
            attribute = row.model.split("@")[0].upper()
            if attribute in ATTRIBUTES:
                row.scores[attribute] = _score(comments, where, scored["score"])
            else:
                out.leave_out(f"score(s) of a model that is no Perspective attribute ({row.model})")
        decision = decided.get((row.id, str(latest.get("id", ""))))
        if decision is not None:
            row.decision = decision[1]
        if not row.scores and row.decision is None:
            out.leave_out("never scored nor decided")
            continue
        out.rows.append(row)
    if not seen:
        raise DataError(f"{comments}: no comment in it (an export of Coral's comments collection)")
    if not out.rows:
        raise DataError(f"{comments}: no comment with a score or a decision ({out.summary()})")
    return out


def _score(path: Any, where: str, value: Any) -> float:
    score = score_value(path, where, "metadata.perspective.score", value)
    assert score is not None
    return score


def _community(doc: dict[str, Any]) -> str:
    tenant, site = doc.get("tenantID"), doc.get("siteID")
    return "/".join(str(x) for x in (tenant, site) if x)
