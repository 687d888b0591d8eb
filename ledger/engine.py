"""Opening legion.db: the DBAPI connection, the open preconditions, and the transaction helpers. SQLAlchemy's engine
is built over that one connection on first use (a Core query's compile, a migration), so a process that only runs
the pre-written writes, such as a worker's ledger writer, never builds it.

Open preconditions (docs/spec-conformance.md §4.1, docs/architecture.md §5), applied on every new DBAPI connection:
`isolation_level=None` (pysqlite never opens transactions behind our back), `busy_timeout=5000`,
`PRAGMA journal_mode=WAL` whose *returned* value must be `wal` for a file database (a
`:memory:`/temporary database is exempt, recognised by an empty `file` in `PRAGMA database_list`,
never by the path string), and `foreign_keys=ON`.

`synchronous` is deliberately left at SQLite's default (FULL): in WAL mode FULL syncs the WAL on
every commit, so a power loss loses at most the transaction in flight. NORMAL would widen that
window to everything since the last checkpoint (unbounded with long-lived readers), and the
ledger's write rate (a few tx/s per run) makes FULL's fsync cost irrelevant (docs/spec-conformance.md §4.1).

Transactions: every write is `BEGIN IMMEDIATE` behind the cross-process `WriteGate` (fairness, see
writegate.py). Core transactions (migrations) get `BEGIN IMMEDIATE` from a begin event; reads are
Core queries compiled once per call and run on the raw connection inside a deferred `BEGIN`, so
readers never take the write lock. Hot writes run pre-written SQL on the raw DBAPI connection (no per-transaction SQLAlchemy overhead); pysqlite's
own per-connection statement cache (64 entries, docs/spec-conformance.md §8.2) keeps them prepared, and SQLite
re-prepares any cached statement whose schema changed. Frequent reads use a small per-connection
cache of compiled Core statements (at most 64), dropped whenever PRAGMA schema_version moves, i.e.
after any DDL by any connection (regression 48; both caches are pinned by tests).

Checkpoints: `wal_autocheckpoint` stays at SQLite's default (1000 pages). It runs inside the COMMIT
of the writer that crosses it — i.e. while that writer still holds the write gate, so every queued
writer waits for the copy and its fsyncs. To keep that off the hot path, every
CHECKPOINT_EVERY_COMMITS commits (offsets spread over the period by `stagger`) a connection asks its background
Checkpointer (checkpointer.py) for a PASSIVE checkpoint on a separate connection, so in normal
operation the WAL is backfilled and restarted well before 1000 pages and no transaction pays for
it; the default autocheckpoint remains the safety net under saturation. Reads never hold a
snapshot longer than one call, so nothing pins the WAL.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.elements import ClauseElement

from legion.ledger.checkpointer import Checkpointer, stagger
from legion.ledger.constants import BUSY_TIMEOUT_MS, CHECKPOINT_EVERY_COMMITS, STATEMENT_CACHE_SIZE
from legion.ledger.errors import JournalModeError, LedgerError
from legion.ledger.schema import SQLITE_TABLES, Tables
from legion.ledger.writegate import NullGate, WriteGate


def is_memory_path(path: str | Path) -> bool:
    """Only a guess used to pick the URL; the WAL exemption itself uses PRAGMA database_list."""
    return str(path) in (":memory:", "")


def _create_private(path: Path) -> None:
    """Create a new ledger file 0600: SQLite gives its -wal and -shm files the database file's mode, so the
    whole ledger stays private (docs/spec-conformance.md, "Modes"). An existing file keeps its mode; a
    missing folder is left to SQLite's own error."""
    with suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))


def configure_connection(raw: sqlite3.Connection) -> str:
    """Apply the open preconditions to one DBAPI connection; returns the effective journal mode."""
    raw.isolation_level = None
    raw.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    mode = str(raw.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
    raw.execute("PRAGMA foreign_keys=ON")
    return mode


def main_file(raw: sqlite3.Connection) -> str:
    """The file behind the `main` schema ('' for :memory: and temporary databases)."""
    for _seq, name, file in raw.execute("PRAGMA database_list").fetchall():
        if name == "main":
            return str(file or "")
    return ""


def assert_wal(raw: sqlite3.Connection, mode: str, shown_path: str) -> None:
    """Raise JournalModeError unless WAL is in effect or the database is not a file."""
    if mode != "wal" and main_file(raw) != "":
        raise JournalModeError(shown_path, mode)


def _connect(path: str | Path) -> sqlite3.Connection:
    """The DBAPI connection, with the open preconditions applied (a new file is created 0600)."""
    text = str(path)
    if text.startswith("file:"):  # a SQLite URI (e.g. file:/x/legion.db?vfs=unix-none)
        target, uri = text, True
    elif is_memory_path(text):
        target, uri = ":memory:", False
    else:
        _create_private(Path(text))
        target, uri = str(Path(text).resolve()), False
    raw = sqlite3.connect(target, uri=uri, check_same_thread=False, cached_statements=STATEMENT_CACHE_SIZE,
                          timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    try:
        assert_wal(raw, configure_connection(raw), text)
    except BaseException:
        raw.close()
        raise
    return raw


def _engine_over(raw: sqlite3.Connection) -> Engine:
    """An engine whose one connection is `raw` (already configured); Core transactions begin IMMEDIATE."""
    engine = create_engine("sqlite+pysqlite://", poolclass=StaticPool, creator=lambda: raw)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


class Database:
    """One process's connection to legion.db: Core for schema and queries, raw DBAPI for hot writes."""

    backend = "sqlite"
    tables: Tables = SQLITE_TABLES

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        try:
            self.raw: sqlite3.Connection = _connect(path)
        except (sqlite3.Error, OSError) as exc:  # (a JournalModeError is a LedgerError already)
            raise LedgerError(f"cannot open legion.db at {self.path!r}: {exc}") from exc
        self._engine: Engine | None = None
        self._conn: Connection | None = None
        self.file: str = main_file(self.raw)
        self.gate: WriteGate | NullGate = WriteGate.shared(self.file + "-writelock", BUSY_TIMEOUT_MS / 1000) if self.file else NullGate()
        self._depth: int = 0
        self._closed: bool = False
        self._pid: int = os.getpid()
        self.checkpoint_every: int = CHECKPOINT_EVERY_COMMITS
        self._commits: int = stagger(self._pid, CHECKPOINT_EVERY_COMMITS)  # spread across processes
        self.checkpointer: Checkpointer | None = Checkpointer(self.file) if self.file else None
        self._compiled_cache: dict[str, Any] = {}
        self._cache_schema: int = -1
        self.cache_invalidations: int = 0

    @property
    def engine(self) -> Engine:
        """SQLAlchemy's engine over this connection, made on first use (a Core query's compile, a migration): a
        process that only runs the pre-written writes (a worker's writer) never builds it (~2 ms of CPU and
        ~1.6 MB of an rpc worker's private memory, measured in a forked worker)."""
        if self._engine is None:
            self._engine = _engine_over(self.raw)
        return self._engine

    @property
    def conn(self) -> Connection:
        """A Core connection on the same DBAPI connection (migrations). Its first connect ends with SQLAlchemy's
        rollback of the DBAPI connection, so it is made only outside a transaction."""
        if self._conn is None:
            if self.raw.in_transaction:
                raise LedgerError("internal: a Core connection cannot be made inside a raw transaction")
            self._conn = self.engine.connect()
        return self._conn

    @property
    def in_write(self) -> bool:
        return self._depth > 0

    def check_usable(self) -> None:
        """Refuse use after close or from a forked child (SQLite state must never cross a fork)."""
        if self._closed:
            raise LedgerError(f"the ledger at {self.path!r} is closed; open a new one")
        if os.getpid() != self._pid:
            raise LedgerError(
                f"the ledger at {self.path!r} was opened by pid {self._pid} and used in pid {os.getpid()}: "
                "a forked process must open its own ledger (never share a connection across fork)"
            )

    @contextmanager
    def write(self, request_id: str | None = None) -> Iterator[sqlite3.Connection]:
        """A raw BEGIN IMMEDIATE transaction behind the write gate; nested calls join the outer one. `request_id` is
        PostgreSQL's (pg_engine.py): a local COMMIT's outcome is always known, so SQLite records none."""
        if self._depth:
            self._depth += 1
            try:
                yield self.raw
            finally:
                self._depth -= 1
            return
        self.check_usable()
        gated = self.gate.acquire()
        try:
            self.raw.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield self.raw
            except BaseException:
                if self.raw.in_transaction:
                    self.raw.execute("ROLLBACK")
                raise
            else:
                self.raw.execute("COMMIT")
                self._commits += 1
            finally:
                self._depth = 0
        finally:
            if gated:
                self.gate.release()
        if self.checkpointer is not None and self._commits >= self.checkpoint_every:
            self._commits = 0
            self.checkpointer.request()

    def write_row(self) -> Any:
        """A write of one row: on SQLite every write takes the one write lock (PostgreSQL's differs)."""
        return self.write()

    @contextmanager
    def core_write(self) -> Iterator[Connection]:
        """A Core transaction (BEGIN IMMEDIATE via the begin event) behind the write gate."""
        if self._depth:
            raise LedgerError("internal: a Core write transaction cannot nest inside a raw one")
        self.check_usable()
        gated = self.gate.acquire()
        try:
            self._depth = 1
            with self.conn.begin():
                yield self.conn
        finally:
            self._depth = 0
            if gated:
                self.gate.release()

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A deferred read transaction (one snapshot, never the write lock); joins an open one."""
        if self.raw.in_transaction:
            yield self.raw
            return
        self.check_usable()
        self.raw.execute("BEGIN")
        try:
            yield self.raw
        finally:
            if self.raw.in_transaction:
                self.raw.execute("COMMIT")

    def select(
        self,
        stmt: ClauseElement | Callable[[Tables], ClauseElement],
        params: dict[str, Any] | None = None,
        *,
        key: str | None = None,
    ) -> list[dict[str, Any]]:
        """Run a Core query (or a builder of one, given this backend's tables) on the raw connection, inside
        whatever transaction is open.

        With a `key`, the statement (which must take its values as bindparams) is compiled once and
        cached under that key; without one it is compiled for this call.
        """
        compiled = self._compiled(stmt, key)
        values = compiled.construct_params(params or {})
        args = [values[k] for k in (compiled.positiontup or ())]
        cur = self.raw.execute(compiled.string, args)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]

    def _compiled(self, stmt: ClauseElement | Callable[[Tables], ClauseElement], key: str | None) -> Any:
        if key is None:
            return self._built(stmt).compile(dialect=self.engine.dialect, compile_kwargs={"render_postcompile": True})
        # docs/spec-conformance.md §10 item 48: any DDL (ours or another process's) bumps schema_version and drops the cache.
        version = int(self.raw.execute("PRAGMA schema_version").fetchone()[0])
        if version != self._cache_schema:
            if self._compiled_cache:
                self.cache_invalidations += 1
            self._compiled_cache.clear()
            self._cache_schema = version
        hit = self._compiled_cache.get(key)
        if hit is None:
            if len(self._compiled_cache) >= STATEMENT_CACHE_SIZE:
                self._compiled_cache.pop(next(iter(self._compiled_cache)))
            hit = self._compiled_cache[key] = self._built(stmt).compile(dialect=self.engine.dialect)
        return hit

    def _built(self, stmt: ClauseElement | Callable[[Tables], ClauseElement]) -> ClauseElement:
        return stmt if isinstance(stmt, ClauseElement) else stmt(self.tables)

    def close(self) -> None:
        """Close the connection and the engine; idempotent."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:
            return  # a forked child's copy: closing it could disturb the parent's SQLite locks
        if self.checkpointer is not None:
            self.checkpointer.close()
        try:
            if self._conn is not None:
                self._conn.close()
            if self._engine is not None:
                self._engine.dispose()
            self.raw.close()
        finally:
            self.gate.release_user()
