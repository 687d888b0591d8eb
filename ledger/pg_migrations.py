"""Migrations of a PostgreSQL ledger: the steps of migrations.py with pg_schema's DDL, the version in the table
`legion_schema`. Each step and its version bump commit together (PostgreSQL DDL is transactional); concurrent
openers, of any run, serialise on one advisory lock and re-read the version inside it, so one process
migrates. A newer database is refused, and so is one that holds other tables but no version: it is not a
legion ledger, and nothing is written to it."""

from __future__ import annotations

from legion.ledger.constants import SCHEMA_VERSION
from legion.ledger.errors import NotALedgerError, SchemaVersionError
from legion.ledger.pg_engine import LOCK_CLASS_MIGRATE, PgDatabase
from legion.ledger.pg_schema import STEPS, VERSION_DDL, VERSION_TABLE

# a query of pg_tables, not to_regclass(): the name lookup may use a catalog cache that has not yet seen the table
# another opener just committed, while a query takes a fresh snapshot
_HAS_VERSION_TABLE = (
    f"SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = current_schema() AND tablename = '{VERSION_TABLE}')"
)
_TABLES_HERE = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename"


def pg_version(db: PgDatabase) -> int | None:
    """The stored schema version, None when the database has no version table."""
    if not db.pg.execute(_HAS_VERSION_TABLE).fetchone()[0]:  # type: ignore[index]
        return None
    row = db.pg.execute(f"SELECT version FROM {VERSION_TABLE}").fetchone()
    return int(row[0]) if row is not None else 0


def _check(db: PgDatabase, found: int) -> None:
    if found > SCHEMA_VERSION or found < 0:
        raise SchemaVersionError(db.path, found, SCHEMA_VERSION)


def _adopt(db: PgDatabase) -> int:
    """Make an empty database a v0 ledger; refuse one that holds anything else."""
    tables = [row[0] for row in db.pg.execute(_TABLES_HERE).fetchall()]
    if tables:
        raise NotALedgerError(db.path, tables)
    db.pg.execute(VERSION_DDL)
    db.pg.execute(f"INSERT INTO {VERSION_TABLE} (version) VALUES (0)")
    return 0


def pg_migrate(db: PgDatabase) -> int:
    """Bring the database to SCHEMA_VERSION; returns the version found before (0 for a new ledger)."""
    found = pg_version(db)
    if found is not None:
        _check(db, found)
        if found == SCHEMA_VERSION:
            return found
    db.raw.execute("BEGIN")
    try:
        db.pg.execute(f"SELECT pg_advisory_xact_lock({LOCK_CLASS_MIGRATE}, 0)")
        version = pg_version(db)
        version = _adopt(db) if version is None else version
        _check(db, version)
        first = version
        while version < SCHEMA_VERSION:
            for sql in STEPS[version]:
                db.pg.execute(sql)
            version += 1
            db.pg.execute(f"UPDATE {VERSION_TABLE} SET version = %s", (version,))
    except BaseException:
        db.raw.execute("ROLLBACK")
        raise
    db.raw.execute("COMMIT")
    return first if found is None else found
