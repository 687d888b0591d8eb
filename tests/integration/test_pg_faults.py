"""A PostgreSQL server that goes away under a ledger writer (docs/servers.md, "A shared PostgreSQL ledger"): a restart,
a terminated backend, a connection that drops during COMMIT, a server that stays down past the bound. Each test has
a cluster of its own (`own_pg_server`) that it stops and starts; every write lands exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import psycopg
import pytest

from legion.ledger import Ledger, LedgerWriter, open_ledger
from legion.ledger.errors import LedgerConnectError, LedgerUnreachable
from legion.ledger.pg_engine import REQUEST_RETENTION_MS, PgDatabase, close_pool, is_connection_lost
from tests.pg_server import PgServer
from tests.support import wait_until

pytestmark = pytest.mark.timeout(120)

RUN = "faults"


@pytest.fixture
def url(own_pg_server: PgServer) -> Iterator[str]:
    """A ledger on the test's own cluster (removed with it, whether the test left it running or not)."""
    own_pg_server.admin("CREATE DATABASE faults")
    url = own_pg_server.url("faults")
    with contextlib.closing(open_ledger(url, run_id=RUN)) as led:
        led.insert_node(id="root", name="root", role="root", depth=0, status="running")
    yield url
    close_pool(url)


def _db_name(url: str) -> str:
    return url.split("/")[3].split("?")[0]


def _seqs(url: str) -> list[int]:
    """The `seq` of every event the tests wrote, as stored (a duplicate would show twice)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT data FROM events WHERE run = %s AND type = 'node_launched'", (RUN,)).fetchall()
    return sorted(int(json.loads(data)["seq"]) for (data,) in rows)


def _append(seq: int) -> Any:
    return lambda led: led.append_event("root", "node_launched", {"seq": seq})


class Producer:
    """Submits one event write every few ms from its own thread until stopped; keeps every future."""

    def __init__(self, writer: LedgerWriter) -> None:
        self.writer = writer
        self.futures: list[Future[Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            self.futures.append(self.writer.submit(_append(seq), f"event {seq}"))
            seq += 1
            self._stop.wait(0.005)

    def landed(self) -> int:
        return sum(1 for f in self.futures if f.done() and f.exception() is None)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def test_a_writer_keeps_writing_through_restarts_and_terminated_backends(own_pg_server: PgServer, url: str) -> None:
    writer = LedgerWriter(url, run_id=RUN)
    producer = Producer(writer)
    try:
        for fault in ("restart fast", "terminate", "restart immediate", "terminate"):
            before = producer.landed()
            wait_until(lambda b=before: producer.landed() > b + 20, message="writes landing", deadline=60.0)
            if fault == "terminate":
                assert own_pg_server.terminate(_db_name(url)) >= 1
            else:
                own_pg_server.restart(fault.split()[1])
        before = producer.landed()
        wait_until(lambda: producer.landed() > before + 20, message="writes landing after the faults", deadline=60.0)
    finally:
        producer.stop()
        writer.flush(timeout=60)
        assert writer.close(30)
    ids = [f.result() for f in producer.futures]  # every future resolved with its event id: none failed
    assert len(set(ids)) == len(ids)
    assert _seqs(url) == list(range(len(producer.futures)))  # every write landed, exactly once
    assert writer.reconnect_waits >= 1 and writer.retries >= 1


def _cut(db: PgDatabase) -> None:
    """Drop the connection under the client (the server sees the socket close), as a network cut does."""
    sock = socket.socket(fileno=os.dup(db.pg.pgconn.socket))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@pytest.mark.parametrize("committed", [True, False], ids=["committed-before-the-cut", "cut-before-commit"])
def test_a_commit_whose_connection_drops_is_applied_exactly_once(url: str, committed: bool,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cuts: list[str] = []

    def hook(db: PgDatabase) -> None:
        if cuts:
            return
        if committed:  # the server applies the COMMIT, its answer never arrives
            db.pg.execute("COMMIT")
        cuts.append("cut")
        _cut(db)

    writer = LedgerWriter(url, run_id=RUN)
    try:
        monkeypatch.setattr(PgDatabase, "commit_hook", staticmethod(hook))
        first = writer.submit(_append(0), "event 0")
        mail = writer.submit(lambda led: led.send_mail("root", "root", "once", "body").id, "mail")
        assert isinstance(first.result(30), int) and isinstance(mail.result(30), int)
        monkeypatch.setattr(PgDatabase, "commit_hook", None)
        writer.submit(_append(1), "event 1").result(30)
    finally:
        assert writer.close(30)
    assert cuts == ["cut"]
    assert _seqs(url) == [0, 1]
    with contextlib.closing(open_ledger(url, run_id=RUN)) as led:
        assert [m["subject"] for m in led.pending_inbox("root")] == ["once"]
        launched = [e.id for e in led.events_after(0) if e.type == "node_launched"]
    assert launched[0] == first.result()  # the id the caller got is the stored row's


def test_a_server_down_past_the_bound_is_reported_once_and_nothing_is_lost(own_pg_server: PgServer, url: str) -> None:
    reports: list[tuple[float, str]] = []
    writer = LedgerWriter(url, run_id=RUN, on_unreachable=lambda s, d: reports.append((s, d)), unreachable_after=0.5)
    try:
        writer.submit(_append(0)).result(30)
        own_pg_server.halt()
        held = writer.submit(_append(1), "event 1")  # queued while the server is down
        wait_until(lambda: bool(reports), message="the unreachable report", deadline=30.0)
        seconds, detail = reports[0]
        assert seconds >= 0.5 and "unreachable for" in detail and own_pg_server.home.name in detail
        assert not held.done()
        own_pg_server.boot()
        assert isinstance(held.result(30), int)
        assert len(reports) == 1
    finally:
        assert writer.close(30)
    assert _seqs(url) == [0, 1]


def test_an_idle_writer_probes_its_server_and_reports_it_down(own_pg_server: PgServer, url: str) -> None:
    reports: list[str] = []
    writer = LedgerWriter(url, run_id=RUN, on_unreachable=lambda _s, d: reports.append(d), unreachable_after=0.4)
    try:
        writer.flush(30)
        own_pg_server.halt()  # nothing is written: only the probe finds the server gone
        wait_until(lambda: bool(reports), message="the probe's report", deadline=30.0)
        own_pg_server.boot()
        writer.submit(_append(0)).result(30)
    finally:
        writer.close(30)
    assert _seqs(url) == [0]


def test_reads_and_writes_reconnect_and_an_unreachable_server_is_a_clear_error(own_pg_server: PgServer,
                                                                                  url: str) -> None:
    led: Ledger = open_ledger(url, run_id=RUN)
    try:
        assert led.get_node("root") is not None
        own_pg_server.halt()
        with pytest.raises(LedgerUnreachable, match=r"the ledger server at .* cannot be reached"):
            led.get_node("root")
        with pytest.raises(LedgerConnectError, match=r"(?i)is the server running") as refused:
            open_ledger(url, run_id=RUN)
        assert refused.value.unreachable
        own_pg_server.boot()
        assert led.get_node("root") is not None  # a fresh connection, no new Ledger
        led.append_event("root", "node_launched", {"seq": 0})
    finally:
        led.close()
    assert _seqs(url) == [0]


def test_a_read_after_a_restart_finds_the_server_again_at_once(own_pg_server: PgServer, url: str) -> None:
    """The restart is over before the read: the ledger's idle connection is dead but nobody knows yet; the read
    (and a one-shot write, outside any writer) must not fail for it."""
    led: Ledger = open_ledger(url, run_id=RUN)
    try:
        assert led.get_node("root") is not None
        own_pg_server.restart()
        assert led.get_node("root") is not None
        own_pg_server.restart()
        led.append_event("root", "node_launched", {"seq": 0})
    finally:
        led.close()
    assert _seqs(url) == [0]


def test_old_request_ids_are_pruned(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("legion.ledger.pg_engine.PRUNE_EVERY", 3)
    with contextlib.closing(open_ledger(url, run_id=RUN)) as led:
        for seq in range(6):
            with led.transaction(request_id=f"req-{seq}"):
                led.append_event("root", "node_launched", {"seq": seq})
            if seq == 2:  # the first prune has run; the next one finds req-0 and req-1 a day and more old
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("UPDATE applied_requests SET applied_at = applied_at - %s WHERE id IN "
                                 "('req-0', 'req-1')", (REQUEST_RETENTION_MS + 1,))
        assert [led.request_applied(f"req-{seq}") for seq in range(6)] == [False, False, True, True, True, True]
        assert not led.request_applied("never-sent")


@pytest.mark.parametrize(("error", "lost"), [
    (psycopg.errors.AdminShutdown("terminating connection due to administrator command"), True),
    (psycopg.errors.CrashShutdown("crash"), True),
    (psycopg.errors.CannotConnectNow("the database system is starting up"), True),
    (psycopg.errors.ConnectionFailure("connection failure"), True),
    (psycopg.OperationalError("server closed the connection unexpectedly"), True),  # no SQLSTATE: the socket
    (psycopg.errors.QueryCanceled("statement timeout"), False),
    (psycopg.errors.SerializationFailure("could not serialize"), False),
    (psycopg.errors.UniqueViolation("duplicate key"), False),
    (psycopg.errors.UndefinedTable("no such table"), False),
])
def test_only_a_lost_connection_is_retried_on_a_fresh_one(error: psycopg.Error, lost: bool) -> None:
    assert is_connection_lost(error) is lost
