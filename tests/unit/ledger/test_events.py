"""The closed event set (sentinel), append/read after a cursor, unknown types, data_version."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from legion.ledger import EVENT_TYPES, Ledger, LedgerError, UnknownEventTypeError, open_ledger
from legion.ledger.sql import IntegrityViolation

from .conftest import RUN, foreign_write

pytestmark = pytest.mark.timeout(30)

# Sentinel (regressions 1 and 2): changing the closed set is a contract revision.
EXPECTED_EVENTS = (
    "node_launched", "node_settled", "node_failed", "node_retired", "node_resumed", "node_blocked",
    "node_abandoned", "node_handled", "phase_change", "phase_timeout", "mail_sent", "mail_delivered",
    "mail_bounced", "budget_refused", "orphan_detected", "tree_finalized",
)


def test_event_set_matches_sentinel() -> None:
    assert EVENT_TYPES == EXPECTED_EVENTS
    assert len(EVENT_TYPES) == 16 == len(set(EVENT_TYPES))


def test_every_type_round_trips(tree: Ledger) -> None:
    # docs/spec-conformance.md §10 items 1–2: everything the writer accepts the reader maps.
    ids = [tree.append_event("w1", t, {"i": i}) for i, t in enumerate(EVENT_TYPES)]
    assert ids == sorted(ids)
    got = tree.events_after(0)
    assert [e.type for e in got] == list(EVENT_TYPES)
    assert [e.data["i"] for e in got] == list(range(16))
    assert all(e.node_id == "w1" for e in got)


def test_cursor_and_limit(tree: Ledger) -> None:
    ids = [tree.append_event("w1", "node_launched") for _ in range(5)]
    assert [e.id for e in tree.events_after(ids[1])] == ids[2:]
    assert [e.id for e in tree.events_after(0, limit=2)] == ids[:2]
    assert tree.events_after(ids[-1]) == []
    assert tree.last_event_id() == ids[-1]
    assert tree.events_after(0)[0].data == {}
    tree.append_event("w2", "node_settled")
    assert [e.node_id for e in tree.events_after(ids[-1], node_id="w2")] == ["w2"]


def test_unknown_type_refused_on_write(tree: Ledger) -> None:
    with pytest.raises(UnknownEventTypeError, match="closed set"):
        tree.append_event("w1", "node_exploded")
    assert tree.events_after(0) == []


def test_unknown_stored_type_fails_loudly_on_read(tree: Ledger, target: Path | str) -> None:
    tree.append_event("w1", "node_launched")
    foreign_write(target, "INSERT INTO events (node_id, type, data, ts) VALUES ('w1', 'legacy_type', NULL, 1)",
                  f"INSERT INTO events (run, node_id, type, data, ts) VALUES ('{RUN}', 'w1', 'legacy_type', NULL, 1)")
    with pytest.raises(UnknownEventTypeError) as info:
        tree.events_after(0)
    assert info.value.event_id == 2 and info.value.event_type == "legacy_type"
    assert [e.type for e in tree.events_after(0, limit=1)] == ["node_launched"]


def test_bad_event_data(tree: Ledger) -> None:
    with pytest.raises(LedgerError, match="must be a dict"):
        tree.append_event("w1", "node_launched", ["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(LedgerError, match="JSON"):
        tree.append_event("w1", "node_launched", {"x": object()})


def test_event_for_unknown_node_is_refused(tree: Ledger) -> None:
    with pytest.raises((sqlite3.IntegrityError, IntegrityViolation)):
        tree.append_event("ghost", "node_launched")


def test_data_version_changes_on_foreign_commit(tree: Ledger, target: Path | str) -> None:
    other = open_ledger(target, run_id=RUN)
    try:
        before = other.data_version()
        assert other.data_version() == before
        tree.append_event("w1", "node_launched")
        assert other.data_version() != before
    finally:
        other.close()
