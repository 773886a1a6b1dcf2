"""API keys with names, per-minute quotas and roles, as `jaxtpu serve --api-keys FILE` reads
them (framework-free).

A line of the file is `KEY [NAME [PER_MINUTE] [moderator]]`; `#` at the start of a line or
after a space starts a comment (a `#` inside a key is part of it: `abc#def` is one key). A bare
`KEY` is the key `key-N` (its line number) with no limit. `moderator` marks a moderators' key:
the decisions it suggests (`comments:suggestscore`) are the ones `jaxtpu feedback export`
learns from by default; a key a page carries (readers can see it) should never be one. Keys are
found in constant time: every key is compared with `hmac.compare_digest`, whichever matches, so
the time a request takes does not tell how much of a guessed key was right. `/metrics` counts
by the name, never by the key.

A quota is Perspective's: requests per minute per key (Perspective's default was 1 QPS,
counted per minute). It is a token bucket of `PER_MINUTE` tokens refilled continuously at
`PER_MINUTE / 60` a second: a key may send its minute's worth at once, then as fast as the
bucket refills; a request over it waits the seconds until a token is back (its
`Retry-After`). Each server process counts its own requests.
"""

from __future__ import annotations

import hmac
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from jaxtpu.core.errors import UserError

_NAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,64}$")
_COMMENT = re.compile(r"(?:^|\s)#")  # a comment starts a line, or follows a space
MODERATOR = "moderator"


@dataclass(frozen=True)
class ApiKey:
    """A key's name (what logs and metrics show), its limit (None: none) and whether it is a
    moderators' key."""

    name: str
    per_minute: int | None = None
    moderator: bool = False


class KeyRing:
    """The keys of an --api-keys file."""

    def __init__(self, entries: Sequence[tuple[str, ApiKey]]) -> None:
        self._entries = [(k.encode(), v) for k, v in entries]
        self.names = [v.name for _, v in entries]

    @classmethod
    def parse(cls, text: str, source: str) -> KeyRing:
        """The keys of a file's `text`; `source` names it in errors.

        Raises:
          UserError: a line of more than three fields (and `moderator`), a name used twice
            or not of letters, digits and `_.:@-`, a limit that is not a positive whole
            number, a key given twice, or no key at all.
        """
        entries: list[tuple[str, ApiKey]] = []
        for number, line in enumerate(text.splitlines(), 1):
            fields = _COMMENT.split(line, 1)[0].split()
            if not fields:
                continue
            where = f"{source} line {number}"
            moderator = len(fields) > 2 and fields[-1] == MODERATOR
            if moderator:
                fields = fields[:-1]
            if len(fields) > 3:
                raise UserError(
                    f"{where}: expected KEY [NAME [PER_MINUTE] [moderator]], got "
                    f"{len(fields) + moderator} fields"
                )
            key = fields[0]
            name = fields[1] if len(fields) > 1 else f"key-{number}"
            if not _NAME.match(name):
                raise UserError(
                    f"{where}: name {name[:70]!r} must be 1-64 letters, digits or _.:@- (it is "
                    "shown in /metrics)"
                )
            limit = None
            if len(fields) == 3:
                if not fields[2].isdigit() or int(fields[2]) < 1:
                    raise UserError(
                        f"{where}: PER_MINUTE {fields[2][:20]!r} must be a whole number >= 1 "
                        "(requests a minute; leave it out for no limit) or the word moderator"
                    )
                limit = int(fields[2])
            if any(hmac.compare_digest(key.encode(), k.encode()) for k, _ in entries):
                raise UserError(f"{where}: this key is given twice")
            if name in (e.name for _, e in entries):
                raise UserError(f"{where}: the name {name} is given twice")
            entries.append((key, ApiKey(name, limit, moderator)))
        if not entries:
            raise UserError(
                f"{source}: no key in it (one a line: KEY [NAME [PER_MINUTE] [moderator]])"
            )
        return cls(entries)

    def find(self, key: str) -> ApiKey | None:
        """The key's record, or None; every key is compared, in constant time each."""
        given = key.encode("utf-8", "surrogatepass")
        found = None
        for k, v in self._entries:
            if hmac.compare_digest(given, k):
                found = v
        return found


class Quotas:
    """Each limited key's token bucket (`clock`: seconds, monotonic)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (tokens, when)

    def take(self, key: ApiKey) -> int:
        """0 when `key` may make one more request now (and counts it), else the whole
        seconds until it may."""
        if key.per_minute is None:
            return 0
        size, rate = float(key.per_minute), key.per_minute / 60
        now = self.clock()
        tokens, then = self._buckets.get(key.name, (size, now))
        tokens = min(size, tokens + (now - then) * rate)
        if tokens >= 1:
            self._buckets[key.name] = (tokens - 1, now)
            return 0
        self._buckets[key.name] = (tokens, now)
        return max(1, math.ceil((1 - tokens) / rate))
