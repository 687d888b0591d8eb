"""The fleet-wide budget across real runs (docs/servers.md "Fleet-wide budget"): two `legion run`s of one project
record into one PostgreSQL database and share `legion.budget.fleetMaxCostUsd`. Once the first run has spent and
reserved it, the second run's launch is refused, naming the fleet budget and its figures; a run of another project
in the same database is not affected; the first run's reservation is back to 0 when it ends."""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg
import pytest

from legion.ledger import open_ledger
from tests.e2e.harness import Project, call, final_text, kill_tree, launch, project, subagent, tools
from tests.support import wait_until

pytestmark = pytest.mark.timeout(120)

LIMIT = 0.31  # the first run: $0.20 spent + the root's $0.05 + its child's $0.05 held fits; nothing more does


def _settings(proj: Project, name: str) -> None:
    proj.settings({"legion": {"project": name, "budget": {"fleetMaxCostUsd": LIMIT}}})


def _first_run_holds(url: str) -> bool:
    """r1's root spent its $0.20 and its child c1 holds its reservation (root + c1: $0.10)."""
    try:
        with psycopg.connect(url) as pg:
            spent = pg.execute("SELECT coalesce(sum(cost_usd), 0) FROM usage WHERE run = 'r1'").fetchone()
            held = pg.execute("SELECT reserved_usd FROM runs WHERE run = 'r1'").fetchone()
    except psycopg.errors.UndefinedTable:  # the run has not made the schema yet
        return False
    return bool(spent and held and spent[0] >= 0.2 - 1e-9 and abs(held[0] - 0.10) < 1e-9)


def test_a_second_run_of_the_project_is_refused_once_the_first_spent_the_fleet_budget(pg_url: str) -> None:
    with project() as proj:
        _settings(proj, "alpha")
        gate = proj.dir / "gate"
        child = proj.script("c1", tools(call("bash", {"command": f"until [ -e {gate} ]; do sleep 0.05; done"})),
                            {"text": "c1 done"})
        first = launch({"name": "c1", "agent": "worker", "task": "wait for the gate", "model": child})
        first["usage"] = {"input": 100, "output": 10, "cost": 0.20}
        root = proj.script("root", first, subagent("wait"), {"text": "r1 done"})
        r1, _ = proj.start("spend and hold", "--model", root, "--ledger", pg_url, run_id="r1")
        try:
            wait_until(lambda: _first_run_holds(pg_url), 60, "r1 spent $0.20 and holds $0.10")

            second = proj.run("refused", "--model", proj.script("root2", {"text": "never"}), "--ledger", pg_url,
                              run_id="r2")
            assert second.code == 2, second.explain()
            said = second.stdout  # the run's summary: refused, and why
            assert "refused" in said and "BUDGET_EXCEEDED: the fleet-wide cost budget of project 'alpha'" in said, said
            assert "spent $0.2000 (this run $0.0000, 1 other runs $0.2000)" in said, said
            assert "reserved $0.1000 (this run $0.0000, 1 other live runs $0.1000)" in said, said
            assert f"> ${LIMIT:.4f} (legion.budget.fleetMaxCostUsd" in said, said
            with contextlib.closing(open_ledger(pg_url, run_id="r2")) as led:
                refusals = [e.data for e in led.events_after(0) if e.type == "budget_refused"]
                assert led.list_nodes() == []  # the refused launch created nothing
            assert [(r["scope"], r["project"]) for r in refusals] == [("fleet-cost", "alpha")], refusals
            assert refusals[0]["spent"] == pytest.approx(0.20) and refusals[0]["reserved"] == pytest.approx(0.10)

            _settings(proj, "beta")  # another project in the same database: its own budget, untouched
            other = proj.run("beta's run", "--model", proj.script("beta", {"text": "beta done"}), "--ledger", pg_url,
                             run_id="b1")
            assert other.code == 0, other.explain()

            gate.touch()
            assert r1.wait(60) == 0, r1.stderr.read() if r1.stderr else ""
        except BaseException:
            kill_tree(r1)
            raise
        assert final_text(proj.run_path("r1") / "root.jsonl") == "r1 done"
        with psycopg.connect(pg_url) as pg:
            rows = dict(pg.execute("SELECT run, reserved_usd FROM runs").fetchall())
            projects = dict(pg.execute("SELECT run, project FROM runs").fetchall())
        assert rows["r1"] == 0 and rows["b1"] == 0, rows  # an ended run holds nothing
        assert projects["r1"] == "alpha" and projects["b1"] == "beta", projects


def test_a_running_session_stops_once_the_project_s_runs_spent_the_fleet_budget(pg_url: str) -> None:
    """The check before each model call: r1 spent $0.30 of the project's $0.50; r2's root spends $0.10 a turn, so
    its third turn would start with the project's $0.50 spent and its run ends (reason `budget`) there."""
    with project() as proj:
        proj.settings({"legion": {"project": "alpha", "budget": {"fleetMaxCostUsd": 0.5}}})
        spent = proj.script("spent", {"text": "r1 done", "usage": {"input": 10, "output": 1, "cost": 0.3}})
        first = proj.run("spend", "--model", spent, "--ledger", pg_url, run_id="r1")
        assert first.code == 0, first.explain()

        def turn(i: int) -> dict[str, Any]:
            return {**tools(call("bash", {"command": f"echo turn {i}"})),
                    "usage": {"input": 10, "output": 1, "cost": 0.1}}

        root = proj.script("root", turn(0), turn(1), turn(2),
                           {"text": "this turn is over the budget", "usage": {"input": 10, "output": 1, "cost": 0.1}})
        out = proj.run("spend more", "--model", root, "--ledger", pg_url, "--timeout", "30", run_id="r2")
        said = out.stdout + out.stderr
        assert "this turn is over the budget" not in final_text(out.run_dir / "root.jsonl"), said
        assert "fleet-wide cost budget of project 'alpha' is spent" in said, said
        with contextlib.closing(open_ledger(pg_url, run_id="r2")) as led:
            assert led.usage_totals()["cost_usd"] == pytest.approx(0.2)


def test_on_sqlite_the_fleet_budget_limits_the_run_alone_and_says_so() -> None:
    with project() as proj:
        proj.settings({"legion": {"budget": {"fleetMaxCostUsd": 0.04}}})  # below one launch's $0.05
        out = proj.run("refused", "--model", proj.script("root", {"text": "never"}))
        assert out.code == 2, out.explain()
        assert "a fleet-wide budget needs a shared PostgreSQL ledger (legion.ledger.url)" in out.stderr, out.stderr
        assert out.stderr.count("a fleet-wide budget needs") == 1, out.stderr
        assert "fleet-wide cost budget of project" in out.stdout and "a SQLite ledger: this run alone" in out.stdout
