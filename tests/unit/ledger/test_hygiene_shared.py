"""Hygiene on a shared PostgreSQL ledger (ledger/hygiene.py): removing an old run directory deletes its run's rows
in one transaction (or keeps them with keep_shared_rows), never the rows of a run that wrote within the retention
window (it may be running on another host) nor of any other run; a server that cannot be reached keeps the
directory; the orphan scan and the event trim of one run's ledger touch that run's rows only."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from legion.ledger import LedgerError, open_ledger, write_run_json
from legion.ledger.hygiene import forget_run, run_hygiene
from legion.ledger.owner import owner_record

pytestmark = pytest.mark.timeout(60)
DAY = 86_400_000
NOW = int(time.time() * 1000)
OLD = NOW - 20 * DAY  # beyond the 14 days of retention


@pytest.fixture(scope="module")
def dead_owner() -> dict[str, Any]:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        return owner_record(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def _record(url: str, run_id: str, at: int) -> None:
    """A finished run's rows of every table, written at `at`."""
    with contextlib.closing(open_ledger(url, run_id=run_id, clock=lambda: at)) as led:
        led.insert_node(id="root", name="root", role="root", depth=0, status="settled")
        led.insert_node(id="w1", name="w1", role="worker", depth=1, parent_id="root", status="settled")
        led.append_event("w1", "node_settled", {"reason": "normal"})
        led.upsert_usage("w1", 10, 5, 0.01)
        led.send_mail("w1", "root", "done", "w1 is done")
        artifact = led.record_artifact(node_id="w1", name="notes", round=1, bytes=3)
        led.record_consumption(artifact, "root", 3)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO runs (run, state, started_at, updated_at) VALUES (%s, 'settled', %s, %s)",
                     (run_id, at, at))


def _rows(url: str) -> dict[str, int]:
    """Rows per run over every run-scoped table."""
    tables = ("nodes", "events", "usage", "messages", "artifacts", "consumptions", "runs")
    union = " UNION ALL ".join(f"SELECT run FROM {t}" for t in tables)
    with psycopg.connect(url) as conn:
        return dict(conn.execute(f"SELECT run, count(*) FROM ({union}) AS r GROUP BY run").fetchall())


def _run_dir(runs: Path, run_id: str, url: str, owner: dict[str, Any]) -> Path:
    run_dir = runs / run_id
    run_dir.mkdir(parents=True)
    write_run_json(run_dir, {"runId": run_id, "ledger": url, "owner": owner})
    (run_dir / "root.jsonl").write_text("{}\n")
    then = (NOW - 15 * DAY) / 1000
    for path in (run_dir, *run_dir.iterdir()):
        os.utime(path, (then, then))
    return run_dir


def test_an_old_run_dir_takes_its_rows_and_only_its_rows(tmp_path: Path, pg_url: str,
                                                         dead_owner: dict[str, Any]) -> None:
    runs = tmp_path / "runs"
    for run_id, at in (("gone", OLD), ("busy", NOW - DAY), ("elsewhere", OLD)):
        _record(pg_url, run_id, at)
    before = _rows(pg_url)
    gone, busy = _run_dir(runs, "gone", pg_url, dead_owner), _run_dir(runs, "busy", pg_url, dead_owner)
    report = run_hygiene(None, runs, now_ms=NOW)
    assert report.run_dirs_removed == [str(gone)] and report.errors == []
    assert report.rows_deleted == {"gone": before["gone"]} and before["gone"] == 9
    assert busy.is_dir() and any("run busy wrote to" in s for s in report.skipped_live)
    assert _rows(pg_url) == {"busy": before["busy"], "elsewhere": before["elsewhere"]}


def test_keep_shared_rows_removes_the_dir_and_keeps_the_rows(tmp_path: Path, pg_url: str,
                                                             dead_owner: dict[str, Any]) -> None:
    _record(pg_url, "gone", OLD)
    gone = _run_dir(tmp_path / "runs", "gone", pg_url, dead_owner)
    report = run_hygiene(None, tmp_path / "runs", now_ms=NOW, keep_shared_rows=True)
    assert report.run_dirs_removed == [str(gone)] and report.rows_deleted == {}
    assert _rows(pg_url)["gone"] == 9


def test_a_server_that_cannot_be_reached_keeps_the_dir(tmp_path: Path, pg_url: str,
                                                       dead_owner: dict[str, Any]) -> None:
    gone = _run_dir(tmp_path / "runs", "gone", pg_url.replace("/t_", "/missing_", 1), dead_owner)
    report = run_hygiene(None, tmp_path / "runs", now_ms=NOW)
    assert gone.is_dir() and report.run_dirs_removed == []
    [error] = report.errors
    assert error.startswith(f"kept {gone}: its rows in ") and "does not exist" in error


def test_forget_run_refuses_a_sqlite_ledger(tmp_path: Path) -> None:
    with contextlib.closing(open_ledger(tmp_path / "legion.db")) as led, pytest.raises(LedgerError, match="own SQLite"):
        forget_run(led, quiet_since=NOW)


def test_orphan_scan_and_event_trim_touch_only_their_runs_rows(tmp_path: Path, pg_url: str,
                                                               dead_owner: dict[str, Any]) -> None:
    runs = tmp_path / "runs"
    for run_id in ("a", "b"):
        (runs / run_id).mkdir(parents=True)
        write_run_json(runs / run_id, {"runId": run_id, "ledger": pg_url, "owner": dead_owner})
        with contextlib.closing(open_ledger(pg_url, run_id=run_id, clock=lambda: OLD)) as led:
            led.insert_node(id="root", name="root", role="root", depth=0, run_id=run_id, status="running")
            for n in range(3):
                led.append_event("root", "node_resumed", {"n": n})
    with contextlib.closing(open_ledger(pg_url, run_id="a")) as led:
        report = run_hygiene(led, runs, current_run=runs / "a", now_ms=NOW, event_max_rows=1,
                             retention_days=float("inf"))
    # 3 events and the scan's 2 (orphan_detected, node_abandoned): the newest is kept
    assert report.nodes_abandoned == ["root"] and report.events_trimmed == 4 and report.errors == []
    with psycopg.connect(pg_url) as conn:
        status = dict(conn.execute("SELECT run, status FROM nodes").fetchall())
        events = dict(conn.execute("SELECT run, count(*) FROM events GROUP BY run").fetchall())
    assert status == {"a": "failed", "b": "running"}
    assert events == {"a": 1, "b": 3}
