"""The write gate within one process: threads with their own ledgers queue in it, and it is a sidecar file."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from legion.ledger import Ledger, open_ledger

pytestmark = [pytest.mark.timeout(60), pytest.mark.sqlite_only]  # SQLite's own machinery


def test_threads_with_their_own_ledgers(tree: Ledger, db_path: Path) -> None:
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            led = open_ledger(db_path)
            for _ in range(30):
                with led.transaction():
                    led.heartbeat("w2")
                    led.append_event("w2", "node_resumed", {"t": i})
            led.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(tree.events_after(0)) == 120


def test_gate_file_is_a_sidecar(tree: Ledger, db_path: Path) -> None:
    assert (db_path.parent / "legion.db-writelock").exists()
    two = open_ledger(db_path)
    two.append_event("w1", "node_launched")  # a second ledger in the same process shares the gate
    two.close()
    tree.append_event("w1", "node_launched")
    assert len(tree.events_after(0)) == 2
