"""The Ledger facade: one process's handle on legion.db (open, migrate, every table's API).

    led = open_ledger(run_dir / "legion.db")          # WAL asserted, migrated to v4
    led = open_ledger("postgresql://u:p@host/db", run_id="run-1")   # one run's rows in a shared database
    with led.transaction():                           # optional: group writes in one BEGIN IMMEDIATE
        led.heartbeat(node_id)
        led.append_event(node_id, "node_launched", {"pid": 123})
    led.events_after(cursor)                          # readers: poll led.data_version() first

Tables and their methods live in one mixin each: nodes.py (insert_node, update_node, set_status,
heartbeat, get_node, list_nodes, subtree), events.py (append_event, events_after, last_event_id,
data_version), usage.py (upsert_usage, get_usage, usage_totals), mail.py (send_mail,
transition_delivery, claim/renew/release_delivery_claim, pending_inbox, messages_in_state,
mailbox_stats, get_message), artifacts.py (record_artifact, write_artifact, record_consumption,
mark_notified, undelivered, get_artifact, list_artifacts), fleet_runs.py (register_run, set_run_state,
run_heartbeat, list_runs, fleet_figures, fleet_events_after: the runs table and the fleet view). Run-directory helpers that take a
Ledger: hygiene.run_hygiene, rebuild.rebuild_ledger; runfile.py handles run.json.
Every process opens its own Ledger after fork; a Ledger refuses use from another pid.
"""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from legion.ledger.artifacts import ArtifactsMixin
from legion.ledger.clock import Clock, now_ms
from legion.ledger.constants import BUSY_TIMEOUT_MS, MAIL_RATE_PER_5_MIN
from legion.ledger.engine import Database
from legion.ledger.errors import LedgerError, LedgerUrlError
from legion.ledger.events import EventsMixin
from legion.ledger.fleet_runs import FLEET_SCOPE, RunsMixin
from legion.ledger.mail import MailMixin
from legion.ledger.migrations import migrate, user_version
from legion.ledger.nodes import NodesMixin
from legion.ledger.target import PgTarget, check_run_id, parse_target
from legion.ledger.usage import UsageMixin

if TYPE_CHECKING:
    from legion.ledger.pg_engine import PgDatabase


def _lock_race(exc: BaseException) -> bool:
    """SQLITE_BUSY returned without the busy handler (SQLite's deadlock avoidance), somewhere in the chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, sqlite3.OperationalError) and "locked" in str(seen):
            return True
        seen = seen.__cause__ or getattr(seen, "orig", None)
    return False


def _open_database(target: str | Path, run_id: str | None, *, fleet: bool = False) -> Database | PgDatabase:
    """A PostgreSQL URL opens a PgDatabase scoped to `run_id` (a fleet reader: to no run); a path opens SQLite
    (the run id is the file's)."""
    parsed = parse_target(target)
    if isinstance(parsed, PgTarget):
        if fleet:
            from legion.ledger.pg_engine import PgDatabase as _FleetDatabase

            return _FleetDatabase(parsed, FLEET_SCOPE)
        if run_id is None:
            raise LedgerUrlError(parsed.shown, "a PostgreSQL ledger is shared by many runs: open it with the run's id "
                                 "(open_ledger(url, run_id=...))")
        from legion.ledger.pg_engine import PgDatabase as _PgDatabase  # psycopg only for a PostgreSQL ledger

        return _PgDatabase(parsed, check_run_id(run_id))
    if run_id is not None:
        check_run_id(run_id)
    return _open_sqlite(parsed)


def _open_sqlite(path: str | Path) -> Database:
    """Open, retrying a lost lock race until the busy timeout.

    Why: when several processes open a rollback-journal file at once (a historic v1/v2 ledger), each
    `PRAGMA journal_mode=WAL` holds SHARED and wants EXCLUSIVE; SQLite breaks that deadlock by
    returning SQLITE_BUSY at once, without calling the busy handler, so busy_timeout does not help.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            return Database(path)
        except LedgerError as exc:
            if not _lock_race(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(random.uniform(0.005, 0.05))


class Ledger(NodesMixin, EventsMixin, UsageMixin, MailMixin, ArtifactsMixin, RunsMixin):
    """Every process opens its own Ledger (never share one across fork)."""

    def __init__(
        self, path: str | Path, *, clock: Clock = now_ms, mail_rate_per_5_min: int = MAIL_RATE_PER_5_MIN,
        run_id: str | None = None, fleet: bool = False,
    ) -> None:
        if not isinstance(mail_rate_per_5_min, int) or mail_rate_per_5_min < 0:
            raise LedgerError(f"mail_rate_per_5_min must be a non-negative int, got {mail_rate_per_5_min!r}")
        self._now = clock
        self._mail_rate_per_5_min = mail_rate_per_5_min
        self._db = _open_database(path, run_id, fleet=fleet)
        try:
            self.migrated_from = migrate(self._db)
        except BaseException:
            self._db.close()
            raise

    @property
    def path(self) -> str:
        return self._db.path

    @property
    def file(self) -> str:
        """The database file ('' for :memory: and PostgreSQL)."""
        return self._db.file

    @property
    def backend(self) -> str:
        """'sqlite' or 'postgresql'."""
        return self._db.backend

    def schema_version(self) -> int:
        return user_version(self._db)

    @contextmanager
    def transaction(self, request_id: str | None = None) -> Iterator[Ledger]:
        """Group several writes (e.g. heartbeat + append_event + send_mail) into one BEGIN IMMEDIATE. On PostgreSQL
        `request_id` is recorded with it, for `request_applied` (ledger/pg_engine.py)."""
        with self._db.write(request_id):
            yield self

    def request_applied(self, request_id: str) -> bool:
        """Whether the transaction that carried `request_id` committed (PostgreSQL; on SQLite, whose commits'
        outcome is always known, nothing is recorded and the answer is False)."""
        return self._db.request_applied(request_id) if self._db.tables.scoped else False  # type: ignore[union-attr]

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def open_ledger(
    path: str | Path, *, clock: Clock = now_ms, mail_rate_per_5_min: int = MAIL_RATE_PER_5_MIN,
    run_id: str | None = None,
) -> Ledger:
    """Open (creating and migrating if needed) the ledger at a file path or ':memory:' (SQLite), or at a
    `postgresql://` URL, where `run_id` names the run whose rows this Ledger reads and writes."""
    return Ledger(path, clock=clock, mail_rate_per_5_min=mail_rate_per_5_min, run_id=run_id)


def open_fleet_ledger(path: str | Path, *, clock: Clock = now_ms) -> Ledger:
    """A reader of every run in the database (fleet_runs.py: `list_runs`, `fleet_figures`, `fleet_events_after`);
    on SQLite, the file and its one run."""
    return Ledger(path, clock=clock, fleet=True)
