"""A ledger statement in both dialects: the SQLite text (what the SQLite connection runs, unchanged) and its
PostgreSQL form, which carries the run.

`Sql` is a `str` (the SQLite text), so the SQLite path hands it to sqlite3 as it always did, with no lookup.
The PostgreSQL connection (pg_engine.PgRaw) runs `.pg` and refuses a plain string that is not transaction
control: a statement without a PostgreSQL form would read or write every run's rows in a shared database.

On PostgreSQL every table has a `run` column, part of every key; each connection carries its run in the
setting `legion.run` (set when a Ledger checks the connection out), and every statement names it as `RUN`.
Parameters are positional in both forms and in the same order, so a caller passes one tuple to either.

Text and U+0000 (NUL), one rule on both backends so that their rows and reports agree (PostgreSQL's text cannot
hold a NUL at all; SQLite would store it): a JSON column (event data) keeps it, escaped by JSON as `\u0000`
and read back unchanged; mail refuses it (MAIL_INVALID_TEXT, docs/spec-conformance.md §6.1); every other free
text column (a node's task summary, role, model, team, phase and paths, an artifact's path) stores it as U+FFFD
(`plain_text`). Those are labels and a 500-character summary of the task, whose full text the run's launch
record keeps, and a path cannot hold a NUL: the mark shows where one was.
"""

from __future__ import annotations

from typing import Final

RUN: Final = "current_setting('legion.run')"
NUL_MARK: Final = "\ufffd"  # what a NUL in a free text column is stored as (the module doc)


def plain_text(value: object) -> object:
    """`value` as a free text column stores it: a string's NULs become U+FFFD; anything else is unchanged."""
    if isinstance(value, str) and "\x00" in value:
        return value.replace("\x00", NUL_MARK)
    return value


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
