"""Who keeps a PostgreSQL ledger's writer waiting: the stall report's PostgreSQL half (writer.py reads /proc/locks for
SQLite's file locks; a database server's locks are in pg_stat_activity and pg_locks).

`blockers(url, pid)` asks the server on a connection of its own (the writer's is the one waiting) what the writer's
backend `pid` waits for and which backends block it (`pg_blocking_pids`): each one's pid, state, how long its
transaction has been open, its wait event, application, client and query. It never raises: a server that cannot be
asked is said in the report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg

from legion.ledger.location import with_env_password
from legion.ledger.pg_engine import LOCK_CLASS_MIGRATE, LOCK_CLASS_RUN

if TYPE_CHECKING:
    from legion.ledger.ledger import Ledger

ASK_TIMEOUT_S = 3  # connect and statement timeout of the question: a stall report must not stall
QUERY_CHARS = 200

_WAITER_SQL = "SELECT state, wait_event_type, wait_event FROM pg_stat_activity WHERE pid = %s"
_WAITED_LOCKS_SQL = """
SELECT locktype, mode, classid, objid, relation::regclass::text FROM pg_locks WHERE pid = %s AND NOT granted
"""
_BLOCKERS_SQL = f"""
SELECT a.pid, a.state, extract(epoch FROM now() - a.xact_start), a.wait_event_type, a.wait_event,
       a.application_name, host(a.client_addr), left(regexp_replace(a.query, '\\s+', ' ', 'g'), {QUERY_CHARS})
  FROM pg_stat_activity a WHERE a.pid = ANY(pg_blocking_pids(%s)) ORDER BY a.pid
"""


def backend_pid(ledger: Ledger) -> int | None:
    """The server process serving `ledger`'s connection (None for SQLite, or a connection that is gone)."""
    pg = getattr(ledger._db, "pg", None)
    if not isinstance(pg, psycopg.Connection) or pg.closed:
        return None
    try:
        return int(pg.info.backend_pid)
    except (psycopg.Error, ValueError):
        return None


def _lock_name(locktype: str, mode: str, classid: int | None, objid: int | None, relation: str | None) -> str:
    """A lock the writer waits for, legion's own advisory locks named (pg_engine's lock classes)."""
    if locktype == "advisory":
        owner = {LOCK_CLASS_RUN: "the run's write lock", LOCK_CLASS_MIGRATE: "the migration lock"}.get(classid or -1)
        return f"{owner or 'an advisory lock'} (advisory {classid}:{objid}, {mode})"
    return f"a {locktype} lock ({mode}{' on ' + relation if relation else ''})"


def _waiter(row: tuple[Any, ...] | None, locks: list[tuple[Any, ...]], pid: int) -> str:
    if row is None:
        return f"the writer's PostgreSQL backend {pid} is gone (the connection was lost)"
    state, event_type, event = row
    if locks:
        waiting = "waits for " + ", ".join(_lock_name(*lock) for lock in locks)
    else:
        waiting = f"waits on {event_type}/{event}" if event_type else "is not waiting on a lock"
    return f"the writer's PostgreSQL backend {pid} ({state or 'no state'}) {waiting}"


def _blocker(row: tuple[Any, ...]) -> str:
    pid, state, age, event_type, event, app, client, query = row
    open_for = f", transaction open {float(age):.1f}s" if age is not None else ""
    waits = f", waiting on {event_type}/{event}" if event_type else ""
    who = f", application {app!r}" if app else ""
    where = f", client {client}" if client else ", local"
    return f"blocked by backend {pid} ({state}{open_for}{waits}{who}{where}): {query or '-'}"


def blockers(url: str, pid: int | None) -> list[str]:
    """What the writer's backend `pid` waits for and who blocks it, one line each; never raises."""
    if pid is None:
        return ["the writer has no PostgreSQL connection (it is reconnecting or could not connect)"]
    try:
        with psycopg.connect(url, connect_timeout=ASK_TIMEOUT_S, autocommit=True,
                             options=f"-c statement_timeout={ASK_TIMEOUT_S * 1000}", **with_env_password(url)) as conn:
            waiter = conn.execute(_WAITER_SQL, (pid,)).fetchone()
            locks = conn.execute(_WAITED_LOCKS_SQL, (pid,)).fetchall()
            blocking = conn.execute(_BLOCKERS_SQL, (pid,)).fetchall()
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split())[:300]
        return [f"cannot ask the PostgreSQL server who blocks the writer's backend {pid}: {reason}"]
    return [_waiter(waiter, locks, pid), *(_blocker(row) for row in blocking)]
