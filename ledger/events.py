"""The events table: append-only, closed type set, read after a cursor, data_version polling."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import bindparam, select

from legion.ledger.base import LedgerBase
from legion.ledger.constants import EVENT_TYPE_SET
from legion.ledger.errors import LedgerError, UnknownEventTypeError
from legion.ledger.schema import events

APPEND_EVENT_SQL = "INSERT INTO events (node_id, type, data, ts) VALUES (?, ?, ?, ?)"


_EVENTS_AFTER = select(events).where(events.c.id > bindparam("cursor")).order_by(events.c.id).limit(bindparam("limit"))
_EVENTS_AFTER_NODE = (
    select(events)
    .where(events.c.id > bindparam("cursor"), events.c.node_id == bindparam("node_id"))
    .order_by(events.c.id)
    .limit(bindparam("limit"))
)


@dataclass(frozen=True, slots=True)
class Event:
    """One stored event; `id` is the cursor."""

    id: int
    node_id: str | None
    type: str
    data: dict[str, Any]
    ts: int


def encode_event_data(event_type: str, data: dict[str, Any] | None) -> str | None:
    """Check the type against the closed set and serialise data (a JSON object or None)."""
    if event_type not in EVENT_TYPE_SET:
        raise UnknownEventTypeError(event_type)
    if data is None:
        return None
    if not isinstance(data, dict):
        raise LedgerError(f"event {event_type!r}: data must be a dict or None, got {type(data).__name__}")
    try:
        return orjson.dumps(data).decode()
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise LedgerError(f"event {event_type!r}: data is not JSON-serialisable: {exc}") from exc


def decode_event(row: dict[str, Any]) -> Event:
    """Map a stored row; an unknown stored type raises loudly (docs/spec-conformance.md §10 items 1–2)."""
    if row["type"] not in EVENT_TYPE_SET:
        raise UnknownEventTypeError(row["type"], event_id=row["id"])
    raw = row["data"]
    try:
        data = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise LedgerError(f"event {row['id']}: stored data is not JSON ({exc}); the row is corrupt") from exc
    return Event(id=row["id"], node_id=row["node_id"], type=row["type"], data=data, ts=row["ts"])


class EventsMixin(LedgerBase):
    """Tree-level semantic events."""

    def append_event(self, node_id: str | None, type: str, data: dict[str, Any] | None = None) -> int:
        """Append one event; returns its id (the cursor)."""
        encoded = encode_event_data(type, data)
        with self._db.write() as raw:
            cur = raw.execute(APPEND_EVENT_SQL, (node_id, type, encoded, self._now()))
        return int(cur.lastrowid or 0)

    def events_after(self, cursor: int, limit: int = 1000, *, node_id: str | None = None) -> list[Event]:
        """Events with id > cursor, oldest first."""
        if limit <= 0:
            raise LedgerError(f"events_after: limit must be positive, got {limit}")
        params = {"cursor": cursor, "limit": limit, "node_id": node_id}
        with self._db.read():
            if node_id is None:
                rows = self._db.select(_EVENTS_AFTER, params, key="events_after")
            else:
                rows = self._db.select(_EVENTS_AFTER_NODE, params, key="events_after_node")
        return [decode_event(row) for row in rows]

    def last_event_id(self) -> int:
        """The newest event id (0 when empty): a starting cursor for 'only new events'."""
        with self._db.read() as raw:
            return int(raw.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0])

    def data_version(self) -> int:
        """PRAGMA data_version: changes when another connection commits (cheap cross-process poll)."""
        self._db.check_usable()
        return int(self._db.raw.execute("PRAGMA data_version").fetchone()[0])
