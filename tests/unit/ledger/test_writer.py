"""LedgerWriter: FIFO order, group commit, a failing op fails alone, transient retry, stalls, close."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from legion.ledger import InvalidNodeError, Ledger, LedgerError, LedgerWriter, WriterClosedError, open_ledger
from legion.ledger.errors import Refusal
from legion.ledger.sql import IntegrityViolation
from legion.ledger.writer import is_transient
from tests.support import wait_until

from .conftest import RUN

WAIT = 10.0


@pytest.fixture
def writer(target: Path | str) -> Iterator[LedgerWriter]:
    w = LedgerWriter(target, run_id=RUN, stall_after=0.3)
    w.submit(lambda led: led.insert_node(id="root", name="root", role="root", depth=0, status="running")).result(WAIT)
    yield w
    w.close(WAIT)


def _event(i: int) -> Any:
    return lambda led: led.append_event("root", "node_resumed", {"i": i})


def _stored(target: Path | str) -> list[int]:
    led = open_ledger(target, run_id=RUN)
    try:
        return [e.data["i"] for e in led.events_after(0, node_id="root") if e.data and "i" in e.data]
    finally:
        led.close()


class Gate:
    """An op that holds the writer thread until released (makes the batch boundaries deterministic)."""

    def __init__(self, writer: LedgerWriter) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.future = writer.submit(self._hold, "gate")
        assert self.entered.wait(WAIT), "the writer never ran the gate op"

    def _hold(self, _led: Ledger) -> None:
        self.entered.set()
        assert self.release.wait(WAIT)


def _trace_commits(writer: LedgerWriter) -> list[str]:
    """Record every SQL statement the writer's own connection runs (real statements, not our counters)."""
    statements: list[str] = []
    writer.submit(lambda led: led._db.raw.set_trace_callback(statements.append)).result(WAIT)  # type: ignore[union-attr]
    return statements


def _commits(writer: LedgerWriter, backend: str) -> Callable[[], int]:
    """How many COMMITs the writer's connection has run: traced on SQLite; psycopg has no statement trace, there
    the writer's own count of committed batches stands in."""
    if backend == "sqlite":
        statements = _trace_commits(writer)
        return lambda: statements.count("COMMIT")
    return lambda: writer.commits


def test_ops_land_in_submit_order_across_threads(writer: LedgerWriter, target: Path | str) -> None:
    futures: list[Any] = []
    lock = threading.Lock()

    def submit_some(base: int) -> None:
        for i in range(base, base + 50):
            with lock:  # the lock fixes the submit order we then expect to see stored
                futures.append((i, writer.submit(_event(i))))

    threads = [threading.Thread(target=submit_some, args=(k * 50,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [f.result(WAIT) for _i, f in futures]
    assert ids == sorted(ids)
    assert _stored(target) == [i for i, _f in futures]


@pytest.mark.sqlite_only
def test_queued_ops_commit_in_one_transaction(writer: LedgerWriter, target: Path | str) -> None:
    statements = _trace_commits(writer)
    gate = Gate(writer)
    futures = [writer.submit(_event(i)) for i in range(100)]
    commits_before, begins_before = statements.count("COMMIT"), statements.count("BEGIN IMMEDIATE")
    gate.release.set()
    for f in futures:
        f.result(WAIT)
    assert statements.count("COMMIT") - commits_before == 2  # the gate's batch, then all 100 ops at once
    assert statements.count("BEGIN IMMEDIATE") - begins_before == 1  # the gate's batch had begun already
    assert writer.max_batch_seen == 100
    assert _stored(target) == list(range(100))


def test_max_batch_bounds_a_transaction(target: Path | str) -> None:
    w = LedgerWriter(target, run_id=RUN, max_batch=10)
    try:
        w.submit(lambda led: led.insert_node(id="root", name="root", role="root", depth=0)).result(WAIT)
        gate = Gate(w)
        futures = [w.submit(_event(i)) for i in range(35)]
        gate.release.set()
        for f in futures:
            f.result(WAIT)
        assert w.max_batch_seen == 10
        assert _stored(target) == list(range(35))
    finally:
        w.close(WAIT)


def test_a_failing_op_fails_alone(writer: LedgerWriter, target: Path | str, backend: str) -> None:
    commits = _commits(writer, backend)
    gate = Gate(writer)
    first = writer.submit(_event(1))
    bad_slug = writer.submit(lambda led: led.insert_node(id="x", name="Not A Slug", role="worker", depth=1))
    half_done = writer.submit(lambda led: (led.append_event("root", "node_resumed", {"i": 99}),
                                           led.append_event("nope", "node_resumed")))
    last = writer.submit(_event(2))
    commits_before = commits()
    gate.release.set()
    assert isinstance(first.result(WAIT), int) and isinstance(last.result(WAIT), int)
    with pytest.raises(InvalidNodeError):
        bad_slug.result(WAIT)
    with pytest.raises((sqlite3.IntegrityError, IntegrityViolation)):  # a foreign key the op itself violates
        half_done.result(WAIT)
    wait_until(lambda: commits() - commits_before >= 2, WAIT)  # writer.commits moves just after the futures resolve
    assert commits() - commits_before == 2  # the gate, then one batch for the four
    assert _stored(target) == [1, 2]  # the failing op's first statement (i=99) was rolled back with it
    assert writer.submit(_event(3)).result(WAIT)  # the writer goes on


def test_a_refusal_is_rolled_back_and_handed_over_without_a_failure_warning(writer: LedgerWriter,
                                                                             target: Path | str) -> None:
    """A write that says no (a budget, a quota) is its caller's answer: rolled back like a failure, but the writer
    does not log it as a failed write; a real failure still is."""
    from loguru import logger

    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")

    def refuse(led: Ledger) -> None:
        led.append_event("root", "node_resumed", {"i": 7})
        raise Refusal("no: over budget")

    try:
        refused = writer.submit(refuse)
        with pytest.raises(Refusal, match="over budget"):
            refused.result(WAIT)
        broken = writer.submit(lambda led: led.insert_node(id="x", name="Not A Slug", role="worker", depth=1))
        with pytest.raises(InvalidNodeError):
            broken.result(WAIT)
    finally:
        logger.remove(sink)
    assert _stored(target) == []  # the refusal's event was rolled back
    assert len(warnings) == 1 and "InvalidNodeError" in warnings[0], warnings


def test_a_transient_failure_is_retried_until_it_lands(writer: LedgerWriter, target: Path | str) -> None:
    attempts = []
    gate = Gate(writer)
    before = writer.submit(_event(1))

    def flaky(led: Ledger) -> int:
        attempts.append(1)
        event_id = led.append_event("root", "node_resumed", {"i": 2})
        if len(attempts) < 3:  # what SQLite raises when busy_timeout runs out
            raise sqlite3.OperationalError("database is locked")
        return event_id

    flaky_future = writer.submit(flaky)
    after = writer.submit(_event(3))
    gate.release.set()
    assert flaky_future.result(WAIT) > before.result(WAIT)
    assert after.result(WAIT) > flaky_future.result(WAIT)
    assert len(attempts) == 3 and writer.retries == 2
    assert _stored(target) == [1, 2, 3]  # the failed attempts' writes (and the batch around them) rolled back


@pytest.mark.parametrize(("exc", "transient"), [
    (sqlite3.OperationalError("database is locked"), True),
    (sqlite3.OperationalError("disk I/O error"), True),
    (sqlite3.OperationalError("database or disk is full"), True),
    (OSError(5, "Input/output error"), True),
    (LedgerError("cannot open legion.db"), False),
    (InvalidNodeError("bad slug"), False),
    (sqlite3.IntegrityError("FOREIGN KEY constraint failed"), False),
    (sqlite3.OperationalError("no such table: nodes"), False),
    (TypeError("bad argument"), False),
])
def test_transient_classification(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


def test_transient_classification_uses_sqlite_error_codes(tmp_path: Path) -> None:
    holder = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(tmp_path / "x.db", isolation_level=None, timeout=0)
    with pytest.raises(sqlite3.OperationalError) as busy:
        other.execute("BEGIN IMMEDIATE")
    with pytest.raises(sqlite3.IntegrityError) as constraint:
        holder.execute("CREATE TABLE u (x NOT NULL)")
        holder.execute("INSERT INTO u VALUES (NULL)")
    assert is_transient(busy.value) and not is_transient(constraint.value)
    wrapped = LedgerError("cannot open legion.db")
    wrapped.__cause__ = busy.value
    assert is_transient(wrapped)
    holder.close()
    other.close()


def test_on_stall_fires_once_per_stall(target: Path | str) -> None:
    stalls: list[tuple[float, str]] = []
    w = LedgerWriter(target, run_id=RUN, stall_after=0.1, on_stall=lambda s, d: stalls.append((s, d)))

    def gated() -> list[tuple[float, str]]:
        # the stalls of the gated episodes; on a loaded machine a later commit's fsync may take > 0.1 s too,
        # and that is rightly a stall of its own
        return [s for s in stalls if "oldest: gate" in s[1]]

    try:
        for round_ in (1, 2):
            gate = Gate(w)
            queued = w.submit(lambda led, n=f"n{round_}": led.insert_node(id=n, name=n, role="r", depth=0),
                              "insert n")
            wait_until(lambda n=round_: len(gated()) >= n, WAIT, f"stall report {round_}")
            time.sleep(0.15)  # it keeps stalling: still one report
            assert len(gated()) == round_
            seconds, detail = gated()[-1]
            assert seconds > 0.1
            assert "2 ledger write(s)" in detail and "first attempt still blocked" in detail
            gate.release.set()
            queued.result(WAIT)
        assert w.stalls == len(stalls) >= 2  # the counter counts what was reported, once per stall
    finally:
        w.close(WAIT)


def test_a_long_idle_writer_is_not_a_stall(target: Path | str) -> None:
    stalls: list[tuple[float, str]] = []
    w = LedgerWriter(target, run_id=RUN, stall_after=0.1, on_stall=lambda s, d: stalls.append((s, d)))
    try:
        time.sleep(0.2)
        w.submit(lambda led: led.insert_node(id="root", name="root", role="root", depth=0)).result(WAIT)
        time.sleep(0.2)
        assert stalls == []
    finally:
        w.close(WAIT)


def test_close_drains_the_queue(target: Path | str) -> None:
    w = LedgerWriter(target, run_id=RUN)
    w.submit(lambda led: led.insert_node(id="root", name="root", role="root", depth=0))
    gate = Gate(w)
    futures = [w.submit(_event(i)) for i in range(200)]  # fire and forget
    threading.Timer(0.05, gate.release.set).start()
    assert w.close(WAIT) is True
    assert all(f.done() and f.exception() is None for f in futures)
    assert _stored(target) == list(range(200))
    with pytest.raises(WriterClosedError):
        w.submit(_event(999))


def test_close_that_cannot_drain_says_so_and_fails_what_did_not_land(target: Path | str) -> None:
    w = LedgerWriter(target, run_id=RUN)
    w.submit(lambda led: led.insert_node(id="root", name="root", role="root", depth=0)).result(WAIT)
    gate = Gate(w)
    queued = w.submit(_event(1))
    assert w.close(timeout=0.2) is False
    gate.release.set()
    gate.future.result(WAIT)  # the batch in flight still lands
    with pytest.raises(WriterClosedError, match="closed before"):
        queued.result(WAIT)


def test_an_async_function_is_refused_not_silently_dropped(writer: LedgerWriter, target: Path | str) -> None:
    async def wrong(led: Ledger) -> None:
        led.append_event("root", "node_resumed", {"i": 1})

    with pytest.raises(TypeError, match="coroutine"):
        writer.submit(wrong).result(WAIT)


async def test_aclose_drains_without_blocking_the_loop(target: Path | str) -> None:
    w = LedgerWriter(target, run_id=RUN)
    w.submit(lambda led: led.insert_node(id="root", name="root", role="root", depth=0))
    gate = Gate(w)
    futures = [w.submit(_event(i)) for i in range(10)]
    closing = asyncio.create_task(w.aclose(WAIT))
    await asyncio.sleep(0.05)  # the loop runs while close waits for the drain
    assert not closing.done()
    gate.release.set()
    assert await closing is True
    assert all(f.exception() is None for f in futures)


def test_open_errors_reach_the_constructor(tmp_path: Path) -> None:
    with pytest.raises(LedgerError):
        LedgerWriter(tmp_path / "missing" / "dir" / "legion.db")


async def test_run_awaits_its_own_commit_without_blocking_the_loop(writer: LedgerWriter, target: Path | str) -> None:
    lags: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            t = time.monotonic()
            await asyncio.sleep(0.005)
            lags.append(time.monotonic() - t - 0.005)

    tick = asyncio.create_task(ticker())
    gate = Gate(writer)  # the writer thread is stuck (as behind a stopped lock holder)
    runs = [asyncio.create_task(writer.run(_event(i))) for i in range(20)]
    await asyncio.sleep(0.1)
    assert not any(r.done() for r in runs)
    gate.release.set()
    ids = await asyncio.wait_for(asyncio.gather(*runs), WAIT)
    stop.set()
    await tick
    assert ids == sorted(ids)
    assert max(lags) < 0.1
    assert _stored(target) == list(range(20))


async def test_cancelling_the_awaiting_task_keeps_the_write(writer: LedgerWriter, target: Path | str) -> None:
    gate = Gate(writer)
    task = asyncio.create_task(writer.run(_event(7)))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.release.set()
    await asyncio.wait_for(asyncio.wrap_future(writer.submit(lambda _led: None)), WAIT)
    assert _stored(target) == [7]


def test_submit_latest_coalesces_while_queued_and_the_newest_lands(writer: LedgerWriter, target: Path | str) -> None:
    gate = Gate(writer)
    first = writer.submit_latest("k", _event(1), "v1")
    other = writer.submit_latest("other", _event(10), "other")
    second = writer.submit_latest("k", _event(2), "v2")
    third = writer.submit_latest("k", _event(3), "v3")
    assert first is second is third and other is not first  # one queued op per key
    assert writer.pending == 3  # the gate and the two keys
    gate.release.set()
    third.result(WAIT)
    other.result(WAIT)
    after = writer.submit_latest("k", _event(4), "v4")  # the old op left the queue: a new value queues anew
    assert after is not third
    after.result(WAIT)
    assert _stored(target) == [3, 10, 4]


def test_submit_latest_never_replaces_an_op_in_flight(writer: LedgerWriter, target: Path | str) -> None:
    entered, release = threading.Event(), threading.Event()

    def held(led: Ledger) -> None:
        led.append_event("root", "node_resumed", {"i": 1})
        entered.set()
        assert release.wait(WAIT)

    first = writer.submit_latest("k", held)
    assert entered.wait(WAIT)
    second = writer.submit_latest("k", _event(2))  # the first is running: this one queues behind it
    assert second is not first
    release.set()
    second.result(WAIT)
    assert _stored(target) == [1, 2]


# ----- durability of the files ops name, and grouping (docs/architecture.md §5, "Durability") -----------------

def _count_syncs(monkeypatch: pytest.MonkeyPatch, target: Path | str) -> list[tuple[list[str], int]]:
    """Record each sync_paths call of the writer: its files, and how many artifact rows another connection saw
    committed at that moment (a row that names a file must not be visible before the file is synced)."""
    from legion.ledger import writer as writer_module

    calls: list[tuple[list[str], int]] = []
    real = writer_module.sync_paths

    def counting(paths: Any) -> int:
        files = [str(p) for p in paths]
        other = open_ledger(target, run_id=RUN)
        try:
            rows = len(other.list_artifacts())
        finally:
            other.close()
        calls.append((files, rows))
        return int(real(files))

    monkeypatch.setattr(writer_module, "sync_paths", counting)
    return calls


def test_a_batch_of_artifacts_is_synced_once_before_its_commit(writer: LedgerWriter, target: Path | str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_syncs(monkeypatch, target)
    for i in range(12):
        writer.submit(lambda led, i=i: led.insert_node(id=f"w{i}", name=f"w{i}", role="worker", depth=1,
                                                       parent_id="root")).result(WAIT)
    gate = Gate(writer)
    futures = [writer.submit(lambda led, i=i: led.write_artifact(tmp_path, node_id=f"w{i}", name=f"w{i}", round=1,
                                                                 text=f"result {i}")) for i in range(12)]
    gate.release.set()
    for f in futures:
        f.result(WAIT)
    assert len(calls) == 1, calls  # the twelve files of one group commit: one sync call
    files, rows_seen = calls[0]
    assert sorted(files) == sorted(str(tmp_path / f"artifacts/w{i}/r1.md") for i in range(12))
    assert rows_seen == 0  # synced before the COMMIT that makes their rows visible
    assert writer.syncs >= 1 and writer.synced_files == 12
    assert all((tmp_path / f"artifacts/w{i}/r1.md").read_text() == f"result {i}" for i in range(12))


def test_durable_files_of_a_submit_are_synced_before_the_batch_begins(writer: LedgerWriter, target: Path | str,
                                                                      tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _count_syncs(monkeypatch, target)
    transcripts = [tmp_path / f"w{i}.jsonl" for i in range(5)]
    for t in transcripts:
        t.write_bytes(b"{}\n")
    gate = Gate(writer)
    futures = [writer.submit_latest(("sync", str(t)), lambda led: None, durable=(t,)) for t in transcripts]
    again = writer.submit_latest(("sync", str(transcripts[0])), lambda led: None, durable=(transcripts[0],))
    assert again is futures[0]  # a second request for a queued file joins it
    gate.release.set()
    for f in futures:
        f.result(WAIT)
    assert [sorted(files) for files, _ in calls] == [sorted(str(t) for t in transcripts)]


def test_a_failed_sync_retries_the_batch_and_nothing_is_lost(writer: LedgerWriter, target: Path | str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from legion.ledger import writer as writer_module

    real = writer_module.sync_paths
    failures = []

    def flaky(paths: Any) -> int:
        if len(failures) < 2:
            failures.append(1)
            raise OSError(5, "Input/output error")
        return int(real(paths))

    monkeypatch.setattr(writer_module, "sync_paths", flaky)
    writer.submit(lambda led: led.insert_node(id="w1", name="w1", role="worker", depth=1, parent_id="root")).result(WAIT)
    aid = writer.submit(lambda led: led.write_artifact(tmp_path, node_id="w1", name="w1", round=1, text="done")).result(WAIT)
    assert len(failures) == 2 and writer.retries >= 2  # the retried op found its own file and recorded it
    led = open_ledger(target, run_id=RUN)
    try:
        assert led.get_artifact(aid)["bytes"] == 4  # type: ignore[index]
    finally:
        led.close()


def test_linger_groups_writes_and_hurry_ends_the_wait(target: Path | str) -> None:
    w = LedgerWriter(target, run_id=RUN, linger=0.3)
    try:
        w.submit(lambda led: led.insert_node(id="root", name="root", role="root", depth=0)).result(WAIT)
        commits = w.commits
        futures = [w.submit_latest(("beat", i), _event(i)) for i in range(20)]
        for f in futures:
            f.result(WAIT)
        assert w.commits - commits == 1  # twenty writes from a burst, one commit
        slow = LedgerWriter(target, run_id=RUN, linger=60.0)
        try:
            started = time.monotonic()
            future = slow.submit(_event(99))
            slow.hurry()  # someone waits on it: no 60 s linger
            future.result(WAIT)
            slow.flush(WAIT)  # flush hurries too
            assert time.monotonic() - started < WAIT
        finally:
            slow.close(WAIT)
    finally:
        w.close(WAIT)
    assert _stored(target) == [*range(20), 99]


def test_the_results_of_a_batch_reach_the_loop_in_one_call() -> None:
    """`_Relay`: ops resolved together (a batch) wake the event loop once, each waiter gets its own result or error,
    in order; one resolved later wakes it again."""
    from concurrent.futures import Future

    from legion.ledger.writer import _Relay

    async def main() -> None:
        loop = asyncio.get_running_loop()
        calls = 0
        real = loop.call_soon_threadsafe

        def counting(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            return real(*args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        relay = _Relay(loop)
        inners: list[Future[int]] = [Future() for _ in range(20)]
        waiters = [relay.wrap(f) for f in inners]
        seen: list[int] = []
        relay.when_done(inners[3], lambda f: seen.append(f.result()))
        for i, f in enumerate(inners[:-1]):  # the writer's batch: resolved before the loop runs again
            f.set_exception(ValueError("refused")) if i == 5 else f.set_result(i)
        results = await asyncio.gather(*waiters[:-1], return_exceptions=True)
        assert calls == 1 and seen == [3]
        assert [r for i, r in enumerate(results) if i != 5] == [i for i in range(19) if i != 5]
        assert isinstance(results[5], ValueError)
        inners[-1].set_result(19)
        assert await waiters[-1] == 19 and calls == 2

    asyncio.run(main())
