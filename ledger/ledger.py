"""The Ledger facade: one process's handle on legion.db (open, migrate, every table's API)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from legion.ledger.clock import Clock, now_ms
from legion.ledger.engine import Database
from legion.ledger.events import EventsMixin
from legion.ledger.migrations import migrate, user_version
from legion.ledger.nodes import NodesMixin


class Ledger(NodesMixin, EventsMixin):
    """Every process opens its own Ledger (never share one across fork)."""

    def __init__(self, path: str | Path, *, clock: Clock = now_ms) -> None:
        self._now = clock
        self._db = Database(path)
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
        """The database file ('' for :memory:)."""
        return self._db.file

    def schema_version(self) -> int:
        return user_version(self._db)

    @contextmanager
    def transaction(self) -> Iterator[Ledger]:
        """Group several writes (e.g. heartbeat + append_event + send_mail) into one BEGIN IMMEDIATE."""
        with self._db.write():
            yield self

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def open_ledger(path: str | Path, *, clock: Clock = now_ms) -> Ledger:
    """Open (creating and migrating to v3 if needed) the ledger at a file path or ':memory:'."""
    return Ledger(path, clock=clock)
