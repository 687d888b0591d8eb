"""docs/spec-conformance.md §10 item 48: prepared statements stay correct after DDL (pysqlite's per-connection cache is re-prepared)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from legion.ledger import Ledger

pytestmark = [pytest.mark.timeout(30), pytest.mark.sqlite_only]  # SQLite's own machinery


def test_cached_hot_statements_survive_foreign_ddl(tree: Ledger, db_path: Path) -> None:
    raw = tree._db.raw
    for _ in range(3):  # warm the cache with the hot statements
        with tree.transaction():
            tree.heartbeat("w1")
            tree.append_event("w1", "node_launched")
    assert len(raw.execute("SELECT * FROM nodes WHERE id = 'w1'").fetchone()) == 19
    other = sqlite3.connect(db_path)
    other.execute("ALTER TABLE nodes ADD COLUMN extra TEXT DEFAULT 'x'")
    other.execute("DROP INDEX idx_events_node")
    other.execute("CREATE INDEX idx_events_node ON events(node_id, ts)")
    other.commit()
    other.close()
    # The same cached statement text now sees the new column; hot writes still work.
    assert raw.execute("SELECT * FROM nodes WHERE id = 'w1'").fetchone()[-1] == "x"
    with tree.transaction():
        tree.heartbeat("w1")
        event_id = tree.append_event("w1", "node_settled")
    assert tree.events_after(event_id - 1)[0].type == "node_settled"
    assert tree.get_node("w1")["status"] == "starting"  # type: ignore[index]


def test_ddl_on_the_same_connection_invalidates(tree: Ledger) -> None:
    raw = tree._db.raw
    tree.send_mail("w1", "w2", "s", "b")
    with tree.transaction():
        raw.execute("CREATE TABLE scratch (a INTEGER)")
        raw.execute("INSERT INTO scratch VALUES (1)")
    assert raw.execute("SELECT * FROM scratch").fetchall() == [(1,)]
    with tree.transaction():
        raw.execute("DROP TABLE scratch")
        raw.execute("CREATE TABLE scratch (a INTEGER, b TEXT)")
        raw.execute("INSERT INTO scratch VALUES (2, 'two')")
    assert raw.execute("SELECT * FROM scratch").fetchall() == [(2, "two")]  # not the stale 1-column plan
    assert tree.send_mail("w1", "w2", "s", "b").id == 2


def test_compiled_query_cache_is_dropped_on_any_ddl(tree: Ledger, db_path: Path) -> None:
    db = tree._db
    assert tree.get_node("w1") is not None
    tree.events_after(0)
    assert {"get_node", "events_after"} <= set(db._compiled_cache)
    before = db.cache_invalidations
    other = sqlite3.connect(db_path)  # DDL from another process/connection
    other.execute("CREATE INDEX idx_scratch ON nodes(role)")
    other.commit()
    other.close()
    assert tree.get_node("w1")["role"] == "worker"  # type: ignore[index]
    assert db.cache_invalidations == before + 1
    assert set(db._compiled_cache) == {"get_node"}  # rebuilt lazily after the drop
    with tree.transaction():  # DDL on our own connection too
        db.raw.execute("DROP INDEX idx_scratch")
    assert [n["id"] for n in tree.subtree("root")] == ["root", "team", "w1", "w2"]
    assert db.cache_invalidations == before + 2
