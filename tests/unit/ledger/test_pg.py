"""The PostgreSQL ledger's own rules: many runs in one database, the transaction mapping, and bad input (a wrong
URL, wrong credentials, a newer schema, a database that is not a ledger) refused with the fix and nothing lost."""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
import time
from pathlib import Path

import psycopg
import pytest

from legion.ledger import SCHEMA_VERSION, LedgerError, SchemaVersionError, open_ledger
from legion.ledger.errors import LedgerConnectError, LedgerUrlError, NotALedgerError
from legion.ledger.pg_engine import LOCK_CLASS_RUN
from legion.ledger.pg_schema import REQUESTS_TABLE, VERSION_TABLE
from legion.ledger.schema import ALL_TABLES, FLEET_TABLES
from tests.pg_server import PASSWORD, PgServer

from .conftest import FakeClock

pytestmark = pytest.mark.timeout(60)


def _tree(url: str, run: str, clock: FakeClock) -> None:
    led = open_ledger(url, run_id=run, clock=clock)
    try:
        led.insert_node(id="root", name="root", role="root", depth=0, status="running")
        led.insert_node(id="w1", name="w1", role="worker", depth=1, parent_id="root")
        led.append_event("w1", "node_launched", {"run": run})
        led.upsert_usage("w1", 10, 1, 0.5)
        led.send_mail("w1", "root", f"from {run}", "body")
        led.record_artifact(node_id="w1", name="w1", round=1, bytes=3)
    finally:
        led.close()


def test_runs_share_one_database_and_see_only_their_own_rows(pg_url: str, clock: FakeClock) -> None:
    _tree(pg_url, "run-a", clock)
    _tree(pg_url, "run-b", clock)  # the same node ids, names and artifact round: keys carry the run
    a, b = open_ledger(pg_url, run_id="run-a"), open_ledger(pg_url, run_id="run-b")
    try:
        assert [n["id"] for n in a.list_nodes()] == ["root", "w1"] == [n["id"] for n in b.list_nodes()]
        assert [e.data.get("run") for e in a.events_after(0)] == ["run-a", None]  # node_launched, mail_sent
        assert [e.data.get("run") for e in b.events_after(0)] == ["run-b", None]
        assert a.usage_totals()["tokens_in"] == 10 and [r["level"] for r in a.subtree("root")] == [0, 1]
        assert [m["subject"] for m in a.pending_inbox("root")] == ["from run-a"]
        a.update_node("w1", status="settled")
        assert b.get_node("w1")["status"] == "starting"  # type: ignore[index]
        assert len(a.list_artifacts()) == len(b.list_artifacts()) == 1
        b_mail = b.pending_inbox("root")[0]["id"]
        assert a.get_message(b_mail) is None and a.claim_for_delivery(b_mail) is None  # another run's mail
    finally:
        a.close()
        b.close()


def test_a_statement_without_the_run_never_reaches_the_database(pg_url: str) -> None:
    led = open_ledger(pg_url, run_id="run-a")
    try:
        with pytest.raises(LedgerError, match="without a PostgreSQL form"), led.transaction():
            led._db.raw.execute("DELETE FROM nodes")
    finally:
        led.close()


def test_a_claim_skips_a_row_another_transaction_holds(pg_url: str, clock: FakeClock) -> None:
    _tree(pg_url, "run-a", clock)
    led = open_ledger(pg_url, run_id="run-a", clock=clock)
    try:
        mid = led.pending_inbox("root")[0]["id"]
        with psycopg.connect(pg_url) as other:  # a transaction, open until the block ends
            other.execute("SELECT 1 FROM messages WHERE run = 'run-a' AND id = %s FOR UPDATE", (mid,))
            started = time.monotonic()
            assert led.claim_for_delivery(mid) is None  # SKIP LOCKED: no wait for the holder
            assert time.monotonic() - started < 2
        assert led.claim_for_delivery(mid) == clock.now
    finally:
        led.close()


def test_a_run_s_writes_serialise_on_its_own_lock_only(pg_url: str, clock: FakeClock) -> None:
    _tree(pg_url, "run-a", clock)
    _tree(pg_url, "run-b", clock)
    a, b = open_ledger(pg_url, run_id="run-a"), open_ledger(pg_url, run_id="run-b")
    landed = threading.Event()
    try:
        with psycopg.connect(pg_url) as holder:  # holds run-a's write lock, as a writer of run-a would
            holder.execute("SELECT pg_advisory_xact_lock(%s, hashtext('run-a'))", (LOCK_CLASS_RUN,))
            b.append_event("w1", "node_resumed")  # another run does not wait
            writer = threading.Thread(target=lambda: (a.append_event("w1", "node_resumed"), landed.set()))
            writer.start()
            assert not landed.wait(0.3)  # run-a's write waits for the holder
        assert landed.wait(10)
        writer.join(10)
        assert [e.type for e in a.events_after(0)] == ["node_launched", "mail_sent", "node_resumed"]
    finally:
        a.close()
        b.close()


def test_an_older_schema_is_migrated_in_place(pg_url: str, clock: FakeClock) -> None:
    _tree(pg_url, "run-a", clock)
    with psycopg.connect(pg_url, autocommit=True) as pg:  # what a v3 ledger looks like
        pg.execute("ALTER TABLE usage DROP COLUMN unknown_cost_tokens")
        pg.execute("UPDATE legion_schema SET version = 3")
    led = open_ledger(pg_url, run_id="run-a")
    try:
        assert led.migrated_from == 3 and led.schema_version() == SCHEMA_VERSION == 5
        assert led.get_usage("w1")["unknown_cost_tokens"] == 0  # type: ignore[index]
    finally:
        led.close()


def test_a_new_ledger_has_sqlite_s_tables_and_the_request_ids_table_of_its_own(pg_url: str, tmp_path: Path) -> None:
    open_ledger(pg_url, run_id="run-a").close()
    with psycopg.connect(pg_url) as pg:
        tables = {r[0] for r in pg.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert tables == {*ALL_TABLES, *FLEET_TABLES, VERSION_TABLE, REQUESTS_TABLE}
    open_ledger(tmp_path / "legion.db").close()  # SQLite knows every commit's outcome: it records no request ids
    with contextlib.closing(sqlite3.connect(tmp_path / "legion.db")) as con:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert REQUESTS_TABLE not in names and {*ALL_TABLES, *FLEET_TABLES} <= names


@pytest.mark.parametrize(("url", "says"), [
    ("mysql://u:secret@localhost/db", "scheme 'mysql' is not supported"),
    ("postgresql+asyncpg://u@localhost/db", "scheme 'postgresql+asyncpg' is not supported"),
    ("postgresql://u@localhost:notaport/db", "does not parse"),
    ("postgresql://u@localhost:5432", "names no database"),
])
def test_a_wrong_url_is_refused_with_the_form_to_use(url: str, says: str) -> None:
    with pytest.raises(LedgerUrlError, match=re.escape(says)) as info:
        open_ledger(url, run_id="run-a")
    assert "secret" not in str(info.value)


def test_a_postgresql_url_needs_a_run_id(pg_url: str) -> None:
    with pytest.raises(LedgerUrlError, match="run_id"):
        open_ledger(pg_url)
    with pytest.raises(LedgerUrlError, match="plain name"):
        open_ledger(pg_url, run_id="a/b")


def test_an_unreachable_server_or_a_missing_database_says_which_and_the_fix(pg_server: PgServer) -> None:
    with pytest.raises(LedgerConnectError, match="Check the host and port"):
        open_ledger(f"postgresql://postgres@127.0.0.1:{_closed_port()}/x?connect_timeout=5", run_id="r")
    with pytest.raises(LedgerConnectError, match=r'"no_such_db" does not exist.*createdb'):
        open_ledger(pg_server.url("no_such_db"), run_id="r")


def test_wrong_credentials_are_refused_without_showing_the_password(pg_server: PgServer, pg_url: str) -> None:
    name = pg_url.split("/")[3].split("?")[0]
    with pytest.raises(LedgerConnectError, match=r"password authentication failed.*Check the user and password") as info:
        open_ledger(pg_server.url(name, password="not-the-password"), run_id="r")
    assert "not-the-password" not in str(info.value) and "***" in str(info.value)
    led = open_ledger(pg_server.url(name, password=PASSWORD), run_id="r")  # the right one, over tcp
    led.close()


def test_no_password_at_all_says_where_to_put_one(pg_server: PgServer, pg_url: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGPASSWORD", "LEGION_LEDGER_PASSWORD", "LEGION_LEDGER_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PGPASSFILE", "/nonexistent/.pgpass")
    name = pg_url.split("/")[3].split("?")[0]
    url = f"postgresql://postgres@127.0.0.1:{pg_server.port}/{name}"  # tcp: the server asks for a password
    with pytest.raises(LedgerConnectError, match=r"no password supplied.*set LEGION_LEDGER_PASSWORD"):
        open_ledger(url, run_id="r")


def test_a_newer_schema_is_refused_and_left_as_it_is(pg_url: str, clock: FakeClock) -> None:
    _tree(pg_url, "run-a", clock)
    with psycopg.connect(pg_url, autocommit=True) as pg:
        pg.execute("UPDATE legion_schema SET version = 99")
    with pytest.raises(SchemaVersionError, match=r"schema version 99.*supports up to 5.*upgrade legion"):
        open_ledger(pg_url, run_id="run-a")
    with psycopg.connect(pg_url, autocommit=True) as pg:
        assert pg.execute("SELECT version FROM legion_schema").fetchone() == (99,)
        assert pg.execute("SELECT count(*) FROM nodes").fetchone() == (2,)


def test_a_database_that_is_not_a_ledger_is_refused_and_untouched(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as pg:
        pg.execute("CREATE TABLE customers (id int PRIMARY KEY, name text)")
        pg.execute("INSERT INTO customers VALUES (1, 'ada')")
    with pytest.raises(NotALedgerError, match=r"not a legion ledger: it holds tables \(customers\).*Nothing was changed"):
        open_ledger(pg_url, run_id="run-a")
    with psycopg.connect(pg_url, autocommit=True) as pg:
        tables = [r[0] for r in pg.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        assert tables == ["customers"]
        assert pg.execute("SELECT name FROM customers").fetchall() == [("ada",)]


def test_a_path_still_opens_sqlite(tmp_path: Path) -> None:
    led = open_ledger(tmp_path / "legion.db", run_id="run-a")
    try:
        assert led.backend == "sqlite" and led.file == str(tmp_path / "legion.db")
    finally:
        led.close()


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
