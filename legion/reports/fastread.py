"""Read-only queries for the operator's reports (`status`, `summary`, `timing`) without importing the ledger package.

The ledger package (SQLAlchemy) costs ~150-200 ms to import on a loaded machine, more than half of the
300 ms a report may take on 300 nodes; these few SELECTs over `sqlite3` (a read-only URI connection,
WAL-safe) give the same rows. Only for a database of exactly the schema version this legion writes
(`KNOWN_SCHEMA`, kept equal to `ledger.constants.SCHEMA_VERSION` by a test): any other version goes through
`open_ledger`, which migrates an older one and refuses a newer one with its own message; so does a run whose ledger
is a PostgreSQL database (`connect_run` yields None for it, and `legion.runs.open_run_ledger` opens its rows).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from legion.runs import LEDGER_FILE, ledger_url

KNOWN_SCHEMA = 5
_NODE_COLUMNS = ("id", "parent_id", "name", "role", "kind", "depth", "run_id", "session_file", "worktree_path",
                 "model", "team", "status", "phase", "phase_since", "rework_count", "contract_path", "task_summary",
                 "created_at", "updated_at")


@contextlib.contextmanager
def connect_run(run_dir: Path) -> Iterator[sqlite3.Connection | None]:
    """`connect` to the run's legion.db; None for a run on PostgreSQL too (read it through `open_run_ledger`)."""
    if ledger_url(run_dir) is not None:
        yield None
        return
    with connect(run_dir / LEDGER_FILE) as conn:
        yield conn


@contextlib.contextmanager
def connect(db: Path) -> Iterator[sqlite3.Connection | None]:
    """A read-only connection, or None when the file is of another schema version (use `open_ledger`)."""
    if not db.is_file():
        raise FileNotFoundError(f"no ledger at {db}")
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        yield conn if version == KNOWN_SCHEMA else None
    finally:
        conn.close()


def nodes(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    cols = ", ".join(_NODE_COLUMNS)
    rows = conn.execute(f"SELECT {cols} FROM nodes ORDER BY created_at, id").fetchall()
    return [dict(zip(_NODE_COLUMNS, row, strict=True)) for row in rows]


def usage(conn: sqlite3.Connection) -> dict[str, dict[str, Any]]:
    rows = conn.execute("SELECT node_id, tokens_in, tokens_out, cost_usd, unknown_cost_tokens FROM usage").fetchall()
    return {r[0]: {"tokens_in": r[1], "tokens_out": r[2], "cost_usd": r[3], "unknown_cost_tokens": r[4]} for r in rows}


def node_events(conn: sqlite3.Connection, types: frozenset[str]) -> dict[str, list[tuple[str, int]]]:
    """(type, ts) of the given event types, per node, oldest first."""
    marks = ",".join("?" * len(types))
    out: dict[str, list[tuple[str, int]]] = {}
    for node_id, type_, ts in conn.execute(
            f"SELECT node_id, type, ts FROM events WHERE node_id IS NOT NULL AND type IN ({marks}) ORDER BY id",
            tuple(sorted(types))):
        out.setdefault(node_id, []).append((type_, ts))
    return out


def events_after(conn: sqlite3.Connection, after: int, limit: int) -> list[dict[str, Any]]:
    rows = conn.execute("SELECT id, node_id, type, data, ts FROM events WHERE id > ? ORDER BY id LIMIT ?",
                        (after, limit)).fetchall()
    return [{"id": r[0], "node_id": r[1], "type": r[2], "data": _json(r[3]), "ts": r[4]} for r in rows]


def _json(raw: Any) -> Any:
    if raw is None:
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {"raw": str(raw)}
