"""Where `jaxtpu serve --feedback URL` keeps the scores clients suggest (`comments:suggestscore`),
durably (framework-free).

- `--feedback PATH` (or `sqlite:///PATH`): an SQLite file, embedded, no server to run. Several
  worker processes of one host may write it (SQLite's own locking; WAL journal).
- `--feedback postgresql://USER@HOST:PORT/DB`: a PostgreSQL database (psycopg 3), for several
  replicas writing one store.

One table, `jaxtpu_feedback`, made when missing: each suggestion's text, the attribute scores
suggested (JSON), communityId, clientToken, sessionId, languages, when it was received (UTC
seconds since the epoch), the model version the server was answering with, and its owner: the
name of the API key that sent it ('' on a server without keys, which cannot tell who did) and
whether that key is a moderators' (`--api-keys`' `moderator`). A second suggestion of the same
owner with the same clientToken replaces the first (a moderator who changes their mind); another
key's suggestion with that token is kept beside it, never over it (Coral's tokens,
`comment:<id>`, are easy to guess). `delete` removes a clientToken's, a sessionId's or a text's
suggestions (a user's erasure request, tokens or none); `purge` drops those older than N days.
Suggestions without a clientToken are each kept. A table written before owners were kept is
migrated when the store is opened (its suggestions owned by '').
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from jaxtpu.core.errors import UserError

TABLE = "jaxtpu_feedback"
_OLD_COLUMNS = (
    "client_token, community_id, session_id, text, attribute_scores, languages, "
    "model_version, received"
)
_COLUMNS = _OLD_COLUMNS + ", owner, moderator"
_VALUES = "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_UPSERT = (
    f"INSERT INTO {TABLE} ({_COLUMNS}) {_VALUES} "
    "ON CONFLICT (owner, client_token) DO UPDATE SET community_id = excluded.community_id, "
    "session_id = excluded.session_id, text = excluded.text, "
    "attribute_scores = excluded.attribute_scores, languages = excluded.languages, "
    "model_version = excluded.model_version, received = excluded.received, "
    "moderator = excluded.moderator"
)


@dataclass(frozen=True)
class Record:
    """One stored suggestion."""

    text: str
    attribute_scores: dict[str, Any]
    community_id: str | None
    client_token: str | None
    session_id: str | None
    languages: tuple[str, ...]
    model_version: str
    received: float  # UTC seconds since the epoch
    owner: str = ""  # the name of the key that sent it; '' on a server without keys
    moderator: bool = False  # that key is a moderators'

    def row(self) -> tuple[Any, ...]:
        return (
            self.client_token,
            self.community_id,
            self.session_id,
            self.text,
            json.dumps(self.attribute_scores, sort_keys=True),
            json.dumps(list(self.languages)),
            self.model_version,
            self.received,
            self.owner,
            int(self.moderator),
        )


class StoreError(Exception):
    """The store did not answer or refused a write (its own message)."""


class Store:
    """A feedback store: SQLite or PostgreSQL behind one interface. Calls are serialized (one
    connection, a lock); a connection that failed is opened again on the next call."""

    def __init__(self, url: str, create: bool = True) -> None:
        self.url = url
        self.kind, self._target = _parse(url)
        if self.kind == "sqlite" and not create and not Path(self._target).is_file():
            raise UserError(f"--feedback {url}: no such file")
        self._conn: Any = None
        self._lock = threading.Lock()
        self._call(lambda conn: None)  # opens it, makes the table: a bad URL is said at start

    def describe(self) -> str:
        if self.kind == "sqlite":
            return f"SQLite file {self._target}"
        parsed = urlparse(self.url)
        where = f"{parsed.hostname or 'localhost'}:{parsed.port or 5432}{parsed.path}"
        return f"PostgreSQL {where}"

    def _connect(self) -> Any:
        if self.kind == "sqlite":
            conn = sqlite3.connect(self._target, timeout=30, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            ident = "INTEGER PRIMARY KEY AUTOINCREMENT"
            real = "REAL"
        else:
            import psycopg

            conn = psycopg.connect(self._target, connect_timeout=10)
            ident = "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
            real = "DOUBLE PRECISION"
        create = (
            f"CREATE TABLE IF NOT EXISTS {TABLE} (id {ident}, client_token TEXT, "
            "community_id TEXT, session_id TEXT, text TEXT NOT NULL, attribute_scores TEXT "
            f"NOT NULL, languages TEXT NOT NULL, model_version TEXT NOT NULL, received {real} "
            "NOT NULL, owner TEXT NOT NULL DEFAULT '', moderator INTEGER NOT NULL DEFAULT 0)"
        )
        _migrate(conn, self.kind, create)
        _sql(conn, self.kind, create)
        for name, columns, unique in (
            ("received", "received", ""),
            ("token", "owner, client_token", "UNIQUE "),
        ):
            _sql(
                conn,
                self.kind,
                f"CREATE {unique}INDEX IF NOT EXISTS {TABLE}_{name} ON {TABLE} ({columns})",
            )
        conn.commit()
        return conn

    def _call(self, work: Any) -> Any:
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = self._connect()
                out = work(self._conn)
                self._conn.commit()
                return out
            except Exception as e:  # noqa: BLE001 - the driver's errors, said in one line
                if self._conn is not None:
                    try:
                        self._conn.close()
                    finally:
                        self._conn = None
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise StoreError(f"feedback store {self.describe()}: {first}") from None

    def put(self, record: Record) -> None:
        """Keeps `record`, replacing the one of the same clientToken."""
        if record.client_token is None:
            sql = f"INSERT INTO {TABLE} ({_COLUMNS}) {_VALUES}"
        else:
            sql = _UPSERT
        self._call(lambda conn: _sql(conn, self.kind, sql, record.row()))

    def delete(
        self,
        client_token: str | None = None,
        session_id: str | None = None,
        text: str | None = None,
        owner: str | None = None,
    ) -> int:
        """Removes the suggestions of a clientToken, a sessionId or a text (exactly one of
        them; of one key's `owner` name when given); how many were removed."""
        given = {"client_token": client_token, "session_id": session_id, "text": text}
        chosen = {k: v for k, v in given.items() if v is not None}
        if len(chosen) != 1:
            raise ValueError("delete: exactly one of client_token, session_id, text")
        if owner is not None:
            chosen["owner"] = owner
        where = " AND ".join(f"{k} = ?" for k in chosen)
        sql = f"DELETE FROM {TABLE} WHERE {where}"
        params = tuple(chosen.values())
        return self._call(lambda conn: _sql(conn, self.kind, sql, params).rowcount)

    def purge(self, days: float, now: float | None = None) -> int:
        """Drops the suggestions received more than `days` days ago; how many."""
        cutoff = (time.time() if now is None else now) - days * 86400
        sql = f"DELETE FROM {TABLE} WHERE received < ?"
        return self._call(lambda conn: _sql(conn, self.kind, sql, (cutoff,)).rowcount)

    def records(self, community: str | None = None, since: float | None = None) -> list[Record]:
        """The stored suggestions (of one community, received at or after `since`), oldest
        first."""
        where, params = [], []
        if community is not None:
            where.append("community_id = ?")
            params.append(community)
        if since is not None:
            where.append("received >= ?")
            params.append(since)
        sql = f"SELECT {_COLUMNS} FROM {TABLE}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY received, id"
        rows = self._call(lambda conn: _sql(conn, self.kind, sql, tuple(params)).fetchall())
        return [_record(r) for r in rows]

    def communities(self) -> list[str]:
        sql = f"SELECT DISTINCT community_id FROM {TABLE} WHERE community_id IS NOT NULL"
        rows = self._call(lambda conn: _sql(conn, self.kind, sql).fetchall())
        return sorted(r[0] for r in rows)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _record(row: Sequence[Any]) -> Record:
    token, community, session, text, scores, languages, version, received, owner, mod = row
    return Record(
        text,
        json.loads(scores),
        community,
        token,
        session,
        tuple(json.loads(languages)),
        version,
        float(received),
        owner,
        bool(mod),
    )


def _columns(conn: Any, kind: str) -> list[str]:
    """The columns of the feedback table ([]: there is none yet)."""
    if kind == "sqlite":
        return [r[1] for r in conn.execute(f"PRAGMA table_info({TABLE})").fetchall()]
    sql = (
        "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
        "AND table_schema = current_schema()"
    )
    return [r[0] for r in _sql(conn, kind, sql, (TABLE,)).fetchall()]


def _migrate(conn: Any, kind: str, create: str) -> None:
    """A table written before suggestions had owners (its clientToken unique across the
    store) made again as `create` says, its suggestions kept in order, owned by '' (a server
    without keys); in one transaction, locked, so two workers opening it at once migrate once."""
    columns = _columns(conn, kind)
    if not columns or "owner" in columns:
        return
    if kind == "sqlite":
        conn.execute("BEGIN IMMEDIATE")
    else:
        _sql(conn, kind, f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
    if "owner" in _columns(conn, kind):  # another worker migrated it while this one waited
        conn.commit()
        return
    old = f"{TABLE}_before_owners"
    for sql in (
        f"ALTER TABLE {TABLE} RENAME TO {old}",
        f"DROP INDEX IF EXISTS {TABLE}_received",
        create,
        f"INSERT INTO {TABLE} ({_OLD_COLUMNS}) SELECT {_OLD_COLUMNS} FROM {old} ORDER BY id",
        f"DROP TABLE {old}",
    ):
        _sql(conn, kind, sql)
    conn.commit()


def _sql(conn: Any, kind: str, sql: str, params: Sequence[Any] = ()) -> Any:
    """Runs `sql` written with `?` placeholders (psycopg's are `%s`)."""
    if kind == "postgresql":
        return conn.execute(sql.replace("?", "%s"), params)
    return conn.execute(sql, params)


def _parse(url: str) -> tuple[str, str]:
    """('sqlite', file path) or ('postgresql', the URL), or one line saying why not."""
    scheme = urlparse(url).scheme.lower()
    if scheme in ("postgresql", "postgres"):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise UserError(
                f"--feedback {url}: PostgreSQL needs psycopg (pip install 'jaxtpu[serve]')"
            ) from None
        return "postgresql", url
    if scheme == "sqlite":  # SQLAlchemy's form: sqlite:///relative.db, sqlite:////abs.db
        if not url.startswith("sqlite:///"):
            raise UserError(f"--feedback {url}: write sqlite:///PATH (or the PATH alone)")
        path = url[len("sqlite:///") :]
    elif scheme and len(scheme) > 1:  # a drive letter is not a scheme
        raise UserError(
            f"--feedback {url}: not a store jaxtpu knows; give an SQLite file (PATH or "
            "sqlite:///PATH) or postgresql://USER@HOST:PORT/DATABASE"
        )
    else:
        path = url
    target = Path(path)
    if target.is_dir():
        raise UserError(f"--feedback {url}: is a directory; give an SQLite file in it")
    if not target.parent.is_dir():
        raise UserError(f"--feedback {url}: no directory {target.parent}")
    return "sqlite", str(target)
