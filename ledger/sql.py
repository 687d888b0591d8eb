"""A ledger statement in both dialects: the SQLite text (what the SQLite connection runs, unchanged) and its
PostgreSQL form, which carries the run.

`Sql` is a `str` (the SQLite text), so the SQLite path hands it to sqlite3 as it always did, with no lookup.
The PostgreSQL connection (pg_engine.PgRaw) runs `.pg` and refuses a plain string that is not transaction
control: a statement without a PostgreSQL form would read or write every run's rows in a shared database.

On PostgreSQL every table has a `run` column, part of every key; each connection carries its run in the
setting `legion.run` (set when a Ledger checks the connection out), and every statement names it as `RUN`.
Parameters are positional in both forms and in the same order, so a caller passes one tuple to either.
"""

from __future__ import annotations

from typing import Final

RUN: Final = "current_setting('legion.run')"


class Sql(str):
    """SQLite text (the str itself) plus `pg`, the PostgreSQL text; `returns_id`: `pg` ends in RETURNING id (or says so:
    a statement whose first column is the new id), whose value the PostgreSQL cursor reports as `lastrowid` (what
    sqlite3 gives for an INSERT)."""

    pg: str
    returns_id: bool

    def __new__(cls, sqlite: str, pg: str, *, returns_id: bool | None = None) -> Sql:
        self = super().__new__(cls, sqlite)
        self.pg = pg
        self.returns_id = pg.rstrip().upper().endswith("RETURNING ID") if returns_id is None else returns_id
        return self


class IntegrityViolation(Exception):
    """A constraint refused a PostgreSQL statement (what sqlite3.IntegrityError is on SQLite); `kind` is
    'unique', 'foreign key', 'check' or 'not null'."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


def constraint_kind(exc: Exception) -> str:
    """'unique', 'foreign key' or another kind, for sqlite3.IntegrityError and IntegrityViolation alike."""
    if isinstance(exc, IntegrityViolation):
        return exc.kind
    text = str(exc)
    if "UNIQUE" in text:
        return "unique"
    if "FOREIGN KEY" in text:
        return "foreign key"
    return "other"
