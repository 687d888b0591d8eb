"""The ledger side of the fleet-wide budget (`legion.ledger.fleet_budget`) on both backends: the project's fleets row,
this run's reserved_usd (an upsert that keeps the fleet view's columns), what the project's other runs spent and
hold (ended and stale runs' reservations left out, other projects never counted), and on PostgreSQL the indexes
that the spent query uses."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import psycopg
import pytest

from legion.ledger import Ledger, open_ledger
from legion.ledger.fleet_budget import (
    _OTHERS_SPENT,
    STALE_RESERVATION_MS,
    FleetOthers,
    clear_reserved,
    fleet_others,
    lock_fleet,
    set_reserved,
)
from tests.unit.ledger.conftest import RUN, FakeClock, foreign_write

pytestmark = pytest.mark.timeout(60)


def _runs(target: Path | str) -> dict[str, dict[str, Any]]:
    sql = "SELECT run, project, state, host, reserved_usd, started_at, updated_at, ended_at FROM runs"
    if isinstance(target, Path):
        import sqlite3

        con = sqlite3.connect(target)
        con.row_factory = sqlite3.Row
        try:
            return {r["run"]: dict(r) for r in con.execute(sql)}
        finally:
            con.close()
    with psycopg.connect(target) as pg:
        cur = pg.execute(sql)
        cols = [d.name for d in cur.description or ()]
        return {r[0]: dict(zip(cols, r, strict=True)) for r in cur.fetchall()}


def _register(target: Path | str, run: str, project: str, *, updated_at: int, ended_at: int | None = None,
              reserved: float = 0.0) -> None:
    """A runs row as the fleet view writes it (its own columns: host, pid, state, endpoints)."""
    values = (run, project, "h1", reserved, updated_at, updated_at, ended_at)
    foreign_write(target, "INSERT INTO runs (run, project, host, pid, state, reserved_usd, started_at, updated_at, "
                          "ended_at) VALUES (?, ?, ?, 7, 'running', ?, ?, ?, ?)",
                  "INSERT INTO runs (run, project, host, pid, state, reserved_usd, started_at, updated_at, ended_at) "
                  "VALUES (%s, %s, %s, 7, 'running', %s, %s, %s, %s)", values)


def test_set_reserved_makes_the_row_when_missing(ledger: Ledger, target: Path | str, clock: FakeClock) -> None:
    set_reserved(ledger, RUN, "alpha", 0.15)
    row = _runs(target)[RUN]
    assert (row["project"], row["state"], row["reserved_usd"]) == ("alpha", "running", pytest.approx(0.15))
    assert row["started_at"] == row["updated_at"] == clock.now and row["ended_at"] is None


def test_set_reserved_writes_only_its_column_of_a_registered_row(ledger: Ledger, target: Path | str,
                                                                 clock: FakeClock) -> None:
    _register(target, RUN, "alpha", updated_at=clock.now - 1000)
    clock.advance(5)
    set_reserved(ledger, RUN, "ignored", 0.25)
    row = _runs(target)[RUN]
    assert (row["project"], row["host"], row["reserved_usd"]) == ("alpha", "h1", pytest.approx(0.25))
    assert row["started_at"] == clock.now - 1005 and row["updated_at"] == clock.now
    clock.advance(5)
    clear_reserved(ledger, RUN)  # the run ended
    row = _runs(target)[RUN]
    assert row["reserved_usd"] == 0 and row["updated_at"] == clock.now and row["host"] == "h1"


def test_clearing_makes_no_row_for_a_run_that_never_reserved(ledger: Ledger, target: Path | str) -> None:
    clear_reserved(ledger, RUN)
    assert _runs(target) == {}


def test_lock_fleet_makes_the_project_row_once(ledger: Ledger, target: Path | str) -> None:
    for _ in range(2):
        with ledger.transaction():
            lock_fleet(ledger, "alpha")
    if isinstance(target, Path):
        import sqlite3

        con = sqlite3.connect(target)
        try:
            assert con.execute("SELECT project FROM fleets").fetchall() == [("alpha",)]
        finally:
            con.close()
    else:
        with psycopg.connect(target) as pg:
            assert pg.execute("SELECT project FROM fleets").fetchall() == [("alpha",)]


def test_other_live_runs_reservations_count_ended_and_stale_ones_do_not(ledger: Ledger, target: Path | str,
                                                                       clock: FakeClock) -> None:
    now = clock.now
    _register(target, RUN, "alpha", updated_at=now, reserved=0.5)  # this run: never among the others
    _register(target, "live", "alpha", updated_at=now - 1000, reserved=0.10)
    _register(target, "fresh-edge", "alpha", updated_at=now - STALE_RESERVATION_MS, reserved=0.20)
    _register(target, "stale", "alpha", updated_at=now - STALE_RESERVATION_MS - 1, reserved=0.40)
    _register(target, "ended", "alpha", updated_at=now, ended_at=now, reserved=0.80)
    _register(target, "elsewhere", "beta", updated_at=now, reserved=1.60)
    others = fleet_others(ledger, "alpha", RUN)
    assert others.reserved_usd == pytest.approx(0.30) and others.reserving_runs == 2
    assert fleet_others(ledger, "alpha", RUN, reservations=False).reserved_usd == 0
    assert fleet_others(ledger, "nobody", RUN) == FleetOthers()


@pytest.mark.sqlite_only
def test_on_sqlite_the_other_runs_spent_nothing(ledger: Ledger) -> None:
    ledger.insert_node(id="root", name="root", role="root", depth=0, status="running")
    ledger.upsert_usage("root", 10, 1, 0.5, 100)
    set_reserved(ledger, RUN, "alpha", 0.0)
    others = fleet_others(ledger, "alpha", "another-run")  # the file's usage is this run's alone
    assert (others.cost_usd, others.unknown_cost_tokens, others.spent_runs) == (0.0, 0, 0)


# ----- PostgreSQL: many runs in one database -------------------------------------------------------------------


def _run_with_usage(url: str, run: str, project: str, cost: float, unknown: int = 0) -> None:
    with contextlib.closing(open_ledger(url, run_id=run)) as led:
        led.insert_node(id="root", name="root", role="root", depth=0, status="running")
        led.upsert_usage("root", 100, 10, cost, unknown)
        led.insert_node(id="w1", name="w1", role="worker", depth=1, parent_id="root")
        led.upsert_usage("w1", 100, 10, cost, 0)
        set_reserved(led, run, project, 0.0)


def test_the_project_s_other_runs_spent_is_summed_across_runs(pg_url: str) -> None:
    _run_with_usage(pg_url, "a1", "alpha", 0.10, 1000)
    _run_with_usage(pg_url, "a2", "alpha", 0.05)
    _run_with_usage(pg_url, "b1", "beta", 7.0)
    _run_with_usage(pg_url, "me", "alpha", 3.0)
    with contextlib.closing(open_ledger(pg_url, run_id="me")) as led:
        others = fleet_others(led, "alpha", "me")
    assert others.cost_usd == pytest.approx(0.30) and others.unknown_cost_tokens == 1000 and others.spent_runs == 2


def test_the_spent_query_uses_the_indexes(pg_url: str) -> None:
    """A few thousand runs over many projects: the project's runs come from idx_runs_project and their usage from
    the usage key (run, node_id); neither table is scanned whole."""
    with psycopg.connect(pg_url, autocommit=True) as pg:
        with contextlib.closing(open_ledger(pg_url, run_id="seed")):
            pass  # the schema
        pg.execute("INSERT INTO runs (run, project, state, reserved_usd, started_at, updated_at) "
                   "SELECT 'r' || i, 'p' || (i % 200), 'running', 0, 1, 1 FROM generate_series(1, 4000) i")
        pg.execute("INSERT INTO nodes (run, id, name, role, depth, status, created_at, updated_at) "
                   "SELECT 'r' || i, 'n' || j, 'n' || j, 'worker', 0, 'settled', 1, 1 "
                   "FROM generate_series(1, 4000) i, generate_series(1, 3) j")
        pg.execute("INSERT INTO usage (run, node_id, tokens_in, tokens_out, cost_usd, updated_at) "
                   "SELECT run, id, 10, 1, 0.01, 1 FROM nodes")
        pg.execute("ANALYZE runs")
        pg.execute("ANALYZE usage")
        [(plan,)] = pg.execute("EXPLAIN (FORMAT JSON) " + _OTHERS_SPENT.pg, ("p7", "r7")).fetchall()
        spent = pg.execute(_OTHERS_SPENT.pg, ("p7", "r7")).fetchone()
    nodes = list(_plan_nodes(plan[0]["Plan"]))
    assert not [n for n in nodes if n["Node Type"] == "Seq Scan"], plan
    assert {n.get("Index Name") for n in nodes} >= {"idx_runs_project", "usage_pkey"}, plan
    assert spent is not None and spent[2] == 19 and spent[0] == pytest.approx(19 * 3 * 0.01)


def _plan_nodes(node: dict[str, Any]) -> Any:
    yield node
    for child in node.get("Plans", ()):
        yield from _plan_nodes(child)
