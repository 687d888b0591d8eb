"""Versioned, idempotent migrations to schema v4 via PRAGMA user_version (docs/spec-conformance.md §4.3).

- v0 -> v1: the four tables and the six named indexes.
- v1 -> v2: no DDL; `messages.delivered` widened from 3 to 5 values (old 1 = ACCEPTED, no backfill).
- v2 -> v3: `artifacts` + `consumptions` (+ their indexes and the immutability trigger), and the
  six v1 indexes re-asserted with IF NOT EXISTS. Why the latter: historic v1/v2 ledgers were
  shipped without `idx_messages_rate` (docs/spec-conformance.md §10 items 3–4: the index was added without a version bump), and an
  index must never be created "on open"; re-asserting them inside this versioned step is how those
  ledgers get every index.
- v3 -> v4: `usage.unknown_cost_tokens` (tokens of calls whose price is unknown; old rows read 0, which is
  what the v3 ledger could say). legion's own decision: the seed stops at v3, and pi-legion refuses a v4 file.

Each step runs its DDL and then sets user_version, inside one BEGIN IMMEDIATE transaction (SQLite
DDL is transactional), so a crash mid-step leaves the old version and a re-run redoes the step.
Concurrent openers serialise on the write lock and re-read the version inside it, so exactly one
process migrates. A database newer than SCHEMA_VERSION is refused.

A PostgreSQL ledger takes the same steps with its own DDL and a version table (pg_migrations.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import Connection

from legion.ledger.constants import SCHEMA_VERSION
from legion.ledger.engine import Database
from legion.ledger.errors import LedgerError, SchemaVersionError
from legion.ledger.schema import (
    V1_INDEXES,
    V1_TABLES,
    V3_INDEXES,
    V3_TABLES,
    V4_COLUMNS,
    V5_INDEXES,
    V5_TABLES,
)

if TYPE_CHECKING:
    from legion.ledger.pg_engine import PgDatabase


def _run_all(conn: Connection, statements: Sequence[str]) -> None:
    for sql in statements:
        conn.exec_driver_sql(sql)


def _v0_to_v1(conn: Connection) -> None:
    _run_all(conn, V1_TABLES + V1_INDEXES)


def _v1_to_v2(conn: Connection) -> None:
    """No DDL: the delivered column's domain widened (docs/spec-conformance.md §6.3)."""


def _v2_to_v3(conn: Connection) -> None:
    _run_all(conn, V1_INDEXES + V3_TABLES + V3_INDEXES)


def _v3_to_v4(conn: Connection) -> None:
    """SQLite has no ADD COLUMN IF NOT EXISTS: a file whose user_version was set back still has the column."""
    have = {row[1] for row in conn.exec_driver_sql("PRAGMA table_info(usage)")}
    _run_all(conn, [sql for sql in V4_COLUMNS if sql.split()[5] not in have])


def _v4_to_v5(conn: Connection) -> None:
    _run_all(conn, V5_TABLES + V5_INDEXES)


MIGRATIONS: dict[int, Callable[[Connection], None]] = {
    0: _v0_to_v1, 1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5,
}


def user_version(db: Database | PgDatabase) -> int:
    """The schema version stored in the file (on PostgreSQL: in the table legion_schema)."""
    if not isinstance(db, Database):
        from legion.ledger.pg_migrations import pg_version

        return pg_version(db) or 0
    return int(db.raw.execute("PRAGMA user_version").fetchone()[0])


def _check_version(db: Database, found: int) -> None:
    if found > SCHEMA_VERSION or found < 0:
        raise SchemaVersionError(db.path, found, SCHEMA_VERSION)


def migrate(db: Database | PgDatabase) -> int:
    """Bring the database to SCHEMA_VERSION; returns the version found before migrating."""
    if not isinstance(db, Database):
        from legion.ledger.pg_migrations import pg_migrate  # psycopg is imported only for a PostgreSQL ledger

        return pg_migrate(db)
    found = user_version(db)
    _check_version(db, found)
    if found == SCHEMA_VERSION:
        return found
    with db.core_write() as conn:
        version = int(conn.exec_driver_sql("PRAGMA user_version").scalar_one())
        _check_version(db, version)
        while version < SCHEMA_VERSION:
            step = MIGRATIONS.get(version)
            if step is None:  # pragma: no cover - MIGRATIONS covers 0..SCHEMA_VERSION-1
                raise LedgerError(f"internal: no migration from schema version {version}")
            step(conn)
            version += 1
            conn.exec_driver_sql(f"PRAGMA user_version={version}")
    return found
