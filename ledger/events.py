"""The events table: append-only, closed type set, read after a cursor, data_version polling (SQLite) and
NOTIFY legion_events (PostgreSQL) for readers that follow them (event_wait.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import Select, bindparam, select

from legion.ledger.base import LedgerBase
from legion.ledger.constants import EVENT_TYPE_SET
from legion.ledger.errors import LedgerError, UnknownEventTypeError
from legion.ledger.schema import Tables
from legion.ledger.sql import RUN, Sql

EVENTS_CHANNEL = "legion_events"  # PostgreSQL: every transaction that inserts a run's events notifies it (payload: the run)


def notifying(insert_pg: str) -> str:
    """A PostgreSQL event INSERT that also sends NOTIFY legion_events with the run as payload, in the same statement
    (one round trip) and so in the same transaction: listeners hear of it at COMMIT and never of a rollback;
    PostgreSQL folds a transaction's identical notifications into one. Its one column is the new event's id."""
    return (f"WITH ins AS ({insert_pg} RETURNING id) "
            f"SELECT ins.id FROM ins, pg_notify('{EVENTS_CHANNEL}', {RUN}) AS notified")


APPEND_EVENT_SQL = Sql(
    "INSERT INTO events (node_id, type, data, ts) VALUES (?, ?, ?, ?)",
    notifying(f"INSERT INTO events (run, node_id, type, data, ts) VALUES ({RUN}, %s, %s, %s, %s)"),
    returns_id=True,
)
_LAST_EVENT_SQL = Sql(
    "SELECT COALESCE(MAX(id), 0) FROM events",
    f"SELECT COALESCE(MAX(id), 0) FROM events WHERE run = {RUN}",
)


def _events_after(t: Tables) -> Select[Any]:
    return (
        select(*t.cols(t.events))
        .where(*t.scope(t.events), t.events.c.id > bindparam("cursor"))
        .order_by(t.events.c.id)
        .limit(bindparam("limit"))
    )


def _events_after_node(t: Tables) -> Select[Any]:
    events = t.events
    return (
        select(*t.cols(events))
        .where(*t.scope(events), events.c.id > bindparam("cursor"), events.c.node_id == bindparam("node_id"))
        .order_by(events.c.id)
        .limit(bindparam("limit"))
    )

_DATA_VERSION_SQL = Sql("PRAGMA data_version", "SELECT hashtextextended(pg_current_snapshot()::text, 0)")


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
                rows = self._db.select(_events_after, params, key="events_after")
            else:
                rows = self._db.select(_events_after_node, params, key="events_after_node")
        return [decode_event(row) for row in rows]

    def last_event_id(self) -> int:
        """The newest event id (0 when empty): a starting cursor for 'only new events'."""
        with self._db.read() as raw:
            return int(raw.execute(_LAST_EVENT_SQL).fetchone()[0])

    def data_version(self) -> int:
        """A number that changes when another connection commits (a cheap poll before reading events).

        SQLite: PRAGMA data_version. PostgreSQL: a hash of the server's transaction snapshot, which changes
        whenever any write transaction on the server begins or ends: a hint that may also move for another
        run's writes (then the reader finds no new event), never one that misses a commit."""
        self._db.check_usable()
        return int(self._db.raw.execute(_DATA_VERSION_SQL).fetchone()[0])
