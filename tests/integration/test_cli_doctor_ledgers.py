"""`legion doctor runtime` and `errors` read a run's ledger wherever it is: its legion.db, or its rows in the
PostgreSQL database its run.json names (only that run's rows); a ledger that cannot be read is a problem with a
fix, never a crash or a silent "no failures"."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from legion.cli.doctor_sections import errors_checks, runtime_checks
from legion.ledger import open_ledger, write_run_json
from legion.ledger.location import LEDGER_FILE
from legion.ledger.owner import owner_record

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest) -> str | None:
    return None if request.param == "sqlite" else str(request.getfixturevalue("pg_url"))


def _run(cwd: Path, run_id: str, url: str | None, *, live: bool) -> Path:
    """A run directory whose run.json names its ledger (and this process as its owner when `live`), with a
    stale running node, a fresh one and a failure recorded."""
    run_dir = cwd / ".legion" / "runs" / run_id
    run_dir.mkdir(parents=True)
    data: dict[str, object] = {"runId": run_id, **({"ledger": url} if url else {})}
    if live:
        data["owner"] = owner_record()
    write_run_json(run_dir, data)
    clock = [1_000]  # a long time ago: w1's heartbeat is stale
    with contextlib.closing(open_ledger(url or run_dir / LEDGER_FILE, run_id=run_id, clock=lambda: clock[0])) as led:
        led.insert_node(id="root", name="root", role="root", depth=0, status="running")
        led.insert_node(id="w1", name="w1", role="worker", depth=1, parent_id="root", status="running")
        led.append_event("w1", "node_failed", {"reason": f"boom in {run_id}"})
    return run_dir


def test_runtime_and_errors_read_the_runs_own_rows(tmp_path: Path, url: str | None) -> None:
    if url is not None:  # another run in the same database: its rows are not this run's
        _run(tmp_path / "elsewhere", "other", url, live=True)
    _run(tmp_path, "r1", url, live=True)
    runtime = {c.name: c for c in runtime_checks(tmp_path)}
    assert runtime["run r1"].status == "ok"
    assert runtime["node w1"].status == "warn" and "no heartbeat" in runtime["node w1"].detail
    assert "legion stop r1 w1" in runtime["node w1"].fix
    errors = errors_checks(tmp_path)
    assert [(c.name, c.status, c.detail) for c in errors] == [("node_failed", "warn", "w1: boom in r1")]


def test_a_postgresql_ledger_that_cannot_be_read_is_a_problem_with_a_fix(tmp_path: Path, pg_url: str) -> None:
    run_dir = _run(tmp_path, "r1", pg_url, live=True)
    gone = pg_url.replace("/t_", "/gone_", 1)  # a database that does not exist
    write_run_json(run_dir, {"runId": "r1", "ledger": gone, "owner": owner_record()})
    for checks in (runtime_checks(tmp_path), errors_checks(tmp_path)):
        [problem] = [c for c in checks if c.name == "ledger r1"]
        assert problem.status == "warn" and "does not exist" in problem.detail and "LEGION_LEDGER_PASSWORD" in problem.fix
