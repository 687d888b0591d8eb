"""What the commands share: exit statuses, JSON output, and a damaged ledger turned into one clear error."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

# the exit statuses of the commands that do not host a run (a run's own are in legion/run_errors.py)
EXIT_REFUSED = 1  # an operator request the run refused (the reply says why)
EXIT_ROOT_DIED = 1  # `legion status`: the run's root (or its detached daemon) died mid-run
EXIT_USAGE = 2
EXIT_LEDGER = 3  # the run's ledger cannot be read


class LedgerUnreadable(Exception):
    """The run's legion.db could not be read; the message says what to do."""


def _ledger_unreadable(run_dir: Path, exc: BaseException) -> LedgerUnreadable:
    from legion.runs import ledger_url

    path = run_dir / "legion.db"
    reason = (str(exc).splitlines() or [type(exc).__name__])[0]
    url = ledger_url(run_dir)
    if url is not None:  # the message of the ledger layer names the server and the fix
        return LedgerUnreadable(f"cannot read the ledger of run {run_dir.name} at {url}: {reason}")
    return LedgerUnreadable(
        f"cannot read the ledger {path} ({reason}). It may be damaged or not a legion ledger: check it with "
        f"`sqlite3 {path} 'PRAGMA integrity_check'` and save what it holds with "
        f"`sqlite3 {path} .recover > recovered.sql`")


def read_ledger(run_dir: Path, read: Callable[[Path], Any]) -> Any:
    """``read(run_dir)``, with a damaged or foreign ledger turned into one clear error."""
    try:
        return read(run_dir)
    except Exception as exc:
        # imported only on failure: SQLAlchemy costs a report most of its 300 ms budget (legion/reports/fastread.py)
        from sqlalchemy.exc import SQLAlchemyError

        from legion.ledger import LedgerError

        if isinstance(exc, LedgerError | SQLAlchemyError | sqlite3.DatabaseError):
            raise _ledger_unreadable(run_dir, exc) from exc
        raise


def print_json(value: Any, *, default: Callable[[Any], Any] | None = None) -> None:
    """One JSON line on stdout; a value JSON has no type for goes through `default` (bytes: their repr)."""
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=default or _json_default).decode()
                     + "\n")


def _json_default(value: Any) -> Any:
    """A ledger value JSON has no type for (a BLOB in a damaged row): its repr, so --json never raises."""
    if isinstance(value, bytes | bytearray | memoryview):
        return repr(bytes(value))
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")
