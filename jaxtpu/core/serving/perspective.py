"""Perspective API's `comments:analyze` as data: its request read and checked
(`parse_request`), its response built (`response`), its errors in Google's JSON shape
(`ApiError`), and the pieces `comments:suggestscore` (`suggest`) reads the same way
(framework-free; the HTTP server is `jaxtpu.serve`).

The request and response follow Perspective's API reference field for field:
`comment.text` (required, at most `MAX_TEXT_BYTES` of UTF-8), `comment.type` (`PLAIN_TEXT`),
`requestedAttributes` (required: a map from attribute name to `{}` or `{"scoreType":
"PROBABILITY", "scoreThreshold": x}`), `spanAnnotations`, `languages` (echoed), `clientToken`
(echoed), and `doNotStore`, `sessionId`, `communityId`, `context` (checked and accepted; an
analyzed comment is never stored, and the context does not change a score, as it did not at
Perspective). As Google's APIs do, a field this method does not have is an error rather than
silently ignored, so a typo is seen.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from jaxtpu.core.serving.spans import sentence_spans

MAX_TEXT_BYTES = 20480  # Perspective's limit on comment.text (20 KB)
MAX_ATTRIBUTES = 64  # requested attributes per request (a model has a handful)
# Sentences scored for one request's spanAnnotations: each is a text of its own, so the cap
# bounds one request's work. Of 10,000 real Jigsaw comments (../shared/data) the 99.9th
# percentile has 97 sentences (the longest, 439: line breaks); a 20 KB text of a line break
# every other byte would be 10,000.
MAX_SPANS = 100
PROBABILITY = "PROBABILITY"
FIELDS = {
    "comment",
    "context",
    "requestedAttributes",
    "spanAnnotations",
    "languages",
    "doNotStore",
    "clientToken",
    "sessionId",
    "communityId",
    "dropUnsupportedAttributes",
}
STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "INVALID_ARGUMENT",
    408: "DEADLINE_EXCEEDED",
    411: "INVALID_ARGUMENT",
    413: "INVALID_ARGUMENT",
    415: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    431: "INVALID_ARGUMENT",
    499: "CANCELLED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


class ApiError(Exception):
    """A refused request: its HTTP code, Google's status name and one line for the caller."""

    def __init__(self, code: int, message: str, details: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.code, self.message, self.details = code, message, details or []

    @property
    def status(self) -> str:
        return STATUS.get(self.code, "UNKNOWN")

    def body(self) -> dict[str, Any]:
        """`{"error": {"code", "message", "status"[, "details"]}}`, Google's error shape."""
        error = {"code": self.code, "message": self.message, "status": self.status}
        if self.details:
            error["details"] = self.details
        return {"error": error}


@dataclass(frozen=True)
class Requested:
    """One requested attribute: its name and the threshold under which its scores are left
    out (None: every score)."""

    name: str
    threshold: float | None = None


@dataclass(frozen=True)
class AnalyzeRequest:
    """A checked `comments:analyze` request."""

    text: str
    attributes: tuple[Requested, ...]
    languages: tuple[str, ...]  # as the client wrote them; () when absent
    spans: bool = False
    client_token: str | None = None
    session_id: str | None = None
    do_not_store: bool = False
    # with spans: (begin, end, text) of each sentence, UTF-16 offsets (`spans.sentence_spans`)
    sentences: tuple[tuple[int, int, str], ...] = ()
    # dropUnsupportedAttributes: a language the model lacks drops every attribute (an answer
    # with no scores) instead of a 400; `unsupported` when the named languages are such
    drop_unsupported: bool = False
    unsupported: bool = False
    # the model set answering it: a community's own (`jaxtpu serve --community`), else the base
    community_id: str | None = None


def bad(message: str) -> ApiError:
    return ApiError(400, message)


def typed(value: Any, kind: type | tuple[type, ...], where: str, name: str) -> Any:
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise bad(f"Invalid value at '{where}' ({name}): {json.dumps(value)[:80]}")
    return value


def language_code(tag: str) -> str:
    """The primary language of a BCP-47 / ISO 639-1 tag, lower case: 'en-US' -> 'en'."""
    return tag.replace("_", "-").split("-")[0].strip().lower()


def parse_request(
    body: bytes, available: Sequence[str], languages: Sequence[str]
) -> AnalyzeRequest:
    """A `comments:analyze` request body, checked against the model.

    Args:
      body: the request's bytes (JSON).
      available: the attribute names the model answers.
      languages: the languages it was validated on (ISO 639-1 codes).

    Raises:
      ApiError: 400 with Perspective's message for anything the method refuses: invalid
        JSON or UTF-8, a missing or mistyped field, an unknown field, empty or too long text,
        a comment type other than PLAIN_TEXT, an attribute the model lacks (the message names
        those it has), a score type other than PROBABILITY, a threshold that is not a number
        in [0, 1], a language the model was not validated on.
    """
    data = load_json(body)
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise bad(f'Invalid JSON payload received. Unknown name "{unknown[0]}": Cannot find field.')
    text = comment_text(data.get("comment"))
    attributes = _requested(data.get("requestedAttributes"), available)
    drop = data.get("dropUnsupportedAttributes", False)
    typed(drop, bool, "drop_unsupported_attributes", "TYPE_BOOL")
    try:
        asked = _languages(data.get("languages"), attributes, languages)
        unsupported = False
    except ApiError:
        if not drop:
            raise
        asked, unsupported = tuple(data["languages"]), True
    spans = typed(data.get("spanAnnotations", False), bool, "span_annotations", "TYPE_BOOL")
    do_not_store = typed(data.get("doNotStore", False), bool, "do_not_store", "TYPE_BOOL")
    token = data.get("clientToken")
    if token is not None:
        typed(token, str, "client_token", "TYPE_STRING")
    session = data.get("sessionId")
    if session is not None:
        typed(session, str, "session_id", "TYPE_STRING")
    community = data.get("communityId")
    if community is not None:
        typed(community, str, "community_id", "TYPE_STRING")
    check_context(data.get("context"))
    sentences = tuple(sentence_spans(text)) if spans else ()
    if len(sentences) > MAX_SPANS:
        raise bad(
            f"spanAnnotations: the comment has {len(sentences)} sentences (a line break ends "
            f"one too); at most {MAX_SPANS} are scored in one request. Send it without "
            "spanAnnotations, or in parts."
        )
    return AnalyzeRequest(
        text,
        attributes,
        asked,
        spans,
        token,
        session,
        do_not_store,
        sentences,
        drop,
        unsupported,
        community,
    )


class _Duplicate(ValueError):
    """A JSON object naming one member twice."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _Duplicate(twice)
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"Unexpected token {name}: not JSON")


def load_json(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object.

    Raises:
      ApiError: 400 when it is not UTF-8, not JSON (NaN and Infinity are not), not an object,
        nested deeper than Python's parser goes (about 1,000 levels), or names a member twice
        in one object (the last would win here while a filter in front may read the first).
    """
    try:
        data = json.loads(
            body.decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_no_duplicates
        )
    except UnicodeDecodeError:
        raise bad("Invalid JSON payload received. The body is not valid UTF-8.") from None
    except _Duplicate as e:
        raise bad(
            f'Invalid JSON payload received. Duplicate name "{str(e)[:80]}": each field may '
            "be given once."
        ) from None
    except RecursionError:
        raise bad("Invalid JSON payload received. The JSON is nested too deeply.") from None
    except ValueError as e:
        raise bad(f"Invalid JSON payload received. {str(e).split(':')[0]}.") from None
    if not isinstance(data, dict):
        raise bad("Invalid JSON payload received. The request must be a JSON object.")
    return data


def probability(value: Any, where: str, field: str) -> float:
    """A number in [0, 1] (a JSON number: an int of any size, or a float) as a float; 400
    otherwise, naming `where` (the proto path, for a value of another type) or `field`.
    Compared before it is converted, so a 400-digit integer is a 400, not an OverflowError."""
    typed(value, (int, float), where, "TYPE_FLOAT")
    if not 0 <= value <= 1:  # False for NaN too
        shown = repr(value) if isinstance(value, float) else str(value)[:40]
        raise bad(f"{field} must be a number in [0, 1], got {shown}.")
    return float(value)


def comment_text(comment: Any) -> str:
    if comment is None:
        raise bad("Comment must be specified (comment.text is required).")
    typed(comment, dict, "comment", "TYPE_MESSAGE")
    unknown = sorted(set(comment) - {"text", "type"})
    if unknown:
        raise bad(
            f"Invalid JSON payload received. Unknown name \"{unknown[0]}\" at 'comment': Cannot "
            "find field."
        )
    kind = comment.get("type", "PLAIN_TEXT")
    if kind != "PLAIN_TEXT":
        raise bad(f"comment.type {kind!r} is not supported; only PLAIN_TEXT is.")
    text = comment.get("text")
    if text is None:
        raise bad("Comment must be specified (comment.text is required).")
    typed(text, str, "comment.text", "TYPE_STRING")
    if not text.strip():
        raise bad(
            "Comment text was empty: comment.text must hold at least one character that is "
            "not whitespace."
        )
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate escaped in the JSON (\ud800)
        raise bad("comment.text is not valid Unicode (an unpaired surrogate).") from None
    if size > MAX_TEXT_BYTES:
        raise bad(f"Comment text too long: {size} bytes of UTF-8; the limit is {MAX_TEXT_BYTES}.")
    return text


def _requested(value: Any, available: Sequence[str]) -> tuple[Requested, ...]:
    if value is None:
        raise bad("requestedAttributes must be specified.")
    typed(value, dict, "requested_attributes", "TYPE_MAP")
    if not value:
        raise bad("requestedAttributes must name at least one attribute.")
    if len(value) > MAX_ATTRIBUTES:
        raise bad(f"requestedAttributes names {len(value)} attributes; at most {MAX_ATTRIBUTES}.")
    out = []
    for name, options in value.items():
        if name not in available:
            raise bad(
                f"Unknown attribute {name[:80]!r}: this model answers {', '.join(available)}."
            )
        where = f"requested_attributes[{name}]"
        typed(options, dict, where, "TYPE_MESSAGE")
        unknown = sorted(set(options) - {"scoreType", "scoreThreshold"})
        if unknown:
            raise bad(
                f"Invalid JSON payload received. Unknown name \"{unknown[0]}\" at '{where}': "
                "Cannot find field."
            )
        kind = options.get("scoreType", PROBABILITY)
        if kind != PROBABILITY:
            raise bad(f"{where}.scoreType {kind!r} is not supported; only PROBABILITY is.")
        threshold = options.get("scoreThreshold")
        if threshold is not None:
            threshold = probability(
                threshold, f"{where}.score_threshold", f"{where}.scoreThreshold"
            )
        out.append(Requested(name, threshold))
    return tuple(out)


def _languages(
    value: Any, attributes: Sequence[Requested], supported: Sequence[str]
) -> tuple[str, ...]:
    return check_languages(value, attributes[0].name, supported)


def not_supported(attribute: str, languages: Sequence[str], message: str) -> ApiError:
    """Perspective's 400 for languages an attribute lacks (`errorType`
    LANGUAGE_NOT_SUPPORTED_BY_ATTRIBUTE, naming them)."""
    return ApiError(
        400,
        message,
        [
            {
                "@type": "type.googleapis.com/google.commentanalyzer.v1alpha1.Error",
                "errorType": "LANGUAGE_NOT_SUPPORTED_BY_ATTRIBUTE",
                "languageNotSupportedByAttributeError": {
                    "detectedLanguages": list(languages),
                    "attribute": attribute,
                },
            }
        ],
    )


def check_languages(value: Any, attribute: str, supported: Sequence[str]) -> tuple[str, ...]:
    """A request's `languages` (a list of BCP-47 tags; () when absent), each one the model
    serves, or Perspective's 400 naming `attribute` and the languages it lacks."""
    if value is None:
        return ()
    typed(value, list, "languages", "TYPE_STRING")
    for tag in value:
        typed(tag, str, "languages", "TYPE_STRING")
    unsupported = [t for t in value if language_code(t) not in supported]
    if unsupported:
        raise not_supported(
            attribute,
            unsupported,
            f"Attribute {attribute} does not support request languages: "
            f"{', '.join(unsupported)} (this model was validated on {', '.join(supported)})",
        )
    return tuple(value)


def text_entry(value: Any, where: str) -> str:
    """A TextEntry (`{"text": ..., "type": "PLAIN_TEXT"}`): its text."""
    typed(value, dict, where, "TYPE_MESSAGE")
    unknown = sorted(set(value) - {"text", "type"})
    if unknown:
        raise bad(
            f"Invalid JSON payload received. Unknown name \"{unknown[0][:80]}\" at '{where}': "
            "Cannot find field."
        )
    kind = value.get("type", "PLAIN_TEXT")
    if kind != "PLAIN_TEXT":
        raise bad(f"{where}.type {str(kind)[:40]!r} is not supported; only PLAIN_TEXT is.")
    return typed(value.get("text", ""), str, f"{where}.text", "TYPE_STRING")


def check_context(value: Any) -> None:
    """A request's `context`, as the API reference declares it: `entries` (TextEntry list)
    and/or `articleAndParentComment` (`article`, `parentComment`: TextEntry). Accepted and
    never read into a score, as at Perspective."""
    if value is None:
        return
    typed(value, dict, "context", "TYPE_MESSAGE")
    unknown = sorted(set(value) - {"entries", "articleAndParentComment"})
    if unknown:
        raise bad(
            f"Invalid JSON payload received. Unknown name \"{unknown[0][:80]}\" at 'context': "
            "Cannot find field."
        )
    entries = value.get("entries", [])
    typed(entries, list, "context.entries", "TYPE_MESSAGE")
    for i, entry in enumerate(entries):
        text_entry(entry, f"context.entries[{i}]")
    pair = value.get("articleAndParentComment")
    if pair is not None:
        where = "context.article_and_parent_comment"
        typed(pair, dict, where, "TYPE_MESSAGE")
        for name in set(pair) - {"article", "parentComment"}:
            raise bad(
                f"Invalid JSON payload received. Unknown name \"{name[:80]}\" at '{where}': "
                "Cannot find field."
            )
        for name in ("article", "parentComment"):
            if name in pair:
                text_entry(pair[name], f"{where}.{name}")


def dropped_response(
    request: AnalyzeRequest, languages: Sequence[str], detected: Sequence[str]
) -> dict[str, Any]:
    """The answer to a request with dropUnsupportedAttributes whose language the model lacks:
    every attribute dropped, as Perspective answered it."""
    out: dict[str, Any] = {
        "attributeScores": {},
        "languages": list(request.languages or languages),
        "detectedLanguages": list(detected),
    }
    if request.client_token is not None:
        out["clientToken"] = request.client_token
    return out


def _score(value: float) -> dict[str, Any]:
    return {"value": float(value), "type": PROBABILITY}


def response(
    request: AnalyzeRequest,
    summary: Mapping[str, float],
    spans: Sequence[tuple[int, int, Mapping[str, float]]] = (),
    languages: Sequence[str] = ("en",),
    detected: Sequence[str] = (),
) -> dict[str, Any]:
    """The `comments:analyze` response.

    Args:
      request: the checked request.
      summary: each requested attribute's score of the whole text.
      spans: (begin, end, {attribute: score}) of each sentence, when spans were asked for.
      languages: the languages the comment was scored as (`languages.scored_as`), answered
        when the request named none.
      detected: the comment's detected languages, most likely first (`detectedLanguages`).

    A score under its attribute's threshold is left out; an attribute with nothing left is
    left out of `attributeScores`, as Perspective does.
    """
    scores: dict[str, Any] = {}
    for attr in request.attributes:
        low = attr.threshold
        entry: dict[str, Any] = {}
        if request.spans:
            kept = [
                {"begin": b, "end": e, "score": _score(s[attr.name])}
                for b, e, s in spans
                if low is None or s[attr.name] >= low
            ]
            if kept:
                entry["spanScores"] = kept
        value = summary[attr.name]
        if low is None or value >= low:
            entry["summaryScore"] = _score(value)
        if entry:
            scores[attr.name] = entry
    out: dict[str, Any] = {
        "attributeScores": scores,
        "languages": list(request.languages or languages),
        "detectedLanguages": list(detected),
    }
    if request.client_token is not None:
        out["clientToken"] = request.client_token
    return out
