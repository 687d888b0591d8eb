"""Waiting for new events: what a reader that follows a ledger's events (`legion events --follow`) blocks on between
reads, one interface on both backends.

- **PostgreSQL**: `LISTEN legion_events` on a connection of its own (outside the pool: a listening connection
  must not be handed to anyone else). Every transaction that inserts a run's events sends NOTIFY with the run as
  payload (events.notifying), so `wait` returns as soon as such a transaction commits; a waiter for some runs
  ignores other runs' notices. A notice can be missed (the connection dropped and came back), so `wait` also
  returns after SAFETY_POLL_S and the reader reads anyway: a missed notice delays a reader, never stalls it.
- **SQLite**: `PRAGMA data_version` on a connection of its own, checked every SQLITE_POLL_S: it changes when
  another connection commits (the SQLite-only machinery stays behind this interface).

`wait(timeout)` returns True when something may have landed (a notice, a changed data_version, the safety poll),
False at `timeout` with nothing seen.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final, Protocol

from legion.ledger.errors import LedgerError
from legion.ledger.events import EVENTS_CHANNEL
from legion.ledger.target import PgTarget, parse_target

SAFETY_POLL_S: Final = 5.0
SQLITE_POLL_S: Final = 0.25


class EventWaiter(Protocol):
    def wait(self, timeout: float | None) -> bool: ...

    def close(self) -> None: ...


class PgEventWaiter:
    """LISTEN legion_events; `runs` (None: every run) are the payloads that wake it."""

    def __init__(self, target: PgTarget, runs: Iterable[str] | None = None, *, safety_s: float = SAFETY_POLL_S) -> None:
        import psycopg

        from legion.ledger.pg_engine import connect_error

        self.runs = None if runs is None else frozenset(runs)
        self.safety_s = safety_s
        self.notices = 0  # notifications that woke this waiter (a test checks that a follower is woken, not polled)
        self.target = target
        self.conn: Any = None
        try:
            self._listen()
        except psycopg.Error as exc:
            raise connect_error(target.shown, exc) from None
        self._since_read = time.monotonic()

    def _listen(self) -> None:
        import psycopg

        from legion.ledger.location import with_env_password
        from legion.ledger.pg_engine import CONNECT_TIMEOUT_S

        url = self.target.url
        extra: dict[str, Any] = {} if "connect_timeout=" in url else {"connect_timeout": CONNECT_TIMEOUT_S}
        self.conn = psycopg.connect(url, autocommit=True, **extra, **with_env_password(url))
        self.conn.execute(f"LISTEN {EVENTS_CHANNEL}")

    def wait(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            safety_at = self._since_read + self.safety_s
            until = safety_at if deadline is None else min(deadline, safety_at)
            if self._heard(until):
                self.notices += 1
                return self._woke()
            now = time.monotonic()
            if now >= safety_at:
                return self._woke()
            if deadline is not None and now >= deadline:
                return False

    def _heard(self, until: float) -> bool:
        """A notice for one of our runs before `until`; False at `until` or after another run's notice."""
        import psycopg

        try:
            if self.conn is None or self.conn.closed:
                self._listen()  # the connection dropped: listen again (what it missed, the safety poll reads)
            for notice in self.conn.notifies(timeout=max(0.0, until - time.monotonic())):
                return self.runs is None or notice.payload in self.runs
        except psycopg.Error:
            self.close()
            self.conn = None
            time.sleep(min(1.0, max(0.0, until - time.monotonic())))
        return False

    def _woke(self) -> bool:
        self._since_read = time.monotonic()
        return True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


class SqliteEventWaiter:
    """PRAGMA data_version on its own connection to the file, every SQLITE_POLL_S."""

    def __init__(self, path: str | Path, *, poll_s: float = SQLITE_POLL_S) -> None:
        self.poll_s = poll_s
        try:
            self.conn = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True, isolation_level=None,
                                        check_same_thread=False)
            self.version = self._version()
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot watch the ledger {path} for new events: {exc}") from exc

    def _version(self) -> int:
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def wait(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = self.poll_s if deadline is None else min(self.poll_s, deadline - time.monotonic())
            if step > 0:
                time.sleep(step)
            try:
                version = self._version()
            except sqlite3.Error:
                return True  # the reader's own read says what is wrong
            if version != self.version:
                self.version = version
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.conn.close()


def event_waiter(target: str | Path, runs: Iterable[str] | None = None) -> EventWaiter:
    """The waiter for a ledger target: a `postgresql://` URL (LISTEN, for `runs` or every run) or a SQLite file."""
    parsed = parse_target(target)
    if isinstance(parsed, PgTarget):
        return PgEventWaiter(parsed, runs)
    return SqliteEventWaiter(parsed)
