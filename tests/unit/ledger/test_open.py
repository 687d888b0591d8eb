"""Open preconditions: WAL asserted from the pragma's returned value, :memory: exempt, pragmas set."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from legion.ledger import SCHEMA_VERSION, JournalModeError, LedgerError, open_ledger
from tests.support import wait_until

pytestmark = pytest.mark.timeout(30)


def test_file_database_is_wal_with_pragmas(db_path: Path) -> None:
    led = open_ledger(db_path)
    try:
        raw = led._db.raw
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
        assert raw.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        # synchronous untouched: SQLite's default FULL (2), see engine.py for why.
        assert raw.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert raw.isolation_level is None
        assert led.file == str(db_path.resolve())
    finally:
        led.close()
    # The file itself is persistently in WAL mode.
    con = sqlite3.connect(db_path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()


def test_memory_database_is_exempt_via_database_list() -> None:
    led = open_ledger(":memory:")
    try:
        assert led._db.raw.execute("PRAGMA journal_mode").fetchone()[0] == "memory"
        assert led.file == ""
        assert led.schema_version() == SCHEMA_VERSION
    finally:
        led.close()


def test_memory_uri_is_exempt_not_by_path_string() -> None:
    # Not the literal ":memory:" path: the exemption comes from PRAGMA database_list.
    led = open_ledger("file:ledger-mem?mode=memory")
    try:
        assert led.file == ""
    finally:
        led.close()


def test_non_wal_file_database_is_refused(tmp_path: Path) -> None:
    # unix-none: a real SQLite VFS without shared-memory locking (like a network/FUSE mount),
    # on which PRAGMA journal_mode=WAL silently returns the old mode.
    path = tmp_path / "legion.db"
    sqlite3.connect(path).close()
    with pytest.raises(JournalModeError) as info:
        open_ledger(f"file:{path}?vfs=unix-none")
    assert info.value.mode == "delete"
    assert "not 'wal'" in str(info.value)
    # Nothing was created: the database stayed a rollback-journal file without tables.
    con = sqlite3.connect(path)
    assert con.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
    con.close()


def test_unopenable_path_is_a_ledger_error(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match=r"cannot open legion\.db"):
        open_ledger(tmp_path / "missing-dir" / "legion.db")


def test_close_is_idempotent(db_path: Path) -> None:
    led = open_ledger(db_path)
    led.close()
    led.close()


def test_closed_ledger_refuses_use(db_path: Path) -> None:
    led = open_ledger(db_path)
    led.close()
    with pytest.raises(LedgerError, match="closed"):
        led.append_event(None, "tree_finalized")
    with pytest.raises(LedgerError, match="closed"):
        led.data_version()


def test_sqlalchemy_s_engine_is_built_only_when_a_query_or_a_migration_needs_it(db_path: Path) -> None:
    """A process that only runs the pre-written writes (a worker's ledger writer) never builds the engine; a Core
    query's compile builds it without connecting, and its Core connection (whose first connect ends with a rollback
    of the DBAPI connection) is never made inside a raw transaction."""
    open_ledger(db_path).close()  # created and migrated
    led = open_ledger(db_path)
    try:
        led.insert_node(id="w1", name="w1", role="worker", depth=1)
        led.heartbeat("w1")
        led.upsert_usage("w1", 10, 2, 0.01)
        assert led._db._engine is None and led._db._conn is None
        assert led.get_node("w1")["status"] == "starting"  # compiled: the engine, still no Core connection
        assert led._db._engine is not None and led._db._conn is None
        with led.transaction():
            led.heartbeat("w1")
            with pytest.raises(LedgerError, match="inside a raw transaction"):
                led._db.conn  # noqa: B018
            led.upsert_usage("w1", 20, 4, 0.02)  # the transaction went on
        assert led.get_usage("w1")["tokens_in"] == 20
    finally:
        led.close()


def test_core_write_transactions_begin_immediate(db_path: Path) -> None:
    led = open_ledger(db_path)
    other = sqlite3.connect(db_path, timeout=0, isolation_level=None)
    try:
        with led._db.core_write() as conn:
            conn.exec_driver_sql("SELECT 1")  # no write yet, but BEGIN IMMEDIATE already holds the lock
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
        other.execute("BEGIN IMMEDIATE")
        other.execute("COMMIT")
    finally:
        other.close()
        led.close()


def test_reads_never_take_the_write_lock(db_path: Path) -> None:
    led = open_ledger(db_path)
    other = sqlite3.connect(db_path, timeout=0, isolation_level=None)
    try:
        with led._db.read():
            other.execute("BEGIN IMMEDIATE")  # a writer is not blocked by an open read snapshot
            other.execute("COMMIT")
    finally:
        other.close()
        led.close()


def test_checkpoints_run_in_the_background_and_keep_the_wal_small(db_path: Path) -> None:
    led = open_ledger(db_path)
    try:
        db = led._db
        assert db.checkpointer is not None
        # The process's stagger offset may sit anywhere in the period; start this test's period at 0
        # before its first counted commit, or a pid near the period's end asks for one at insert_node.
        db.checkpoint_every, db._commits = 10, 0
        assert db.checkpointer._thread is None  # opening asks for no checkpoint
        led.insert_node(id="n", name="n", role="w", depth=0)
        for _ in range(8):
            led.heartbeat("n")
        assert db._commits == 9
        assert db.checkpointer.runs == 0 and db.checkpointer._thread is None  # lazily started
        with led.transaction():  # nested writes count as one commit
            led.heartbeat("n")
            led.append_event("n", "node_launched")
        wait_until(lambda: db.checkpointer.runs >= 1, 10, "the first background checkpoint", interval=0.01)
        assert db.checkpointer.runs == 1 and db.checkpointer.errors == 0
        busy, log, done = db.checkpointer.last or (1, 0, -1)
        assert busy == 0 and log == done > 0  # every frame backfilled, on the other connection
        thread = db.checkpointer._thread
    finally:
        led.close()
    assert thread is not None and not thread.is_alive()  # close() stops it


def test_memory_ledger_has_no_checkpointer() -> None:
    led = open_ledger(":memory:")
    assert led._db.checkpointer is None
    led.close()


def test_checkpoint_seam_is_what_the_background_thread_runs(db_path: Path) -> None:
    """wal_stress times checkpoints by wrapping Checkpointer.checkpoint: the thread must call it."""
    led = open_ledger(db_path)
    try:
        led.insert_node(id="n", name="n", role="w", depth=0)
        cp = led._db.checkpointer
        assert cp is not None
        seen: list[tuple[int, int, int]] = []
        real = cp.checkpoint

        def spy(con: sqlite3.Connection) -> tuple[int, int, int]:
            seen.append(real(con))
            return seen[-1]

        cp.checkpoint = spy  # type: ignore[method-assign]
        cp.request()
        wait_until(lambda: cp.runs >= 1, 10, "the first background checkpoint", interval=0.01)
        assert cp.runs == 1 and seen == [cp.last] and seen[0][1] > 0
    finally:
        led.close()


def test_open_retries_a_lost_journal_mode_lock_race(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Several processes converting a rollback-journal ledger to WAL at once: SQLite answers the
    # losers SQLITE_BUSY without calling the busy handler. open_ledger retries within the busy timeout.
    from legion.ledger import ledger as ledger_module

    real, calls = ledger_module.Database, []

    def racy(path: str) -> object:
        calls.append(path)
        if len(calls) <= 2:
            try:
                raise sqlite3.OperationalError("database is locked")
            except sqlite3.OperationalError as exc:
                raise LedgerError(f"cannot open legion.db at {path!r}: {exc}") from exc
        return real(path)

    monkeypatch.setattr(ledger_module, "Database", racy)
    led = open_ledger(db_path)
    assert len(calls) == 3 and led.schema_version() == SCHEMA_VERSION
    led.close()

    def broken(path: str) -> object:
        calls.append(path)
        raise LedgerError("cannot open legion.db: unable to open database file")

    calls.clear()
    monkeypatch.setattr(ledger_module, "Database", broken)
    with pytest.raises(LedgerError, match="unable to open"):
        open_ledger(db_path)
    assert len(calls) == 1  # only the lock race is retried
