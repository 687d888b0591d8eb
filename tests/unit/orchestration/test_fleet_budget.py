"""The fleet-wide budget's rule (`legion.orchestration.fleet_budget`): spent + reserved + this launch's reserve
against `legion.budget.fleetMaxCostUsd` over the project's runs, under the project's row lock — concurrent runs in
one PostgreSQL database never reserve past the limit — and a run's `runs.reserved_usd` following what it holds
through its ledger writer."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import psycopg
import pytest

from legion.ledger import Ledger, open_ledger
from legion.ledger.fleet_budget import set_reserved
from legion.ledger.writer import LedgerWriter
from legion.orchestration.fleet_budget import FleetBudget
from legion.orchestration.refusals import BUDGET_EXCEEDED, ActionRefused
from legion.workers.tree_budget import TreeBudget

pytestmark = pytest.mark.timeout(60)


def _budget(run: str, limit: float, *, shared: bool = True, project: str = "alpha") -> FleetBudget:
    return FleetBudget(project, limit, run, shared, TreeBudget(unknown_usd_per_mtok=10.0))


def _reserve(fb: FleetBudget, led: Ledger, held: float, reserve: float) -> float:
    """One launch's reserving transaction: check, then hold and record (what launch._reserve does)."""
    with led.transaction():
        fb.check(led, held, reserve)
        fb.record(led, held + reserve)
    return held + reserve


def _spend(led: Ledger, cost: float, unknown: int = 0) -> None:
    led.insert_node(id="root", name="root", role="root", depth=0, status="running")
    led.upsert_usage("root", 100, 10, cost, unknown)


def test_a_launch_past_the_project_s_budget_is_refused_with_its_figures(pg_url: str) -> None:
    with contextlib.closing(open_ledger(pg_url, run_id="other")) as other:
        _spend(other, 0.10, 1000)  # $0.10 + 1,000 unknown-price tokens at $10/Mtok = $0.11
        set_reserved(other, "other", "alpha", 0.05)
    with contextlib.closing(open_ledger(pg_url, run_id="b1")) as beta:
        _spend(beta, 5.0)  # another project: never counted
        set_reserved(beta, "b1", "beta", 3.0)
    with contextlib.closing(open_ledger(pg_url, run_id="me")) as led:
        _spend(led, 0.02)
        fb = _budget("me", 0.30)
        held = _reserve(fb, led, 0.0, 0.05)  # 0.13 spent + 0.05 + 0.05
        held = _reserve(fb, led, held, 0.05)  # + 0.05 = 0.28
        with pytest.raises(ActionRefused) as refused:
            _reserve(fb, led, held, 0.05)  # 0.33 > 0.30
    exc = refused.value
    assert exc.code == BUDGET_EXCEEDED and exc.details["scope"] == "fleet-cost"
    assert exc.details["spent"] == pytest.approx(0.13) and exc.details["reserved"] == pytest.approx(0.15)
    assert exc.details["reserved_other_runs"] == pytest.approx(0.05) and exc.details["project"] == "alpha"
    text = str(exc)
    assert "fleet-wide cost budget of project 'alpha'" in text and "legion.budget.fleetMaxCostUsd" in text, text
    assert "spent $0.1300 (this run $0.0200, 1 other runs $0.1100)" in text, text
    assert "this launch's $0.0500 > $0.3000" in text and "1000 tokens at unknown prices" in text, text
    with psycopg.connect(pg_url) as pg:  # the refused launch held nothing: the row keeps what the run holds
        assert pg.execute("SELECT reserved_usd FROM runs WHERE run = 'me'").fetchone() == (pytest.approx(0.10),)


def test_on_sqlite_the_budget_sees_this_run_alone(tmp_path: Path) -> None:
    with contextlib.closing(open_ledger(tmp_path / "legion.db")) as led:
        _spend(led, 0.20)
        fb = _budget("me", 0.30, shared=False)
        held = _reserve(fb, led, 0.0, 0.05)
        with pytest.raises(ActionRefused) as refused:
            _reserve(fb, led, held, 0.06)
    assert "a SQLite ledger: this run alone" in str(refused.value)
    assert refused.value.details["spent"] == pytest.approx(0.20)


def test_concurrent_runs_never_reserve_past_the_limit(pg_url: str) -> None:
    """Six runs, each with its own connection (its own writer thread in a real run), reserve $0.05 at a time
    against one $1.00 project budget as fast as they can: exactly 20 reservations land, and the runs' rows add up
    to the limit."""
    runs = [f"c{i}" for i in range(6)]
    ledgers = [open_ledger(pg_url, run_id=run) for run in runs]
    granted: dict[str, int] = dict.fromkeys(runs, 0)
    errors: list[BaseException] = []
    start = threading.Barrier(len(runs))

    def reserve_all(run: str, led: Ledger) -> None:
        fb, held = _budget(run, 1.00), 0.0
        try:
            start.wait()
            while True:
                try:
                    held = _reserve(fb, led, held, 0.05)
                except ActionRefused:
                    return
                granted[run] += 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reserve_all, args=(run, led)) for run, led in zip(runs, ledgers, strict=True)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(40)
    finally:
        for led in ledgers:
            led.close()
    assert not errors, errors
    assert sum(granted.values()) == 20, granted
    with psycopg.connect(pg_url) as pg:
        (total,) = pg.execute("SELECT sum(reserved_usd) FROM runs WHERE project = 'alpha'").fetchone() or (None,)
    assert total == pytest.approx(1.00)


def test_a_released_reservation_reaches_the_runs_row_through_the_writer(pg_url: str) -> None:
    def row() -> float:
        with psycopg.connect(pg_url) as pg:
            found = pg.execute("SELECT reserved_usd FROM runs WHERE run = 'w1'").fetchone()
        return float(found[0]) if found else -1.0

    held = {"n1": 0.05, "n2": 0.05}
    fb = _budget("w1", 1.0)
    writer = LedgerWriter(pg_url, run_id="w1")
    with contextlib.closing(open_ledger(pg_url, run_id="w1")) as led:
        try:
            fb.publish(writer, led, lambda: sum(held.values()))
            writer.flush(10)  # (flush: landed)
            assert row() == pytest.approx(0.10)
            held.pop("n1")  # a node settled: `held` is read when the write runs
            fb.publish(writer, led, lambda: sum(held.values()))
            writer.flush(10)
            assert row() == pytest.approx(0.05)
        finally:
            writer.close(10)
        fb.publish(writer, led, lambda: 0.0)  # the writer closed (the run is ending): nothing raised
        assert row() == pytest.approx(0.05)
        fb.publish(None, led, lambda: 0.0)  # no writer: written at once
        assert row() == 0
