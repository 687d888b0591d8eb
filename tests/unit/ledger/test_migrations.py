"""Schema v5 via user_version: from empty, hand-built v1, v2 and v3; idempotent; newer refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from legion.ledger import SCHEMA_VERSION, SchemaVersionError, open_ledger
from legion.ledger.schema import ALL_INDEXES, ALL_TABLES, FLEET_TABLES, NAMED_INDEXES

pytestmark = pytest.mark.timeout(30)

# The historic pi-legion v1 DDL: kind defaulted to 'pi', and idx_messages_rate was missing
# (docs/spec-conformance.md §10 items 3–4: it was added without a version bump, so old v1 ledgers never had it).
HISTORIC_V1 = """
CREATE TABLE nodes (id TEXT PRIMARY KEY, parent_id TEXT REFERENCES nodes(id), name TEXT NOT NULL,
  role TEXT NOT NULL, kind TEXT NOT NULL DEFAULT 'pi', depth INTEGER NOT NULL, run_id TEXT, session_file TEXT,
  worktree_path TEXT, model TEXT, team TEXT, status TEXT NOT NULL, phase TEXT, phase_since INTEGER,
  rework_count INTEGER NOT NULL DEFAULT 0, contract_path TEXT, task_summary TEXT,
  created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL);
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, node_id TEXT, type TEXT NOT NULL, data TEXT, ts INTEGER NOT NULL);
CREATE TABLE usage (node_id TEXT PRIMARY KEY, tokens_in INTEGER, tokens_out INTEGER, cost_usd REAL, updated_at INTEGER);
CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, from_node TEXT, to_node TEXT, subject TEXT,
  body TEXT NOT NULL, kind TEXT, urgency TEXT NOT NULL DEFAULT 'info', delivered INTEGER NOT NULL DEFAULT 0,
  delivered_at INTEGER, created_at INTEGER NOT NULL);
CREATE INDEX idx_nodes_parent ON nodes(parent_id);
CREATE INDEX idx_nodes_status ON nodes(status);
CREATE INDEX idx_events_node ON events(node_id);
CREATE INDEX idx_events_type_ts ON events(type, ts);
CREATE INDEX idx_messages_inbox ON messages(to_node, delivered);
INSERT INTO nodes VALUES ('root', NULL, 'root', 'root', 'pi', 0, 'r1', NULL, NULL, NULL, NULL, 'running',
  NULL, NULL, 0, NULL, NULL, 1, 1);
INSERT INTO events (node_id, type, data, ts) VALUES ('root', 'node_launched', '{}', 1);
INSERT INTO messages (from_node, to_node, subject, body, delivered, created_at) VALUES ('root', 'root', 's', 'b', 1, 1);
"""


def _schema(path: Path) -> tuple[set[str], set[str], int]:
    con = sqlite3.connect(path)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        indexes = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='index' AND name LIKE 'idx_%'")}
        version = con.execute("PRAGMA user_version").fetchone()[0]
    finally:
        con.close()
    return tables, indexes, version


def _hand_built(path: Path, version: int, *, with_rate_index: bool) -> None:
    con = sqlite3.connect(path)
    con.executescript(HISTORIC_V1)
    if with_rate_index:
        con.execute("CREATE INDEX idx_messages_rate ON messages(from_node, created_at)")
    con.execute(f"PRAGMA user_version={version}")
    con.commit()
    con.close()


def test_empty_file_reaches_v5_with_every_table_and_index(db_path: Path) -> None:
    led = open_ledger(db_path)
    assert led.migrated_from == 0
    led.close()
    tables, indexes, version = _schema(db_path)
    assert version == SCHEMA_VERSION == 5
    assert set(ALL_TABLES) | set(FLEET_TABLES) <= tables
    assert set(ALL_INDEXES) == indexes
    assert set(NAMED_INDEXES) == {
        "idx_nodes_parent", "idx_nodes_status", "idx_events_node",
        "idx_events_type_ts", "idx_messages_inbox", "idx_messages_rate",
    }


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("with_rate_index", [False, True])
def test_hand_built_old_ledgers_reach_v4_with_every_index(db_path: Path, version: int, with_rate_index: bool) -> None:
    _hand_built(db_path, version, with_rate_index=with_rate_index)
    led = open_ledger(db_path)
    try:
        assert led.migrated_from == version
        assert led.schema_version() == 5
        # Data untouched, old delivered=1 reads as ACCEPTED (no backfill).
        assert led.get_node("root")["kind"] == "pi"
        assert [e.type for e in led.events_after(0)] == ["node_launched"]
        assert led._db.raw.execute("SELECT delivered FROM messages").fetchone()[0] == 1
    finally:
        led.close()
    tables, indexes, _ = _schema(db_path)
    assert set(ALL_TABLES) | set(FLEET_TABLES) <= tables
    assert set(ALL_INDEXES) == indexes


def test_rerun_is_a_no_op(db_path: Path) -> None:
    open_ledger(db_path).close()
    con = sqlite3.connect(db_path)
    before = con.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()
    con.close()
    led = open_ledger(db_path)
    assert led.migrated_from == 5
    led.close()
    con = sqlite3.connect(db_path)
    assert con.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall() == before
    con.close()


def test_no_index_is_created_on_open_outside_a_migration(db_path: Path) -> None:
    # A v3 database whose index was dropped stays without it: opening never creates indexes.
    open_ledger(db_path).close()
    con = sqlite3.connect(db_path)
    con.execute("DROP INDEX idx_messages_rate")
    con.commit()
    con.close()
    open_ledger(db_path).close()
    assert "idx_messages_rate" not in _schema(db_path)[1]


def test_newer_database_is_refused(db_path: Path) -> None:
    con = sqlite3.connect(db_path)
    con.execute("PRAGMA user_version=6")
    con.commit()
    con.close()
    with pytest.raises(SchemaVersionError) as info:
        open_ledger(db_path)
    assert info.value.found == 6 and info.value.supported == 5
    assert "newer legion" in str(info.value)
    # Refused without touching it.
    assert _schema(db_path) == (set(), set(), 6)


def test_failed_step_leaves_old_version(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from legion.ledger import migrations

    _hand_built(db_path, 2, with_rate_index=False)

    def boom(conn: object) -> None:
        migrations._run_all(conn, ("CREATE TABLE artifacts (id INTEGER)",))  # type: ignore[arg-type]
        raise RuntimeError("crash mid-migration")

    monkeypatch.setitem(migrations.MIGRATIONS, 2, boom)
    with pytest.raises(RuntimeError):
        open_ledger(db_path)
    tables, indexes, version = _schema(db_path)
    assert version == 2 and "artifacts" not in tables and "idx_messages_rate" not in indexes
    monkeypatch.undo()
    open_ledger(db_path).close()
    assert _schema(db_path)[2] == 5


def test_a_v3_ledger_keeps_its_usage_and_gains_the_unknown_cost_column(db_path: Path) -> None:
    """v3 -> v4: the usage rows stay as they were; their unknown-price tokens read 0 (what v3 could say)."""
    _hand_built(db_path, 2, with_rate_index=True)
    con = sqlite3.connect(db_path)
    con.execute("INSERT INTO usage VALUES ('root', 120, 30, 0.25, 1)")
    con.commit()
    con.close()
    from legion.ledger import migrations

    led = open_ledger(db_path)  # v2 -> v3 -> v4 in one migrate
    try:
        assert migrations.user_version(led._db) == 5
        row = led.get_usage("root")
        assert row is not None
        assert (row["tokens_in"], row["tokens_out"], row["cost_usd"], row["unknown_cost_tokens"]) == (120, 30, 0.25, 0)
        led.upsert_usage("root", 200, 40, 0.25, 60)
        assert led.usage_totals()["unknown_cost_tokens"] == 60
    finally:
        led.close()


def test_the_v4_step_alone_from_a_v3_file(db_path: Path) -> None:
    from legion.ledger import migrations

    led = open_ledger(db_path)
    led.close()
    con = sqlite3.connect(db_path)  # make it a v3 file: the usage table as v3 created it
    con.executescript("DROP TABLE usage; CREATE TABLE usage (node_id TEXT PRIMARY KEY REFERENCES nodes(id), "
                      "tokens_in INTEGER NOT NULL DEFAULT 0, tokens_out INTEGER NOT NULL DEFAULT 0, "
                      "cost_usd REAL NOT NULL DEFAULT 0, updated_at INTEGER NOT NULL); PRAGMA user_version=3;")
    con.close()
    led = open_ledger(db_path)
    try:
        assert led.migrated_from == 3 and migrations.user_version(led._db) == 5
        cols = [r[1] for r in led._db.raw.execute("PRAGMA table_info(usage)")]
        assert cols[-1] == "unknown_cost_tokens"
    finally:
        led.close()


def test_a_v4_file_whose_version_was_set_back_migrates_again(db_path: Path) -> None:
    open_ledger(db_path).close()
    con = sqlite3.connect(db_path)
    con.execute("PRAGMA user_version=3")  # e.g. a hand edit: the column is there already
    con.close()
    led = open_ledger(db_path)
    try:
        assert led.migrated_from == 3 and led.schema_version() == 5
    finally:
        led.close()
