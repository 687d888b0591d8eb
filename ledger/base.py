"""The state every ledger mixin shares: the process's Database and its clock."""

from __future__ import annotations

from legion.ledger.clock import Clock
from legion.ledger.engine import Database


class LedgerBase:
    """Holds `_db` and `_now`; the table mixins add their methods on top of it."""

    _db: Database
    _now: Clock
