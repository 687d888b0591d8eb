"""Several real processes share one ledger (a legion.db file, or one run of a PostgreSQL database): concurrent
open+migrate, writes, a cursor reader, leases."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from legion.ledger import SCHEMA_VERSION, Delivery, MailRateLimitedError, open_ledger

pytestmark = pytest.mark.timeout(90)
CTX = mp.get_context("fork")
RUN = "mp-run"
WRITERS = 6
TX_PER_WRITER = 60


def _writer(index: int, db: str, start: Any, results: Any) -> None:
    out: dict[str, Any] = {"index": index, "events": [], "mail": [], "errors": []}
    try:
        led = open_ledger(db, mail_rate_per_5_min=10_000, run_id=RUN)  # first open races the migration
        node = f"w{index}"
        start.wait(30)
        with led.transaction():
            led.insert_node(id=node, name=node, role="worker", depth=1, parent_id="root", status="running")
        for tick in range(TX_PER_WRITER):
            with led.transaction():
                led.heartbeat(node)
                out["events"].append(led.append_event(node, "node_resumed", {"tick": tick, "writer": index}))
                if tick % 10 == 0:
                    out["mail"].append(led.send_mail(node, "root", f"tick {tick}", "body").id)
        led.close()
    except Exception as exc:  # reported to the test, which fails on any
        out["errors"].append(repr(exc))
    results.put(out)


def _reader(db: str, expected: int, results: Any) -> None:
    """Polls data_version and reads after a cursor until it has seen every event."""
    led = open_ledger(db, run_id=RUN)
    seen: list[int] = []
    polls = changes = 0
    cursor = 0
    version = led.data_version()
    deadline = time.monotonic() + 60
    while len(seen) < expected and time.monotonic() < deadline:
        polls += 1
        now_version = led.data_version()
        if now_version == version and polls > 1:
            time.sleep(0.005)
            continue
        version = now_version
        changes += 1
        batch = led.events_after(cursor, limit=500)
        seen.extend(e.id for e in batch)
        if batch:
            cursor = batch[-1].id
    led.close()
    results.put({"seen": seen, "polls": polls, "changes": changes})


def _claimer(db: str, ids: list[int], results: Any) -> None:
    led = open_ledger(db, run_id=RUN)
    won = [mid for mid in ids if led.claim_for_delivery(mid) is not None]
    led.close()
    results.put(won)


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The ledger every process opens: a file, or a fresh PostgreSQL database (the run's rows in it)."""
    if request.param == "sqlite":
        return str(tmp_path / "legion.db")
    return str(request.getfixturevalue("pg_url"))


def test_concurrent_writers_reader_and_migration(target: str) -> None:
    db = target
    if "://" not in db:
        boot = sqlite3.connect(db)  # an empty file: every process races to migrate it
        boot.close()
    results, start = CTX.Queue(), CTX.Event()
    writers = [CTX.Process(target=_writer, args=(i, db, start, results)) for i in range(WRITERS)]
    reader_q = CTX.Queue()
    total_events = WRITERS * TX_PER_WRITER + WRITERS * (TX_PER_WRITER // 10)  # + one mail_sent per mail
    reader = CTX.Process(target=_reader, args=(db, total_events, reader_q))
    # Fork everything before this process opens the ledger: SQLite state must never cross a fork.
    for p in [*writers, reader]:
        p.start()
    # The root node must exist before the writers insert children under it.
    deadline = time.monotonic() + 30
    while True:
        try:
            root = open_ledger(db, run_id=RUN)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    root.insert_node(id="root", name="root", role="root", depth=0, status="running")
    start.set()
    outs = [results.get(timeout=60) for _ in writers]
    read = reader_q.get(timeout=60)
    for p in [*writers, reader]:
        p.join(10)
        assert p.exitcode == 0

    assert [o["errors"] for o in outs] == [[]] * WRITERS
    assert root.schema_version() == SCHEMA_VERSION
    all_events = root.events_after(0, limit=10_000)
    assert len(all_events) == total_events
    ids = [e.id for e in all_events]
    assert ids == sorted(set(ids))
    for o in outs:  # every writer's committed events are there, in its own order
        mine = [e.data["tick"] for e in all_events if e.type == "node_resumed" and e.data["writer"] == o["index"]]
        assert mine == list(range(TX_PER_WRITER))
        assert o["events"] == sorted(o["events"])
    assert read["seen"] == ids  # the cross-process cursor reader saw everything exactly once, in order
    assert read["changes"] < read["polls"]  # data_version filtered out idle polls
    assert root.mailbox_stats("root")["pending"] == WRITERS * (TX_PER_WRITER // 10)
    assert {n["status"] for n in root.subtree("root")} == {"running"}
    root.close()


def test_claim_leases_are_exclusive_across_processes(target: str) -> None:
    db = target
    led = open_ledger(db, mail_rate_per_5_min=1000, run_id=RUN)
    led.insert_node(id="a", name="a", role="w", depth=0)
    ids = [led.send_mail("a", "a", "s", "b").id for _ in range(40)]
    led.close()  # nothing of SQLite may cross the fork
    results = CTX.Queue()
    procs = [CTX.Process(target=_claimer, args=(db, ids, results)) for _ in range(4)]
    for p in procs:
        p.start()
    led = open_ledger(db, run_id=RUN)
    won = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    claimed = sorted(mid for w in won for mid in w)
    assert claimed == ids  # every mail claimed by exactly one process
    assert all(m["delivered"] == Delivery.PENDING for m in led.pending_inbox("a", limit=100))
    led.close()


def _rate_racer(db: str, start: Any, results: Any) -> None:
    """Sends one mail as 'a' the moment the start event fires; reports 'sent' or the error class."""
    try:
        led = open_ledger(db, run_id=RUN)
        start.wait(30)
        try:
            led.send_mail("a", "a", "race", "b")
            results.put("sent")
        except MailRateLimitedError:
            results.put("refused")
        led.close()
    except Exception as exc:
        results.put(repr(exc))


@pytest.mark.parametrize("racers", [2, 4])
def test_rate_limit_counted_inside_the_insert_transaction_across_processes(target: str, racers: int) -> None:
    # 9 mails already sent: of the processes racing for the 10th, exactly one wins; the others are refused.
    db = target
    led = open_ledger(db, run_id=RUN)
    led.insert_node(id="a", name="a", role="w", depth=0)
    for _ in range(9):
        led.send_mail("a", "a", "s", "b")
    led.close()  # nothing of SQLite may cross the fork
    results, start = CTX.Queue(), CTX.Event()
    procs = [CTX.Process(target=_rate_racer, args=(db, start, results)) for _ in range(racers)]
    for p in procs:
        p.start()
    start.set()
    outcomes = sorted(results.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(10)
    assert outcomes == ["refused"] * (racers - 1) + ["sent"]
    led = open_ledger(db, run_id=RUN)
    try:
        assert led.mailbox_stats("a")["pending"] == 10  # every mail of 'a' is to 'a'
        assert sum(e.type == "mail_sent" for e in led.events_after(0)) == 10
    finally:
        led.close()


def _opener(db: str, start: Any, results: Any) -> None:
    try:
        start.wait(30)
        led = open_ledger(db, run_id=RUN)
        results.put(("ok", led.schema_version()))
        led.close()
    except Exception as exc:
        results.put(("error", repr(exc)))


def test_processes_racing_to_migrate_an_old_rollback_journal_v1(tmp_path: Path) -> None:
    # A v1 ledger in rollback-journal mode and without idx_messages_rate (docs/spec-conformance.md §10 items 3–4): six processes open it
    # at once; every one must get WAL + v3 (no JournalModeError, no duplicate DDL), every index must exist.
    from legion.ledger.schema import ALL_INDEXES, V1_INDEXES, V1_TABLES

    db = str(tmp_path / "legion.db")
    con = sqlite3.connect(db)
    for sql in V1_TABLES + tuple(s for s in V1_INDEXES if "idx_messages_rate" not in s):
        con.execute(sql)
    con.execute("INSERT INTO messages (from_node, to_node, subject, body, delivered, created_at) "
                "VALUES ('a', 'b', 's', 'b', 1, 1)")
    con.execute("PRAGMA user_version=1")
    con.commit()
    con.close()
    results, start = CTX.Queue(), CTX.Event()
    procs = [CTX.Process(target=_opener, args=(db, start, results)) for _ in range(6)]
    for p in procs:
        p.start()
    start.set()
    outcomes = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    assert outcomes == [("ok", SCHEMA_VERSION)] * 6
    con = sqlite3.connect(db)
    try:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='index' AND name LIKE 'idx_%'")}
        assert names == set(ALL_INDEXES)
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert con.execute("SELECT delivered FROM messages").fetchall() == [(1,)]
    finally:
        con.close()
