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
- **A server that goes away** (a restart, a dropped connection, a server that refuses connections for now; see
  `is_connection_lost`): the failing statement raises `LedgerUnreachable`, which the ledger writer treats as
  transient: it retries the whole transaction, and the next top-level transaction or read starts on a fresh
  connection from the pool (`_ensure_connected`). Any other error keeps its usual path.
- **Request ids**: a write may carry a request id (`write(request_id=...)`, the ledger writer gives each batch
  one); it is recorded in `applied_requests` (pg_schema.py, PostgreSQL only) in the same transaction. When the
  connection drops during COMMIT the outcome is unknown: `CommitOutcomeUnknown` says so, and `request_applied`
  answers it once the server is back, so a retry never applies a write twice. Ids older than
  REQUEST_RETENTION_MS are pruned as the run writes.
"""

from __future__ import annotations

import contextlib
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
from legion.ledger.errors import CommitOutcomeUnknown, LedgerConnectError, LedgerError, LedgerUnreachable
from legion.ledger.location import with_env_password
from legion.ledger.pg_schema import REQUESTS_TABLE
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
# connection exceptions, and a server shutting down (admin, crash) or not accepting connections yet (a restart)
_LOST_SQLSTATES = ("08", "57P01", "57P02", "57P03")
REQUEST_RETENTION_MS = 24 * 3600 * 1000  # far longer than a writer waits on an unknown commit before its run pauses
PRUNE_EVERY = 500  # recorded requests between two prunes of the old ones, per connection
_NOW_MS = "(extract(epoch from clock_timestamp()) * 1000)::bigint"
_RECORD_REQUEST = f"INSERT INTO {REQUESTS_TABLE} (run, id, applied_at) VALUES ({RUN}, %s, {_NOW_MS})"
_PRUNE_REQUESTS = f"DELETE FROM {REQUESTS_TABLE} WHERE run = {RUN} AND applied_at < {_NOW_MS} - %s"
_REQUEST_APPLIED = f"SELECT 1 FROM {REQUESTS_TABLE} WHERE run = {RUN} AND id = %s"
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


def is_connection_lost(exc: BaseException) -> bool:
    """The server went away or cannot be reached (retry on a fresh connection), as opposed to an error of the
    statement itself: psycopg's OperationalError without a SQLSTATE (a closed or broken connection, a refused
    connect) or with a connection-exception or shutdown SQLSTATE."""
    orig = getattr(exc, "orig", None)  # SQLAlchemy's DBAPIError wraps the driver's error
    err = orig if isinstance(orig, psycopg.Error) else exc
    if not isinstance(err, psycopg.OperationalError):
        return False
    sqlstate = err.sqlstate
    return sqlstate is None or sqlstate.startswith(_LOST_SQLSTATES)


def _reason(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc)
    return " ".join(text.replace("connection failed:", "").replace("connection is bad:", "").split())


def connect_error(shown: str, exc: BaseException) -> LedgerConnectError:
    """What a failed connect means, with the fix for its likely cause."""
    reason = _reason(exc)
    lower = reason.lower()
    lost = is_connection_lost(exc)
    for needles, fix in _CONNECT_FIXES:
        if any(needle in lower for needle in needles):
            return LedgerConnectError(shown, reason, fix + ". Nothing was written", unreachable=lost)
    return LedgerConnectError(shown, reason, "Nothing was written", unreachable=lost)


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

    def __init__(self, conn: psycopg.Connection[Any], shown: str) -> None:
        self.conn = conn  # replaced by a fresh one after the server went away (PgDatabase._ensure_connected)
        self.shown = shown
        self.lost = False

    @property
    def in_transaction(self) -> bool:
        """In a transaction on a usable connection (a lost one holds none: the server rolled it back)."""
        return not self.lost and self.conn.info.transaction_status not in (TransactionStatus.IDLE,
                                                                           TransactionStatus.UNKNOWN)

    def run(self, text: str, params: Any = None) -> psycopg.Cursor[Any]:
        """`text` on the connection; a lost connection raises LedgerUnreachable."""
        try:
            return self.conn.execute(text, params)
        except psycopg.OperationalError as exc:
            if is_connection_lost(exc):
                self.lost = True  # replaced before the next transaction, even if psycopg has not marked it broken
                raise LedgerUnreachable(self.shown, _reason(exc)) from exc
            raise

    def execute(self, sql: str, params: Any = ()) -> PgCursor:
        if isinstance(sql, Sql):
            text = sql.pg
        elif _CONTROL_RE.match(sql):
            text = sql
        else:
            raise LedgerError(f"internal: a statement without a PostgreSQL form reached a shared ledger: {sql[:80]!r}")
        try:
            cur = self.run(text, params or None)
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
            self._proxy, conn = self._connect()
        except (DBAPIError, psycopg.OperationalError) as exc:
            raise connect_error(target.shown, exc) from None
        self.raw = PgRaw(conn, target.shown)
        self.reconnects = 0  # fresh connections taken after the server went away
        self._recorded = 0  # request ids recorded on this connection's writes (a prune every PRUNE_EVERY)
        self._depth = 0
        self._serialised = False
        self._closed = False
        self._pid = os.getpid()
        self._compiled_cache: dict[str, Any] = {}

    @property
    def pg(self) -> psycopg.Connection[Any]:
        """The connection in use (a fresh one after the server went away)."""
        return self.raw.conn

    def _connect(self) -> tuple[Any, psycopg.Connection[Any]]:
        """A connection from the pool, scoped to the run (DBAPIError or OperationalError when none can be had)."""
        proxy = self.engine.raw_connection()
        conn = proxy.dbapi_connection
        assert isinstance(conn, psycopg.Connection)
        try:
            conn.autocommit = True  # BEGIN and COMMIT are ours, as with sqlite3's isolation_level=None
            conn.execute("SELECT set_config('legion.run', %s, false)", (self.run_id,))
        except BaseException:
            proxy.invalidate()
            raise
        return proxy, conn

    def _ensure_connected(self) -> None:
        """Before a top-level transaction: a connection that the server dropped is replaced (LedgerUnreachable when
        no new one can be had: the caller retries later)."""
        if not (self.raw.lost or self.pg.closed or self.pg.broken):
            return
        if self._depth:  # never a fresh connection in the middle of a transaction: its start is gone with the old one
            raise LedgerUnreachable(self.path, "the connection was lost in the middle of a transaction")
        if self._proxy.is_valid:
            with contextlib.suppress(Exception):
                self._proxy.invalidate()  # the pool must not hand the dead connection out again
        try:
            self._proxy, self.raw.conn = self._connect()
            self.raw.lost = False
        except (DBAPIError, psycopg.OperationalError) as exc:
            if not is_connection_lost(exc):
                raise
            raise LedgerUnreachable(self.path, _reason(exc)) from exc
        self.reconnects += 1

    def _begin(self, begin: str) -> None:
        """Open a top-level transaction. A connection the server closed while it sat idle (a restart that ended
        before this call) only fails at its first statement: that statement runs once more on a fresh connection,
        so a read after a restart is not an error (LedgerUnreachable still, when the server is down)."""
        self._ensure_connected()
        try:
            self.raw.execute(begin)
        except LedgerUnreachable:
            self._ensure_connected()
            self.raw.execute(begin)

    def request_applied(self, request_id: str) -> bool:
        """Whether the write transaction that carried `request_id` committed (LedgerUnreachable while the server
        cannot answer)."""
        self.check_usable()
        self._ensure_connected()
        return self.raw.run(_REQUEST_APPLIED, (request_id,)).fetchone() is not None

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

    def write(self, request_id: str | None = None) -> Any:
        """A write transaction holding the run's lock (see the module doc); nested calls join it. `request_id`
        (top level only) is recorded with the transaction: see `request_applied`."""
        return self._write(serialise=True, request_id=request_id)

    def write_row(self) -> Any:
        """A write transaction for one statement on one row: its row lock is enough."""
        return self._write(serialise=False)

    @contextmanager
    def _write(self, *, serialise: bool, request_id: str | None = None) -> Iterator[PgRaw]:
        if self._depth:
            if serialise and not self._serialised:
                self.raw.run(RUN_LOCK_SQL)
                self._serialised = True
            with self._nested():
                yield self.raw
            return
        self.check_usable()
        self._begin("BEGIN")
        self._depth = 1
        try:
            if serialise:
                self.raw.run(RUN_LOCK_SQL)
                self._serialised = True
            yield self.raw
            if request_id is not None:
                self._record_request(request_id)
        except BaseException:
            self._rollback()
            raise
        else:
            self._commit(request_id)
        finally:
            self._depth = 0
            self._serialised = False

    def _record_request(self, request_id: str) -> None:
        self.raw.run(_RECORD_REQUEST, (request_id,))
        self._recorded += 1
        if self._recorded % PRUNE_EVERY == 0:
            self.raw.run(_PRUNE_REQUESTS, (REQUEST_RETENTION_MS,))

    def _commit(self, request_id: str | None) -> None:
        """COMMIT; a connection lost meanwhile leaves the outcome unknown (CommitOutcomeUnknown)."""
        if self.commit_hook is not None:
            self.commit_hook(self)
        try:
            self.raw.execute("COMMIT")
        except LedgerUnreachable as exc:
            raise CommitOutcomeUnknown(self.path, exc.reason, request_id) from exc.__cause__

    # tests only: called just before COMMIT is sent (e.g. to make the server drop the connection at that moment)
    commit_hook: Callable[[PgDatabase], None] | None = None

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
        if self.raw.in_transaction and not (self.pg.closed or self.pg.broken):
            with contextlib.suppress(LedgerUnreachable):  # the server went away: nothing of it was committed
                self.raw.execute("ROLLBACK")

    @contextmanager
    def read(self) -> Iterator[PgRaw]:
        """One snapshot for the whole call; joins an open transaction."""
        if self._depth or self.raw.in_transaction:
            yield self.raw
            return
        self.check_usable()
        self._begin("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            yield self.raw
        finally:
            if self.raw.in_transaction and not (self.pg.closed or self.pg.broken):
                with contextlib.suppress(LedgerUnreachable):  # a read's snapshot: nothing to lose
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
        cur = self.raw.run(compiled.string, values)
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
            if self.raw.lost and self._proxy.is_valid:
                self._proxy.invalidate()  # never back into the pool
            else:
                self._proxy.close()
