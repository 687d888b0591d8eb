"""The fleet-wide budget as a session checks it before each model call (`legion.workers.fleet_gate`): this run's
spend plus the project's other runs' (read again after OTHERS_REFRESH_S), and the spec's `fleetBudget`."""

from __future__ import annotations

import contextlib

import pytest

from legion.ledger import open_ledger
from legion.ledger.fleet_budget import set_reserved
from legion.workers.fleet_gate import OTHERS_REFRESH_S, FleetLimit, OtherRuns, fleet_gate
from legion.workers.session_spec import SpecError, _fleet_budget
from legion.workers.tree_budget import UNKNOWN_COST_USD_PER_MTOK, TreeBudget

pytestmark = pytest.mark.timeout(30)


def test_the_gate_stops_a_turn_once_the_project_s_runs_spent_the_limit(pg_url: str) -> None:
    now = [100.0]
    limit = FleetLimit(1.0, "alpha", TreeBudget(unknown_usd_per_mtok=10.0))
    mine = {"cost_usd": 0.30, "unknown_cost_tokens": 0}
    with contextlib.closing(open_ledger(pg_url, run_id="other")) as other, \
            contextlib.closing(open_ledger(pg_url, run_id="me")) as led:
        other.insert_node(id="root", name="root", role="root", depth=0, status="running")
        set_reserved(other, "other", "alpha", 0.0)
        other.upsert_usage("root", 10, 1, 0.50, 10_000)  # $0.50 + $0.10 of unknown-price tokens
        gate = fleet_gate(limit, lambda: mine, OtherRuns(led, "me", clock=lambda: now[0]))
        assert gate() is None  # 0.30 + 0.60
        other.upsert_usage("root", 10, 1, 0.70, 10_000)
        assert gate() is None  # the other runs' figure is cached for OTHERS_REFRESH_S
        now[0] += OTHERS_REFRESH_S
        refusal = gate()  # 0.30 + 0.80 ≥ 1.00
        assert refusal is not None and refusal.startswith("budget: the fleet-wide cost budget of project 'alpha'")
        assert "$1.1000 of $1.0000" in refusal and "legion.budget.fleetMaxCostUsd" in refusal, refusal
        mine["cost_usd"] = 0.0  # (this run's spend is read fresh at every call)
        assert gate() is None


def test_the_spec_s_fleet_budget() -> None:
    assert _fleet_budget(None) is None
    assert _fleet_budget({"maxCostUsd": 2, "project": "p"}) == FleetLimit(
        2.0, "p", TreeBudget(unknown_usd_per_mtok=UNKNOWN_COST_USD_PER_MTOK))
    for bad in ({"maxCostUsd": 2}, {"project": "p"}, {"maxCostUsd": -1, "project": "p"},
                {"maxCostUsd": 1, "project": "p", "unknownCostPerMTokUsd": float("nan")}, {"maxCost": 1}):
        with pytest.raises(SpecError):
            _fleet_budget(bad)
