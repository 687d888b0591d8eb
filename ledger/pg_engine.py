"""Opening a PostgreSQL ledger: a psycopg 3 connection from this process's pool, the run it is scoped to, and
the transaction discipline that stands in for SQLite's `BEGIN IMMEDIATE` behind the write gate.

- **One pool per process and URL** (SQLAlchemy's QueuePool over psycopg): a Ledger checks one connection out
  for its life, as a SQLite Ledger holds one connection; a forked child never reuses its parent's pool.
- **The run**: each checked-out connection sets `legion.run`; every statement (sql.Sql's `pg` text, and
  every Core query through `Tables.scope`) names it, so one database holds many runs.
- **`write()`**: `BEGIN` (READ COMMITTED), then a transaction-level advisory lock on the run. It serialises
  the run's multi-statement writes as SQLite's one writer per file does, and is needed for two rules row
  locks cannot give: an event id is a reader's cursor, so a run's events must commit in id order; and the
  check-then-insert rules (live-node and child budgets, the mail rate, the tree-wide cost) read counts
  over many rows. Other runs never wait on it.
- **`write_row()`**: `BEGIN` without the run lock, for one statement on one row (a liveness stamp, a usage
  snapshot, a delivery lease: the claim takes its row `FOR UPDATE SKIP LOCKED`); its row lock is enough.
- **Nested calls** run in a SAVEPOINT: on PostgreSQL a failed statement aborts the whole transaction, on
  SQLite it does not, and a caller inside `Ledger.transaction()` may catch a refusal and go on.
- **Reads**: one REPEATABLE READ, READ ONLY snapshot per call, as SQLite's deferred `BEGIN`.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ClauseElement

from legion.ledger.constants import STATEMENT_CACHE_SIZE
from legion.ledger.errors import LedgerConnectError, LedgerError
from legion.ledger.location import with_env_password
from legion.ledger.schema import PG_TABLES, Tables
from legion.ledger.sql import RUN, IntegrityViolation, Sql
from legion.ledger.target import PgTarget

# pg_advisory_xact_lock(class, key): legion's lock class, then the run's hash (a collision only serialises two
# runs needlessly); migrations take their own class, once per database
LOCK_CLASS_RUN = 0x1E610
LOCK_CLASS_MIGRATE = 0x1E611
RUN_LOCK_SQL = f"SELECT pg_advisory_xact_lock({LOCK_CLASS_RUN}, hashtext({RUN}))"
CONNECT_TIMEOUT_S = 10
POOL_SIZE = 4
POOL_OVERFLOW = 16
_CONTROL_RE = re.compile(r"^\s*(BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE)\b", re.IGNORECASE)
_CALL_SAVEPOINT = "legion_call"

_engines: dict[tuple[int, str], Engine] = {}
_engines_lock = threading.Lock()


def engine_for(url: str) -> Engine:
    """This process's pool for `url` (created on first use)."""
    key = (os.getpid(), url)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            engine = create_engine(
                "postgresql+psycopg://" + url.split("://", 1)[1],
                pool_size=POOL_SIZE,
                max_overflow=POOL_OVERFLOW,
                pool_pre_ping=True,
                connect_args={**({} if "connect_timeout=" in url else {"connect_timeout": CONNECT_TIMEOUT_S}),
                              **with_env_password(url)},
            )
            _engines[key] = engine
        return engine


def close_pool(url: str) -> None:
    """Close this process's idle connections to `url` (e.g. before the database is dropped)."""
    with _engines_lock:
        engine = _engines.pop((os.getpid(), url), None)
    if engine is not None:
        engine.dispose()


_CONNECT_FIXES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("no password supplied",),
     "The server asks for a password and none was given: set LEGION_LEDGER_PASSWORD (or PGPASSWORD), add a "
     "~/.pgpass line, or put LEGION_LEDGER_URL with the password in the environment of this command"),
    (("password authentication failed", "role", "no pg_hba.conf entry", "authentication"),
     "Check the user and password in the URL (or PGPASSWORD, ~/.pgpass) and the server's pg_hba.conf"),
    (("does not exist",),
     "Create the database (createdb NAME, or CREATE DATABASE NAME) or fix its name in the URL"),
    (("refused", "no such file", "timeout expired", "resolve host", "could not translate", "is the server running"),
     "Check the host and port in the URL, and that the server is running and accepts connections from here"),
)


def connect_error(shown: str, exc: BaseException) -> LedgerConnectError:
    """What a failed connect means, with the fix for its likely cause."""
    text = str(getattr(exc, "orig", None) or exc)
    reason = " ".join(text.replace("connection failed:", "").replace("connection is bad:", "").split())
    lower = reason.lower()
    for needles, fix in _CONNECT_FIXES:
        if any(needle in lower for needle in needles):
            return LedgerConnectError(shown, reason, fix + ". Nothing was written")
    return LedgerConnectError(shown, reason, "Nothing was written")


class PgCursor:
    """The part of a sqlite3 cursor the ledger uses: rows, rowcount, lastrowid (from RETURNING id)."""

    __slots__ = ("_cur", "description", "lastrowid", "rowcount")

    def __init__(self, cur: psycopg.Cursor[Any], lastrowid: int | None) -> None:
        self._cur = cur
        self.rowcount = cur.rowcount
        self.lastrowid = lastrowid
        self.description = cur.description

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()


def _integrity_kind(exc: psycopg.IntegrityError) -> str:
    if isinstance(exc, pg_errors.UniqueViolation):
        return "unique"
    if isinstance(exc, pg_errors.ForeignKeyViolation):
        return "foreign key"
    if isinstance(exc, pg_errors.NotNullViolation):
        return "not null"
    return "check"


class PgRaw:
    """A psycopg connection with the sqlite3 surface the ledger's statements use (`execute`, `in_transaction`).

    It runs an Sql's PostgreSQL text; a plain string only when it is transaction control, so no statement
    without the run in it reaches a shared database.
    """

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    @property
    def in_transaction(self) -> bool:
        return self.conn.info.transaction_status != TransactionStatus.IDLE

    def execute(self, sql: str, params: Any = ()) -> PgCursor:
        if isinstance(sql, Sql):
            text = sql.pg
        elif _CONTROL_RE.match(sql):
            text = sql
        else:
            raise LedgerError(f"internal: a statement without a PostgreSQL form reached a shared ledger: {sql[:80]!r}")
        try:
            cur = self.conn.execute(text, params or None)
        except psycopg.IntegrityError as exc:
            raise IntegrityViolation(_integrity_kind(exc), str(exc).splitlines()[0]) from exc
        lastrowid = None
        if isinstance(sql, Sql) and sql.returns_id:
            row = cur.fetchone()
            lastrowid = int(row[0]) if row is not None else None
        return PgCursor(cur, lastrowid)


class PgDatabase:
    """One process's connection to a PostgreSQL ledger, scoped to one run; the interface of engine.Database."""

    backend = "postgresql"
    tables: Tables = PG_TABLES
    file = ""  # no file: no write gate, no checkpointer, no disk-full watch of our own
    checkpointer = None
    raw: PgRaw
    _depth: int
    _serialised: bool
    _closed: bool
    _pid: int

    def __init__(self, target: PgTarget, run_id: str) -> None:
        self.path = target.shown
        self.url = target.url
        self.run_id = run_id
        self.engine = engine_for(target.url)
        try:
            self._proxy = self.engine.raw_connection()
        except (DBAPIError, psycopg.OperationalError) as exc:
            raise connect_error(target.shown, exc) from None
        conn = self._proxy.dbapi_connection
        assert isinstance(conn, psycopg.Connection)
        self.pg: psycopg.Connection[Any] = conn
        self.pg.autocommit = True  # BEGIN and COMMIT are ours, as with sqlite3's isolation_level=None
        self.pg.execute("SELECT set_config('legion.run', %s, false)", (run_id,))
        self.raw = PgRaw(self.pg)
        self._depth = 0
        self._serialised = False
        self._closed = False
        self._pid = os.getpid()
        self._compiled_cache: dict[str, Any] = {}

    @property
    def in_write(self) -> bool:
        return self._depth > 0

    def check_usable(self) -> None:
        if self._closed:
            raise LedgerError(f"the ledger at {self.path} is closed; open a new one")
        if os.getpid() != self._pid:
            raise LedgerError(
                f"the ledger at {self.path} was opened by pid {self._pid} and used in pid {os.getpid()}: "
                "a forked process must open its own ledger (never share a connection across fork)"
            )

    def write(self) -> Any:
        """A write transaction holding the run's lock (see the module doc); nested calls join it."""
        return self._write(serialise=True)

    def write_row(self) -> Any:
        """A write transaction for one statement on one row: its row lock is enough."""
        return self._write(serialise=False)

    @contextmanager
    def _write(self, *, serialise: bool) -> Iterator[PgRaw]:
        if self._depth:
            if serialise and not self._serialised:
                self.pg.execute(RUN_LOCK_SQL)
                self._serialised = True
            with self._nested():
                yield self.raw
            return
        self.check_usable()
        self.raw.execute("BEGIN")
        self._depth = 1
        try:
            if serialise:
                self.pg.execute(RUN_LOCK_SQL)
                self._serialised = True
            yield self.raw
        except BaseException:
            self._rollback()
            raise
        else:
            self.raw.execute("COMMIT")
        finally:
            self._depth = 0
            self._serialised = False

    @contextmanager
    def _nested(self) -> Iterator[None]:
        self.raw.execute(f"SAVEPOINT {_CALL_SAVEPOINT}")
        self._depth += 1
        try:
            yield
        except BaseException:
            if self.raw.in_transaction:
                self.raw.execute(f"ROLLBACK TO SAVEPOINT {_CALL_SAVEPOINT}")
                self.raw.execute(f"RELEASE SAVEPOINT {_CALL_SAVEPOINT}")
            raise
        else:
            self.raw.execute(f"RELEASE SAVEPOINT {_CALL_SAVEPOINT}")
        finally:
            self._depth -= 1

    def _rollback(self) -> None:
        if self.raw.in_transaction and not self.pg.closed:
            self.raw.execute("ROLLBACK")

    @contextmanager
    def read(self) -> Iterator[PgRaw]:
        """One snapshot for the whole call; joins an open transaction."""
        if self.raw.in_transaction:
            yield self.raw
            return
        self.check_usable()
        self.raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            yield self.raw
        finally:
            if self.raw.in_transaction and not self.pg.closed:
                self.raw.execute("COMMIT")

    def select(
        self,
        stmt: ClauseElement | Callable[[Tables], ClauseElement],
        params: dict[str, Any] | None = None,
        *,
        key: str | None = None,
    ) -> list[dict[str, Any]]:
        """Run a Core query (or a builder of one, given this backend's tables) inside the open transaction."""
        compiled = self._compiled(stmt, key)
        values = compiled.construct_params(params or {})
        cur = self.pg.execute(compiled.string, values)
        cols = [d.name for d in cur.description or ()]
        return [dict(zip(cols, row, strict=True)) for row in cur.fetchall()]

    def _compiled(self, stmt: ClauseElement | Callable[[Tables], ClauseElement], key: str | None) -> Any:
        if key is not None and key in self._compiled_cache:
            return self._compiled_cache[key]
        built = stmt if isinstance(stmt, ClauseElement) else stmt(self.tables)
        if key is None:
            return built.compile(dialect=self.engine.dialect, compile_kwargs={"render_postcompile": True})
        if len(self._compiled_cache) >= STATEMENT_CACHE_SIZE:
            self._compiled_cache.pop(next(iter(self._compiled_cache)))
        hit = self._compiled_cache[key] = built.compile(dialect=self.engine.dialect)
        return hit

    def close(self) -> None:
        """Give the connection back to the pool; idempotent."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:
            return  # a forked child's copy of the socket is the parent's
        try:
            self._rollback()
        except psycopg.Error:
            pass  # a broken connection: the pool discards it
        finally:
            self._proxy.close()
