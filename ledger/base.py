"""The state every ledger mixin shares: the process's Database, its clock and the durability of the files
its writes name."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from legion.ledger.clock import Clock
from legion.ledger.engine import Database
from legion.procs.durable import sync_paths

if TYPE_CHECKING:
    from legion.ledger.pg_engine import PgDatabase


class LedgerBase:
    """Holds `_db` and `_now`; the table mixins add their methods on top of it."""

    _db: Database | PgDatabase
    _now: Clock
    _deferred_sync: list[str] | None = None  # set while a LedgerWriter batch runs: it syncs them before COMMIT

    def make_durable(self, *paths: str | os.PathLike[str]) -> None:
        """The files `paths` (written, not yet synced) must be on disk before the transaction that names them
        commits: at once, or, inside `deferring_sync` (a LedgerWriter's batch), once for the whole batch."""
        if self._deferred_sync is not None:
            self._deferred_sync.extend(os.fspath(p) for p in paths)
        else:
            sync_paths(paths)

    @contextmanager
    def deferring_sync(self) -> Iterator[list[str]]:
        """Collect the files `make_durable` is given instead of syncing them (the caller syncs the list)."""
        outer, self._deferred_sync = self._deferred_sync, []
        try:
            yield self._deferred_sync
        finally:
            self._deferred_sync = outer
