"""Perspective API's `comments:suggestscore` as data (framework-free): a client's correction
of a comment's scores, read and checked field for field as the discovery document declares
SuggestCommentScoreRequest (`parse_suggest`), and the answer (`suggest_response`).

Fields: `comment` (required: a TextEntry, as `comments:analyze` reads it), `context`,
`attributeScores` (required, not empty: per attribute a `summaryScore` and/or `spanScores`;
each score a `value` in [0, 1] whose `type`, when given, is `PROBABILITY`; each span's `begin`
and `end` UTF-16 offsets inside the text, `begin < end`), `languages`, `communityId`,
`clientToken`, `sessionId`. The answer is `{clientToken, detectedLanguages,
requestedLanguages}`.

An attribute here need not be one the model answers: the reference's examples name attributes
of their own, and Coral Talk, the one widely used client that sends suggestions, names the
moderator's decision: `{"APPROVED": {"summaryScore": {"value": 1}}}` or `DELETED` (older
versions also `HIGHLIGHTED`), with `communityId` "Coral:<site>", `clientToken`
"comment:<id>", `languages` ["EN"] and the story's URL and comment ids as a JSON text in
`context.entries[0]` (coralproject/talk, `services/perspective`). Any name of letters, digits
and underscores is kept as given; what it means for a community's model is decided when the
feedback is turned into training rows. `languages` are kept as given, never refused: a
moderator's decision is worth keeping in any language.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jaxtpu.core.serving.perspective import (
    MAX_ATTRIBUTES,
    PROBABILITY,
    bad,
    check_context,
    comment_text,
    load_json,
    probability,
    typed,
)
from jaxtpu.core.serving.spans import utf16_offsets

FIELDS = {
    "comment",
    "context",
    "attributeScores",
    "languages",
    "communityId",
    "clientToken",
    "sessionId",
}
MAX_TOKEN = 512  # characters of clientToken, sessionId and communityId kept
MAX_LANGUAGES = 10  # language tags a suggestion may keep
MAX_LANGUAGE_TAG = 35  # characters of one (BCP-47's longest tags of use are under 35)
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class Suggested:
    """One attribute's suggested scores: its summary (None when only spans were given) and
    its spans as (begin, end, value), UTF-16 offsets."""

    summary: float | None = None
    spans: tuple[tuple[int, int, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.summary is not None:
            out["summaryScore"] = self.summary
        if self.spans:
            out["spanScores"] = [list(s) for s in self.spans]
        return out


@dataclass(frozen=True)
class SuggestRequest:
    """A checked `comments:suggestscore` request."""

    text: str
    scores: dict[str, Suggested] = field(default_factory=dict)
    languages: tuple[str, ...] = ()
    community_id: str | None = None
    client_token: str | None = None
    session_id: str | None = None


def _identifier(data: dict[str, Any], name: str, where: str) -> str | None:
    value = data.get(name)
    if value is None:
        return None
    typed(value, str, where, "TYPE_STRING")
    if len(value) > MAX_TOKEN:
        raise bad(f"{name} is {len(value)} characters; at most {MAX_TOKEN}.")
    return value


def _score(value: Any, where: str, field_name: str) -> float:
    """A Score message (`{"value": x, "type": "PROBABILITY"}`): its value."""
    typed(value, dict, where, "TYPE_MESSAGE")
    unknown = sorted(set(value) - {"value", "type"})
    if unknown:
        raise bad(
            f"Invalid JSON payload received. Unknown name \"{unknown[0][:80]}\" at '{where}': "
            "Cannot find field."
        )
    kind = value.get("type", PROBABILITY)
    if kind != PROBABILITY:
        raise bad(f"{field_name}.type {str(kind)[:40]!r} is not supported; only PROBABILITY is.")
    if "value" not in value:
        raise bad(f"{field_name}.value must be specified.")
    return probability(value["value"], f"{where}.value", f"{field_name}.value")


def _attribute(name: str, value: Any, units: int) -> Suggested:
    where = f"attribute_scores[{name}]"
    shown = f"attributeScores.{name}"
    typed(value, dict, where, "TYPE_MESSAGE")
    unknown = sorted(set(value) - {"summaryScore", "spanScores"})
    if unknown:
        raise bad(
            f"Invalid JSON payload received. Unknown name \"{unknown[0][:80]}\" at '{where}': "
            "Cannot find field."
        )
    if "summaryScore" not in value and "spanScores" not in value:
        raise bad(f"{shown} must have a summaryScore or spanScores.")
    summary = None
    if "summaryScore" in value:
        summary = _score(value["summaryScore"], f"{where}.summary_score", f"{shown}.summaryScore")
    spans = []
    given = value.get("spanScores", [])
    typed(given, list, f"{where}.span_scores", "TYPE_MESSAGE")
    for i, span in enumerate(given):
        at, named = f"{where}.span_scores[{i}]", f"{shown}.spanScores[{i}]"
        typed(span, dict, at, "TYPE_MESSAGE")
        unknown = sorted(set(span) - {"begin", "end", "score"})
        if unknown:
            raise bad(
                f"Invalid JSON payload received. Unknown name \"{unknown[0][:80]}\" at '{at}': "
                "Cannot find field."
            )
        begin = typed(span.get("begin", 0), int, f"{at}.begin", "TYPE_INT32")
        end = typed(span.get("end", units), int, f"{at}.end", "TYPE_INT32")
        if not 0 <= begin < end <= units:
            raise bad(
                f"{named}: begin {begin} and end {end} must be UTF-16 offsets inside the text "
                f"(0 <= begin < end <= {units})."
            )
        if "score" not in span:
            raise bad(f"{named}.score must be specified.")
        spans.append((begin, end, _score(span["score"], f"{at}.score", f"{named}.score")))
    return Suggested(summary, tuple(spans))


def parse_suggest(body: bytes) -> SuggestRequest:
    """A `comments:suggestscore` request body, checked.

    Raises:
      ApiError: 400 naming the field for anything malformed: the JSON (as `load_json`), an
        unknown field, the comment (as `comments:analyze`), no `attributeScores` or an empty
        one, an attribute name not of letters, digits and underscores, an attribute with
        neither score, a score not in [0, 1] or of another type, a span outside the text, a
        context `comments:analyze` would refuse, languages that are not a list of strings,
        an identifier that is not a string of at most `MAX_TOKEN` characters.
    """
    data = load_json(body)
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise bad(
            f'Invalid JSON payload received. Unknown name "{unknown[0][:80]}": Cannot find field.'
        )
    text = comment_text(data.get("comment"))
    check_context(data.get("context"))
    given = data.get("attributeScores")
    if given is None:
        raise bad("attributeScores must be specified.")
    typed(given, dict, "attribute_scores", "TYPE_MAP")
    if not given:
        raise bad("attributeScores must name at least one attribute.")
    if len(given) > MAX_ATTRIBUTES:
        raise bad(f"attributeScores names {len(given)} attributes; at most {MAX_ATTRIBUTES}.")
    units = utf16_offsets(text)[-1]
    scores = {}
    for name, value in given.items():
        if not _NAME.match(name):
            raise bad(
                f"attributeScores: attribute name {name[:80]!r} must be 1-64 letters, digits "
                "or underscores, starting with a letter."
            )
        scores[name] = _attribute(name, value, units)
    asked = data.get("languages", [])
    typed(asked, list, "languages", "TYPE_STRING")
    for tag in asked:
        typed(tag, str, "languages", "TYPE_STRING")
    if len(asked) > MAX_LANGUAGES or any(len(tag) > MAX_LANGUAGE_TAG for tag in asked):
        raise bad(
            f"languages: at most {MAX_LANGUAGES} language tags of at most {MAX_LANGUAGE_TAG} "
            f"characters each (BCP-47: en, pt-BR); got {len(asked)}, the longest "
            f"{max(map(len, asked))} characters."
        )
    return SuggestRequest(
        text,
        scores,
        tuple(asked),
        _identifier(data, "communityId", "community_id"),
        _identifier(data, "clientToken", "client_token"),
        _identifier(data, "sessionId", "session_id"),
    )


def suggest_response(request: SuggestRequest, detected: Sequence[str]) -> dict[str, Any]:
    """The answer: `clientToken` (echoed, when given), `detectedLanguages` (the comment's,
    most likely first) and `requestedLanguages` (the request's `languages`)."""
    out: dict[str, Any] = {
        "detectedLanguages": list(detected),
        "requestedLanguages": list(request.languages),
    }
    if request.client_token is not None:
        out = {"clientToken": request.client_token, **out}
    return out
