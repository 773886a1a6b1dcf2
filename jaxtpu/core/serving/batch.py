"""Google's batch requests, as google-api-python-client's `new_batch_http_request()` sends
them to the discovery document's `batchPath` (framework-free): one `multipart/mixed` POST whose
parts are each an `application/http` request (`POST /v1alpha1/comments:analyze?key=... HTTP/1.1`,
its headers, its JSON body) with a `Content-ID`, answered by one `multipart/mixed` response
whose parts are each that call's HTTP response, with `Content-ID: <response-ID>`, in order.

`parse_batch` reads the calls (a body that is not `multipart/mixed`, holds no call or more than
`MAX_CALLS`, or nests parts too deeply for the parser, is one 400); a part that is not an HTTP
request becomes a call the server answers 400; `batch_response` writes the answers.
`first_call_key` finds the key of a batch's first call in the start of its body, so a server
with keys can refuse an anonymous batch before reading the rest.
"""

from __future__ import annotations

import http
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from email.message import Message
from email.parser import BytesParser
from urllib.parse import parse_qsl, urlsplit

from jaxtpu.core.serving.perspective import ApiError

MAX_CALLS = 100  # calls in one batch (Google's APIs allow up to 1,000; HELM sends up to 100)


@dataclass
class Call:
    """One call of a batch: its Content-ID, method, path, query, headers (lower-case names)
    and body; `problem`, when the part could not be read as an HTTP request."""

    content_id: str | None
    method: str = ""
    path: str = ""
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    problem: str | None = None


@dataclass(frozen=True)
class Answer:
    """One call's HTTP response."""

    content_id: str | None
    status: int
    headers: Sequence[tuple[str, str]]
    body: bytes


def parse_batch(content_type: str, body: bytes) -> list[Call]:
    """The calls of a batch request.

    Raises:
      ApiError: 400 when the body is not multipart/mixed with a boundary, or holds no call or
        more than `MAX_CALLS`.
    """
    head = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1", "replace")
    try:
        return _parse(head + body, content_type)
    except RecursionError:  # a part nesting multipart in multipart, a thousand deep
        raise ApiError(
            400,
            "The batch request nests multipart parts too deeply; a batch's parts are each one "
            "application/http request.",
        ) from None


def _parse(raw: bytes, content_type: str) -> list[Call]:
    message = BytesParser().parsebytes(raw)
    if message.get_content_type() != "multipart/mixed" or not message.get_boundary():
        raise ApiError(
            400,
            f"A batch request is multipart/mixed with a boundary, one application/http part a "
            f"call; got Content-Type {content_type[:80]!r}.",
        )
    parts = message.get_payload()
    if not isinstance(parts, list) or not parts:
        raise ApiError(400, "The batch request holds no call.")
    if len(parts) > MAX_CALLS:
        raise ApiError(400, f"The batch request holds {len(parts)} calls; at most {MAX_CALLS}.")
    return [_call(part) for part in parts]


_REQUEST_LINE = re.compile(rb"^[A-Z]+ (\S+) HTTP/\d\.\d\r?$", re.MULTILINE)
_KEY_HEADER = re.compile(rb"^x-goog-api-key:[ \t]*(\S+)", re.IGNORECASE | re.MULTILINE)


def first_call_key(start: bytes) -> str | None:
    """The API key of a batch's first call (its URL's `?key=`, else its `X-Goog-Api-Key`
    header), read from the first bytes of the batch's body; None when they hold none."""
    line = _REQUEST_LINE.search(start)
    if line is None:
        return None
    key = dict(parse_qsl(urlsplit(line.group(1).decode("latin-1")).query)).get("key")
    if key:
        return key
    head = start[line.end() :].split(b"\r\n\r\n", 1)[0].split(b"\n\n", 1)[0]
    header = _KEY_HEADER.search(head)
    return header.group(1).decode("latin-1") if header else None


def _call(part: Message) -> Call:
    content_id = part.get("Content-ID")
    call = Call(content_id)
    if part.get_content_type() != "application/http":
        call.problem = f"A batch part is application/http, not {part.get_content_type()}."
        return call
    raw = part.get_payload(decode=True)
    if not isinstance(raw, bytes) or not raw.strip():
        call.problem = "A batch part holds no HTTP request."
        return call
    line, _, rest = raw.lstrip(b"\r\n").partition(b"\n")
    words = line.decode("latin-1").split()
    if len(words) != 3 or not words[2].startswith("HTTP/"):
        call.problem = "A batch part's first line is not METHOD PATH HTTP/1.1."
        return call
    inner = BytesParser().parsebytes(rest)
    target = urlsplit(words[1])
    call.method, call.path = words[0].upper(), target.path
    call.query = dict(parse_qsl(target.query))
    call.headers = {k.lower(): str(v) for k, v in inner.items()}
    payload = inner.get_payload(decode=True)
    call.body = payload if isinstance(payload, bytes) else b""
    return call


def _reason(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return {499: "Client Closed Request"}.get(status, "")


def batch_response(answers: Sequence[Answer]) -> tuple[str, bytes]:
    """(Content-Type, body) of the batch's response: each answer a part, in order."""
    boundary = f"batch_{uuid.uuid4().hex}"
    out = bytearray()
    for a in answers:
        out += f"--{boundary}\r\nContent-Type: application/http\r\n".encode()
        if a.content_id:
            inner = a.content_id.strip()
            inner = inner[1:-1] if inner.startswith("<") and inner.endswith(">") else inner
            out += f"Content-ID: <response-{inner}>\r\n".encode("latin-1", "replace")
        out += f"\r\nHTTP/1.1 {a.status} {_reason(a.status)}\r\n".encode()
        for name, value in a.headers:
            if name.lower() not in ("content-length", "connection"):
                out += f"{name}: {value}\r\n".encode("latin-1", "replace")
        out += f"Content-Length: {len(a.body)}\r\n\r\n".encode() + a.body + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return f"multipart/mixed; boundary={boundary}", bytes(out)
