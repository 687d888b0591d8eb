"""The write gate across processes: writers queue in the kernel (no busy errors), a stuck or stopped holder
costs a bounded wait, a non-main thread waits through the helper."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from legion.ledger import Ledger, open_ledger

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "legion.db"


@pytest.fixture
def tree(db_path: Path) -> Iterator[Ledger]:
    """A ledger on `db_path` holding root -> team -> (w1, w2) (as tests/unit/ledger's fixture)."""
    led = open_ledger(db_path)
    led.insert_node(id="root", name="root", role="root", depth=0, status="running")
    led.insert_node(id="team", name="team-a", role="centurion", depth=1, parent_id="root")
    led.insert_node(id="w1", name="w1", role="worker", depth=2, parent_id="team")
    led.insert_node(id="w2", name="w2", role="worker", depth=2, parent_id="team")
    yield led
    led.close()


LATE_WRITER = """
import sys, time
from legion.ledger import open_ledger
led = open_ledger(sys.argv[1])
print("started", flush=True)
began = time.monotonic()
led.append_event("w1", "node_settled")
print(time.monotonic() - began, flush=True)
led.close()
"""


def test_other_process_waits_in_the_gate_not_in_busy(tree: Ledger, db_path: Path) -> None:
    # A fresh interpreter, not a fork: the parent holds an open SQLite connection (here even a write
    # transaction), and SQLite's per-process lock bookkeeping must never be inherited across fork.
    with tree.transaction():
        tree.append_event("w1", "node_launched")
        child = subprocess.Popen([sys.executable, "-c", LATE_WRITER, str(db_path)], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "started"
        time.sleep(0.3)  # hold the write lock while the child is (or soon will be) queued
        assert child.poll() is None  # it cannot have committed while we hold the gate
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0
    assert float(out.strip()) < 5.0  # released by the kernel queue, not after a busy timeout
    assert [e.type for e in tree.events_after(0)] == ["node_launched", "node_settled"]


GATE_SQUATTER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("holding", flush=True)
time.sleep(60)
"""

STOPPED_WRITER = """
import os, signal, sys
from legion.ledger import open_ledger
led = open_ledger(sys.argv[1])
with led.transaction():
    led.heartbeat("w1")
    print("holding", flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)
"""


def _start(script: str, arg: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", script, arg], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
    return proc


def test_stuck_gate_holder_costs_a_bounded_wait(tree: Ledger, db_path: Path) -> None:
    gate = tree._db.gate
    gate.timeout = 0.3  # type: ignore[union-attr]
    squatter = _start(GATE_SQUATTER, str(db_path) + "-writelock")
    try:
        began = time.monotonic()
        tree.append_event("w1", "node_launched")  # gives up on the gate, SQLite itself is free
        assert 0.25 < time.monotonic() - began < 5
        assert gate.timeouts >= 1  # type: ignore[union-attr]
    finally:
        squatter.kill()
        squatter.wait()
    began = time.monotonic()
    tree.append_event("w1", "node_settled")  # the kernel released the dead holder's lock
    assert time.monotonic() - began < 3
    gate.timeout = 5.0  # type: ignore[union-attr]


def test_stopped_writer_never_deadlocks_the_others(tree: Ledger, db_path: Path) -> None:
    gate = tree._db.gate
    gate.timeout = 0.3  # type: ignore[union-attr]
    tree._db.raw.execute("PRAGMA busy_timeout=300")
    stopped = _start(STOPPED_WRITER, str(db_path))
    try:
        began = time.monotonic()
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            tree.append_event("w1", "node_launched")
        assert time.monotonic() - began < 5  # bounded: gate timeout + busy timeout, not forever
    finally:
        stopped.kill()
        stopped.wait()
    tree.append_event("w1", "node_settled")  # SIGKILL released both locks; the half transaction is gone
    assert [e.type for e in tree.events_after(0)] == ["node_settled"]
    gate.timeout = 5.0  # type: ignore[union-attr]


BRIEF_SQUATTER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("holding", flush=True)
time.sleep(0.5)
"""


@pytest.mark.parametrize("timeout", [5.0, 0.1])
def test_non_main_thread_waits_through_the_helper(tree: Ledger, db_path: Path, timeout: float) -> None:
    gate = tree._db.gate
    gate.timeout = timeout  # type: ignore[union-attr]
    squatter = _start(BRIEF_SQUATTER if timeout > 1 else GATE_SQUATTER, str(db_path) + "-writelock")
    result: list[object] = []

    def write() -> None:
        began = time.monotonic()
        try:
            tree.append_event("w1", "node_launched")
            result.append(time.monotonic() - began)
        except BaseException as exc:
            result.append(exc)

    try:
        worker = threading.Thread(target=write)
        worker.start()
        worker.join(30)
    finally:
        squatter.kill()
        squatter.wait()
        gate.timeout = 5.0  # type: ignore[union-attr]
    [elapsed] = result
    assert isinstance(elapsed, float)
    if timeout > 1:
        assert gate.timeouts == 0 and elapsed < 5  # got the gate when the squatter exited
    else:
        assert gate.timeouts == 1  # gave up on the gate, SQLite itself was free
        # The abandoned helper passes the lock on as soon as it gets it: the gate is not leaked.
        began = time.monotonic()
        tree.append_event("w1", "node_settled")
        assert gate.timeouts == 1 and time.monotonic() - began < 3  # type: ignore[union-attr]
    assert tree.events_after(0)[0].type == "node_launched"
