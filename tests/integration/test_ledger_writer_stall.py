"""LedgerWriter against a real stopped lock holder (issue 13 item 2): no loop stall, no lost write, reported.

Another process takes the write gate's flock and SQLite's write lock (BEGIN IMMEDIATE through its
own Ledger) and is SIGSTOPped. While it is stopped an asyncio loop keeps submitting writes; its
ticker never lags as long as one of the writer's waits, the stall is reported naming the holder, and
after SIGCONT (or SIGKILL) every write lands, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from legion.ledger import Ledger, LedgerWriter, open_ledger
from tests.e2e.harness import call, kill_tree, messages, project, tools
from tests.support import poller, wait_until

until = poller(15.0, 0.02)

HOLDER = """
import sys
from legion.ledger import open_ledger
led = open_ledger(sys.argv[1])
with led.transaction():
    led.append_event("root", "node_resumed", {"i": -1})
    print("held", flush=True)
    sys.stdin.readline()
print("released", flush=True)
led.close()
"""


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "legion.db"
    led = open_ledger(path)
    led.insert_node(id="root", name="root", role="root", depth=0, status="running")
    led.close()
    return path


@contextlib.contextmanager
def lock_holder(db: Path) -> Iterator[subprocess.Popen[str]]:
    """A process holding the write gate and SQLite's write lock until it reads a line."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(10)


ATTEMPT_WAIT_S = 0.5  # each of the gate's and SQLite's waits in one write attempt


def _shorten_waits(led: Ledger) -> None:
    """Per-attempt waits of 0.5 s + 0.5 s instead of 5 s + 5 s, so the real failure path (gate timeout, then
    'database is locked' from BEGIN IMMEDIATE) runs several times within the test's seconds."""
    led._db.gate.timeout = ATTEMPT_WAIT_S  # type: ignore[union-attr]
    led._db.raw.execute(f"PRAGMA busy_timeout={int(ATTEMPT_WAIT_S * 1000)}")


def _stored(db: Path) -> list[int]:
    led = open_ledger(db)
    try:
        return [e.data["i"] for e in led.events_after(0, node_id="root") if e.data and "i" in e.data]
    finally:
        led.close()


@pytest.mark.parametrize("end", ["sigcont", "sigkill"])
async def test_a_stopped_lock_holder_neither_stalls_the_loop_nor_loses_writes(db: Path, end: str) -> None:
    stalls: list[tuple[float, str]] = []
    writer = LedgerWriter(db, stall_after=0.5, on_stall=lambda s, d: stalls.append((s, d)))
    try:
        writer.submit(_shorten_waits).result(10)
        with lock_holder(db) as holder:
            os.kill(holder.pid, signal.SIGSTOP)
            await until(lambda: psutil.Process(holder.pid).status() == psutil.STATUS_STOPPED, message="holder stopped")
            lags, stop, tick = _ticker()
            runs = [await _submit_one(writer, i) for i in range(20)]
            await until(lambda: stalls, message="the stall report")
            await until(lambda: writer.retries >= 2, message="two failed attempts")
            assert "locked" in writer.last_error
            assert not any(r.done() for r in runs)
            seconds, detail = stalls[0]
            assert seconds > 0.5
            assert f"pid {holder.pid} (python" in detail and "stopped) holds the write gate" in detail
            assert "stopped) holds SQLite's WAL write lock" in detail
            _end(holder, end)
            ids = await asyncio.wait_for(asyncio.gather(*runs), 15)
            stop.set()
            await tick
            assert ids == sorted(ids)
            # a loop blocked by the writer would lag at least one of its waits (0.5 s); scheduling on a loaded
            # 2-core machine alone has been seen to lag a 5 ms sleep by 0.23 s, so the bound sits between the two
            assert max(lags) < ATTEMPT_WAIT_S * 0.8, f"event loop lagged {max(lags) * 1000:.0f} ms"
            assert len(stalls) == 1
            assert holder.wait(10) == (0 if end == "sigcont" else -signal.SIGKILL)
    finally:
        writer.close(10)
    expected = ([-1] if end == "sigcont" else []) + list(range(20))
    assert _stored(db) == expected  # nothing lost, in submit order, after the holder's own write


def _ticker() -> tuple[list[float], asyncio.Event, asyncio.Task[None]]:
    """A task measuring the loop's lag: how late each 5 ms sleep wakes up."""
    lags: list[float] = []
    stop = asyncio.Event()

    async def tick() -> None:
        while not stop.is_set():
            t = time.monotonic()
            await asyncio.sleep(0.005)
            lags.append(time.monotonic() - t - 0.005)

    return lags, stop, asyncio.create_task(tick())


async def _submit_one(writer: LedgerWriter, i: int) -> asyncio.Task[int]:
    """One awaited write, started as the root would (a task per caller), then a pause."""
    task = asyncio.create_task(writer.run(lambda led: led.append_event("root", "node_resumed", {"i": i}), f"event {i}"))
    await asyncio.sleep(0.05)
    return task


def _end(holder: subprocess.Popen[str], end: str) -> None:
    if end == "sigkill":
        holder.kill()
        return
    os.kill(holder.pid, signal.SIGCONT)
    assert holder.stdin is not None
    holder.stdin.write("go\n")
    holder.stdin.flush()


HANG_S = 3.0  # `legion run`'s hang threshold: 3 missed application heartbeats of 1 s
NODE_STAMP_S = 5.0  # a working session's node row is stamped in the ledger at most this often
# how long the stopped holder keeps the lock (the fault itself, not a wait for a state): past the session's next
# ledger stamp and then more than the hang threshold, so a worker writing on its loop is silent long enough
HOLD_S = NODE_STAMP_S + 1 + 2 * HANG_S


def _usage(cost: float) -> dict[str, Any]:
    return {"input": 10, "output": 2, "cost": cost}


def _transcript_cost(transcript: Path) -> float:
    return sum(float(m["usage"]["cost"]["total"]) for m in messages(transcript)
               if m.get("role") == "assistant" and isinstance(m.get("usage"), dict))


@pytest.mark.timeout(180)
def test_a_stopped_lock_holder_does_not_fail_a_run_through_the_pool() -> None:
    """Issue 19 item 2: a real `legion run` whose root session lives in the pool worker. A SIGSTOPped process holds
    the write gate and SQLite's write lock for more than twice the hang threshold while the session works
    (model turns with usage, bash calls, the pool's heartbeats): the pool is never declared hung, the run exits
    0, and the ledger's usage ends equal to the transcript's."""
    with project() as proj:
        root = proj.script(
            "root",
            {**tools(call("bash", {"command": "touch READY; until [ -f GO ]; do sleep 0.02; done"})), "usage": _usage(0.01)},
            {**tools(call("bash", {"command": "echo one"})), "usage": _usage(0.01)},
            {**tools(call("bash", {"command": "touch WAITING; until [ -f DONE ]; do sleep 0.02; done"})),
             "usage": _usage(0.01)},
            {"text": "finished", "usage": _usage(0.02)})
        proc, run = proj.start("work", "--model", root)
        try:
            wait_until(lambda: (proj.dir / "READY").exists(), 60, "the root session's first bash call")
            with lock_holder(run / "legion.db") as holder:
                os.kill(holder.pid, signal.SIGSTOP)
                wait_until(lambda: psutil.Process(holder.pid).status() == psutil.STATUS_STOPPED, 10, "holder stopped")
                stopped_at = time.monotonic()
                (proj.dir / "GO").touch()  # two more model turns (usage snapshots) while the lock is held
                wait_until(lambda: (proj.dir / "WAITING").exists(), 30, "the session's turns under the held lock")
                wait_until(lambda: time.monotonic() - stopped_at >= HOLD_S, HOLD_S + 1, "the hold's end")
                assert proc.poll() is None, "the run ended while the ledger was locked:\n" + _tail(run)
                (proj.dir / "DONE").touch()
                _end(holder, "sigcont")
                assert holder.wait(10) == 0
            _, err = proc.communicate(timeout=60)
        finally:
            kill_tree(proc)
        log = (run / "legion.log").read_text(errors="replace")
        assert proc.returncode == 0, f"exit {proc.returncode}\n{err[-3000:]}\n{_tail(run)}"
        assert "hung" not in log, _tail(run)
        pool_log = (run / "pool.log").read_text(errors="replace")
        assert "ledger writer stalled" in pool_log  # the pool's writes really did wait on the holder, off its loop
        transcript = Path(json.loads((run / "run.json").read_text())["sessionFile"])
        assert _transcript_cost(transcript) == pytest.approx(0.05)
        with proj.ledger(run) as led:
            row = led.get_usage("root")
        assert row is not None and row["cost_usd"] == pytest.approx(0.05), row


def _tail(run: Path) -> str:
    parts = []
    for name in ("legion.log", "pool.log"):
        path = run / name
        parts.append(f"{name}:\n" + (path.read_text(errors="replace")[-3000:] if path.exists() else "(none)"))
    return "\n".join(parts)
