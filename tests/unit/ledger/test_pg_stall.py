"""The writer's stall report on PostgreSQL (ledger/pg_stall.py): another connection holds the run's write lock or
a node's row, a write waits, and the report names the blocking backend (pid, state, application, query) and the
lock the writer waits for; once the blocker lets go, the write lands."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from legion.ledger import LedgerWriter, open_ledger
from legion.ledger.pg_engine import LOCK_CLASS_RUN
from legion.ledger.pg_stall import blockers
from tests.support import wait_until

from .conftest import RUN

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def url(pg_url: str) -> Iterator[str]:
    with open_ledger(pg_url, run_id=RUN) as led:
        led.insert_node(id="root", name="root", role="root", depth=0, status="running")
    yield pg_url


def _stalled_write(url: str, blocker: psycopg.Connection[object], write: str) -> str:
    """The stall report of a writer whose op waits on what `blocker` holds; the op lands once it commits."""
    reports: list[str] = []
    seen = threading.Event()

    def on_stall(_waited: float, detail: str) -> None:
        reports.append(detail)
        seen.set()

    writer = LedgerWriter(url, run_id=RUN, on_stall=on_stall, stall_after=0.3)
    try:
        if write == "event":
            done = writer.submit(lambda led: led.append_event("root", "node_resumed", {"i": 1}), "an event")
        else:
            done = writer.submit(lambda led: led.update_node("root", phase="reviewing"), "root's phase")
        wait_until(seen.is_set, message="the stall report", deadline=20.0)
        assert not done.done()
        blocker.commit()
        done.result(timeout=20)
    finally:
        assert writer.close()
    return reports[0]


def test_a_write_waiting_on_the_runs_lock_names_the_blocking_backend(url: str) -> None:
    with psycopg.connect(url, application_name="the-blocker") as blocker:
        blocker.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (LOCK_CLASS_RUN, RUN))
        pid = blocker.info.backend_pid
        detail = _stalled_write(url, blocker, "event")
    assert "waits for the run's write lock (advisory" in detail, detail
    assert f"blocked by backend {pid} (idle in transaction, transaction open" in detail, detail
    assert "application 'the-blocker'" in detail and "pg_advisory_xact_lock" in detail, detail
    assert "/proc/locks" not in detail


def test_a_write_waiting_on_a_row_lock_names_the_blocking_backend(url: str) -> None:
    with psycopg.connect(url, application_name="row-holder") as blocker:
        blocker.execute("SELECT * FROM nodes WHERE run = %s AND id = 'root' FOR UPDATE", (RUN,))
        pid = blocker.info.backend_pid
        detail = _stalled_write(url, blocker, "row")
    assert "waits for a transactionid lock (ShareLock)" in detail, detail
    assert f"blocked by backend {pid} (idle in transaction" in detail and "FOR UPDATE" in detail, detail


def test_a_server_that_cannot_be_asked_is_said_not_raised(url: str) -> None:
    gone = url.replace("/t_", "/gone_", 1)
    [line] = blockers(gone, 12345)
    assert line.startswith("cannot ask the PostgreSQL server who blocks the writer's backend 12345") and "gone_" in line
    assert blockers(url, None) == ["the writer has no PostgreSQL connection (it is reconnecting or could not connect)"]
