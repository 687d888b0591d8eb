"""The runs table (ledger/fleet_runs.py) on both backends: a run's row (register, state, heartbeat, ended_at), the
derived `lost` state, the filters, a fleet reader that sees every run, the budget's column left alone, and the
fleet-wide figures and events."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from legion.ledger import Ledger, LedgerError, open_fleet_ledger, open_ledger
from legion.ledger.fleet_runs import HEARTBEAT_ENV, LOST, heartbeat_interval
from tests.unit.ledger.conftest import RUN, FakeClock, foreign_write

pytestmark = pytest.mark.timeout(60)


def _register(led: Ledger, run: str, **fields: object) -> None:
    base: dict[str, object] = {"state": "starting", "project": "proj", "host": "h1", "pid": 42,
                               "control_endpoint": "ipc:///x/op.sock"}
    led.register_run(run, **{**base, **fields})  # type: ignore[arg-type]


def test_a_runs_row_follows_its_states_and_heartbeat(ledger: Ledger, clock: FakeClock) -> None:
    _register(ledger, RUN, monitor_endpoint="tcp://10.0.0.1:7000", server_key="K" * 40)
    started = clock.now
    (row,) = ledger.list_runs(heartbeat_s=5)
    assert (row.run, row.state, row.shown, row.host, row.pid, row.project) == (RUN, "starting", "starting", "h1", 42,
                                                                            "proj")
    assert (row.monitor_endpoint, row.server_key, row.started_at, row.ended_at) == ("tcp://10.0.0.1:7000", "K" * 40,
                                                                                 started, None)
    clock.advance(1000)
    ledger.set_run_state(RUN, "running")
    clock.advance(4000)
    ledger.run_heartbeat(RUN)
    (row,) = ledger.list_runs(heartbeat_s=5)
    assert (row.state, row.updated_at, row.ended_at) == ("running", clock.now, None)
    clock.advance(15_001)  # more than 3 intervals without a heartbeat: lost (derived, never written)
    (row,) = ledger.list_runs(heartbeat_s=5)
    assert (row.state, row.shown) == ("running", LOST)
    assert [r.run for r in ledger.list_runs(state=LOST, heartbeat_s=5)] == [RUN]
    assert ledger.list_runs(state="running", heartbeat_s=5) == []
    ledger.set_run_state(RUN, "paused")  # an end: ended_at, and a stale heartbeat no longer means lost
    clock.advance(60_000)
    (row,) = ledger.list_runs(heartbeat_s=5)
    assert (row.state, row.shown, row.ended_at) == ("paused", "paused", clock.now - 60_000)
    clock.advance(1000)
    _register(ledger, RUN, host="h2", pid=43)  # `legion resume` on another host takes the row over
    (row,) = ledger.list_runs(heartbeat_s=5)
    assert (row.host, row.pid, row.state, row.ended_at, row.started_at) == ("h2", 43, "starting", None, started)


def test_register_leaves_the_budgets_reserved_usd_alone(ledger: Ledger, target: Path | str) -> None:
    _register(ledger, RUN)
    foreign_write(target, "UPDATE runs SET reserved_usd = 1.25 WHERE run = ?",
                  "UPDATE runs SET reserved_usd = 1.25 WHERE run = %s", (RUN,))
    _register(ledger, RUN, state="running")
    ledger.set_run_state(RUN, "settled")
    ledger.run_heartbeat(RUN)
    (row,) = ledger.list_runs()
    assert (row.reserved_usd, row.state) == (1.25, "settled")


def test_the_filters(ledger: Ledger) -> None:
    _register(ledger, RUN, host="h1", project="p1")
    _register(ledger, "other", host="h2", project="p2", state="running")
    assert {r.run for r in ledger.list_runs()} == {RUN, "other"}
    assert [r.run for r in ledger.list_runs(host="h2")] == ["other"]
    assert [r.run for r in ledger.list_runs(project="p1")] == [RUN]
    assert [r.run for r in ledger.list_runs(run="other", state=["running", "lost"])] == ["other"]
    assert ledger.list_runs(run="nope") == []


def test_a_fleet_reader_sees_every_runs_rows(backend: str, target: Path | str, clock: FakeClock) -> None:
    runs = (RUN,) if backend == "sqlite" else (RUN, "run-2")  # a SQLite file holds one run
    for i, run in enumerate(runs):
        with contextlib.closing(open_ledger(target, clock=clock, run_id=run)) as led:
            _register(led, run, host=f"h{i}")
            led.insert_node(id="root", name="root", role="root", depth=0, status="running")
            led.insert_node(id="w1", name="w1", role="worker", depth=1, parent_id="root", status="failed")
            led.upsert_usage("root", 100 * (i + 1), 10, 0.5 * (i + 1))
            for n in range(i + 2):
                led.append_event("root", "node_launched", {"n": n})
    with contextlib.closing(open_fleet_ledger(target, clock=clock)) as fleet:
        assert {r.run for r in fleet.list_runs()} == set(runs)
        figures = fleet.fleet_figures(list(runs))
        assert figures[RUN] == {"nodes": 2, "live": 1, "failed": 1, "tokens_in": 100, "tokens_out": 10,
                                "cost_usd": 0.5}
        events = fleet.fleet_events_after(dict.fromkeys(runs, 0))
        assert [(run, e.data["n"]) for run, e in events if run == RUN] == [(RUN, 0), (RUN, 1)]
        if backend == "postgresql":
            assert figures["run-2"]["cost_usd"] == 1.0
            assert [e.data["n"] for run, e in events if run == "run-2"] == [0, 1, 2]
            first = next(e.id for run, e in events if run == "run-2")
            later = fleet.fleet_events_after({"run-2": first})
            assert [e.data["n"] for _, e in later] == [1, 2]
            assert fleet.list_nodes() == []  # its one-run scope is no run's


def test_heartbeat_interval_from_the_environment() -> None:
    assert heartbeat_interval({}) == 5.0
    assert heartbeat_interval({HEARTBEAT_ENV: "0.2"}) == 0.2
    for bad in ("0", "-1", "nan", "soon"):
        with pytest.raises(LedgerError, match=HEARTBEAT_ENV):
            heartbeat_interval({HEARTBEAT_ENV: bad})
