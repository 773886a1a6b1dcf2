"""uvicorn's httptools protocol with limits on a request's head: its size, its number of
headers and the time it takes to arrive. uvicorn bounds none of them with httptools (its
parser buffers an unfinished header however long it grows, and `--read-timeout` starts only
once the head is read), so a client could hold memory, or a connection, for as long as it
liked. Over a limit the connection gets Google's error shape and is closed: 431 for a head
too large or with too many headers, 408 for a head not sent in time.

The limits are the server's (`Options`): the protocol finds them on the application uvicorn
loaded (`state.limits`, set by `jaxtpu.serve.app.build_app`), so one class serves every
server of a process and pickles into `--workers`' processes by name.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from jaxtpu.core.serving.perspective import ApiError


@dataclass(frozen=True)
class HeadLimits:
    """max_bytes: a request's line and headers together; max_headers: how many; timeout:
    seconds from the head's first byte to its end. `refused(code)`: told of each refusal
    (the server's metrics)."""

    max_bytes: int = 16 * 1024
    max_headers: int = 100
    timeout: float = 10.0
    refused: Any = None


class _Refused(Exception):
    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


def _limits_of(app: Any) -> HeadLimits:
    """The limits of the application under uvicorn's wrappers (each keeps the next as `app`)."""
    while app is not None:
        limits = getattr(getattr(app, "state", None), "limits", None)
        if isinstance(limits, HeadLimits):
            return limits
        app = getattr(app, "app", None)
    return HeadLimits()


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` that refuses a head over `HeadLimits` (uvicorn's `http=` class)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = _limits_of(self.app)
        self._head_done = False
        self._head_bytes = 0
        self._head_count = 0
        self._head_timer: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # as uvicorn answers one
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as e:
            if isinstance(e.__context__, _Refused):
                self._refuse(e.__context__.error)
            else:
                self.send_400_response("Invalid HTTP request received.")
            return
        if not self._head_done and not self.transport.is_closing():
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_bytes:
                self._refuse(self._too_large())
            elif self._head_timer is None:
                self._head_timer = self.loop.call_later(self.limits.timeout, self._too_slow)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # a connection that sends nothing at all is timed out as a slow head
        self._head_timer = self.loop.call_later(self.limits.timeout, self._too_slow)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_done, self._head_bytes, self._head_count = False, 0, 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_count += 1
        if self._head_count > self.limits.max_headers:
            raise _Refused(ApiError(431, f"More than {self.limits.max_headers} request headers."))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_done = True
        self._cancel_timer()
        # a head that arrived in one read is measured here, whole
        size = len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers)
        if size > self.limits.max_bytes:
            raise _Refused(self._too_large())
        super().on_headers_complete()

    def _too_large(self) -> ApiError:
        return ApiError(431, f"Request headers over the limit of {self.limits.max_bytes} bytes.")

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        super().connection_lost(exc)

    def _cancel_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _too_slow(self) -> None:
        self._head_timer = None
        if not self._head_done and not self.transport.is_closing():
            self._refuse(
                ApiError(408, f"The request headers did not arrive within {self.limits.timeout} s.")
            )

    def _refuse(self, error: ApiError) -> None:
        """Google's error shape, then the connection closed (what is left of the head unread)."""
        self._cancel_timer()
        body = json.dumps(error.body()).encode()
        reason = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}
        status = b"HTTP/1.1 %d %s\r\n" % (error.code, reason.get(error.code, b""))
        fields = b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
        self.transport.write(status + fields + b"connection: close\r\n\r\n" + body)
        self.transport.close()
        if self.limits.refused is not None:
            self.limits.refused(error.code)
