"""Fixtures for the ledger unit tests: a controllable clock and a real ledger on each backend.

Every test that takes `backend` (directly or through `target`, `ledger`, `tree`) runs twice: on a WAL file in a
temp dir (SQLite) and on a fresh database of the session's PostgreSQL cluster. A test marked `sqlite_only`
(it checks SQLite's own machinery: the file, its pragmas, query plans, sqlite3 errors) runs on SQLite alone.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from legion.ledger import Ledger, open_ledger

BACKENDS = ("sqlite", "postgresql")
RUN = "test-run"  # the run id every test ledger is opened with (a PostgreSQL database is shared by runs)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        only = metafunc.definition.get_closest_marker("sqlite_only") is not None
        metafunc.parametrize("backend", ("sqlite",) if only else BACKENDS)


class FakeClock:
    """Epoch-ms clock the test moves by hand."""

    def __init__(self, start: int = 1_800_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "legion.db"


@pytest.fixture
def target(backend: str, db_path: Path, request: pytest.FixtureRequest) -> Path | str:
    """Where the test's ledger lives: the SQLite file, or a fresh PostgreSQL database's URL."""
    if backend == "sqlite":
        return db_path
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def ledger(target: Path | str, clock: FakeClock) -> Iterator[Ledger]:
    led = open_ledger(target, clock=clock, run_id=RUN)
    yield led
    led.close()


@pytest.fixture
def tree(ledger: Ledger) -> Ledger:
    """root -> team -> (w1, w2)."""
    ledger.insert_node(id="root", name="root", role="root", depth=0, status="running")
    ledger.insert_node(id="team", name="team-a", role="centurion", depth=1, parent_id="root")
    ledger.insert_node(id="w1", name="w1", role="worker", depth=2, parent_id="team")
    ledger.insert_node(id="w2", name="w2", role="worker", depth=2, parent_id="team")
    return ledger


def foreign_write(target: Path | str, sqlite_sql: str, pg_sql: str, params: tuple[Any, ...] = ()) -> None:
    """A write by another program on its own connection (the ledger's checks are not in its way)."""
    if isinstance(target, Path):
        con = sqlite3.connect(target)
        try:
            con.execute(sqlite_sql, params)
            con.commit()
        finally:
            con.close()
        return
    with psycopg.connect(target, autocommit=True) as pg:
        pg.execute(pg_sql, params)  # type: ignore[arg-type]
