"""Following events without polling (ledger/event_wait.py): on PostgreSQL a follower waits on LISTEN legion_events
and is woken by the NOTIFY that another process's event insert sends at its commit, long before the safety poll;
another run's notice does not wake a follower of one run; on SQLite the file's data_version wakes it. Then
`legion events --ledger URL --follow` through the CLI, picking up a run that starts while it follows, and the fleet
view's errors: a bad URL, an unreachable server, --ledger with no URL, filters without --ledger."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from legion.ledger import open_ledger
from legion.ledger.event_wait import PgEventWaiter, SqliteEventWaiter
from legion.ledger.target import PgTarget, parse_target
from tests.integration.cli_support import LEGION, env, json_lines, legion_here
from tests.support import wait_until

pytestmark = pytest.mark.timeout(90)

WRITE_EVENT = """
import sys, time, contextlib
from legion.ledger import open_ledger
time.sleep(float(sys.argv[3]))
with contextlib.closing(open_ledger(sys.argv[1], run_id=sys.argv[2])) as led:
    led.register_run(sys.argv[2], state="running", host="elsewhere")
    if led.get_node("root") is None:
        led.insert_node(id="root", name="root", role="root", depth=0, status="running")
    led.append_event("root", "node_launched", {"from": "another process"})
"""


def _write_event(target: str, run: str, delay: float = 0.0) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", WRITE_EVENT, target, run, str(delay)])


def test_a_postgresql_follower_wakes_on_the_notify_not_the_poll(pg_url: str) -> None:
    target = parse_target(pg_url)
    assert isinstance(target, PgTarget)
    waiter = PgEventWaiter(target, ["n1"], safety_s=60.0)
    try:
        writer = _write_event(pg_url, "n1", delay=0.3)
        started = time.monotonic()
        assert waiter.wait(50.0) is True
        woke = time.monotonic() - started
        assert writer.wait(30) == 0
        assert waiter.notices == 1 and woke < 15.0, f"woke after {woke:.2f}s"  # the safety poll is 60 s away
        with contextlib.closing(open_ledger(pg_url, run_id="n1")) as led:
            assert [e.data for e in led.events_after(0)] == [{"from": "another process"}]
        assert _write_event(pg_url, "n2").wait(30) == 0  # another run's notice
        assert waiter.wait(1.0) is False and waiter.notices == 1
    finally:
        waiter.close()


def test_a_sqlite_follower_wakes_on_data_version(tmp_path: Path) -> None:
    db = tmp_path / "legion.db"
    open_ledger(db).close()
    waiter = SqliteEventWaiter(db)
    try:
        assert waiter.wait(0.3) is False
        assert _write_event(str(db), "s1").wait(30) == 0
        assert waiter.wait(10.0) is True
    finally:
        waiter.close()


def test_events_follow_across_runs_through_the_cli(pg_url: str, tmp_path: Path) -> None:
    assert _write_event(pg_url, "f1").wait(30) == 0
    out = tmp_path / "follow.jsonl"
    with out.open("w") as sink:
        follower = subprocess.Popen([*LEGION, "events", "--ledger", pg_url, "--follow", "--json", "--idle", "60"],
                                    stdout=sink, stderr=subprocess.PIPE, text=True, env=env())
    try:
        def runs_seen() -> set[str]:
            return {e["run"] for e in json_lines(out.read_text())}

        wait_until(lambda: runs_seen() == {"f1"}, deadline=30, message="the first run's event")
        started = time.monotonic()
        assert _write_event(pg_url, "f2").wait(30) == 0  # a run that starts while the follower waits
        wait_until(lambda: runs_seen() == {"f1", "f2"}, deadline=30, message="the new run's event")
        assert time.monotonic() - started < 20.0
        assert follower.poll() is None
    finally:
        follower.terminate()
        follower.wait(10)


def test_the_fleet_views_errors(pg_url: str, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEGION_LEDGER_URL", raising=False)
    bad = legion_here(None, capsys, "status", "--ledger", "mysql://u@h/db")
    assert bad.returncode == 2 and "not supported" in bad.stderr
    gone = legion_here(None, capsys, "status", "--ledger", "postgresql://u@127.0.0.1:1/db?connect_timeout=2")
    assert gone.returncode == 3 and "Check the host and port" in gone.stderr
    alone = legion_here(None, capsys, "summary", "--ledger")
    assert alone.returncode == 2 and "LEGION_LEDGER_URL" in alone.stderr
    monkeypatch.setenv("LEGION_LEDGER_URL", pg_url)
    assert legion_here(None, capsys, "status", "--ledger", "--json").returncode == 0
    unfiltered = legion_here(None, capsys, "status", "--host", "h1")
    assert unfiltered.returncode == 2 and "add --ledger" in unfiltered.stderr
    both = legion_here(None, capsys, "events", "r1", "--ledger", pg_url)
    assert both.returncode == 2 and "--run r1" in both.stderr
    unknown = legion_here(None, capsys, "monitor", "--ledger", pg_url, "--run", "ghost")
    assert unknown.returncode == 2 and "no run 'ghost'" in unknown.stderr
    nothing = legion_here(None, capsys, "monitor")
    assert nothing.returncode == 2 and "--ledger URL --run ID" in nothing.stderr
