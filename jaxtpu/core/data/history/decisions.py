"""A history's moderators' decisions joining the community loop (framework-free): kept in the
feedback store (`jaxtpu serve --feedback`) as the suggestions Coral Talk would have sent, so
`jaxtpu feedback export` and `train --init-from` read them as they read live ones."""

from __future__ import annotations

import datetime as dt
import time

from jaxtpu.core.data.history.rows import History
from jaxtpu.core.errors import UserError
from jaxtpu.core.serving.feedback import Record, Store, StoreError

OWNER = "history-import"  # the owner of imported decisions: the operator, a moderator


def open_store(url: str) -> Store:
    """The feedback store at `url`, or one line saying why not."""
    try:
        return Store(url)
    except StoreError as e:
        raise UserError(str(e)) from None


def keep_decisions(store: Store, history: History) -> int:
    """Each decision as Coral's suggestion (DELETED or APPROVED, clientToken comment:<id>, its
    community, received when it was made), owned by `OWNER`, a moderator; how many were kept.

    Raises:
      UserError: the store stopped answering (how many were kept before it said).
    """
    kept = 0
    for r in history.rows:
        if r.decision is None:
            continue
        name = "DELETED" if r.decision else "APPROVED"
        try:
            when = dt.datetime.fromisoformat(r.time).timestamp() if r.time else time.time()
        except ValueError:
            when = time.time()
        record = Record(r.text, {name: {"summaryScore": 1.0}}, r.community or None,
                        f"comment:{r.id}", None, (), OWNER, when, OWNER, True)  # fmt: skip
        try:
            store.put(record)
        except StoreError as e:
            raise UserError(f"{e} ({kept} decision(s) kept before it stopped answering)") from None
        kept += 1
    return kept
