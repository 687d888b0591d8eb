"""A ledger and its writer across fork(): a forked child must open its own and cannot use the parent's writer."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from legion.ledger import (
    LedgerError,
    LedgerWriter,
    WriterClosedError,
    open_ledger,
)

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "legion.db"


@pytest.fixture
def writer(db_path: Path) -> Iterator[LedgerWriter]:
    w = LedgerWriter(db_path, stall_after=0.3)
    w.submit(lambda led: led.insert_node(id="root", name="root", role="root", depth=0, status="running")).result(10.0)
    yield w
    w.close(10.0)


@pytest.mark.timeout(30)
def test_forked_child_must_open_its_own(db_path: Path) -> None:
    import multiprocessing as mp

    led = open_ledger(db_path)
    ctx = mp.get_context("fork")
    results = ctx.Queue()

    def child() -> None:
        try:
            led.data_version()
            results.put("used")
        except LedgerError as exc:
            results.put(str(exc))

    proc = ctx.Process(target=child)
    proc.start()
    message = results.get(timeout=20)
    proc.join(10)
    assert "must open its own ledger" in message
    led.append_event(None, "tree_finalized")  # the parent's connection is untouched
    led.close()
def test_a_forked_child_cannot_use_the_parents_writer(writer: LedgerWriter) -> None:
    pid = os.fork()
    if pid == 0:  # the child: a copy of the writer without its thread must refuse, not queue for ever
        try:
            writer.submit(lambda led: led.append_event("root", "node_resumed", {"i": 1}))
        except WriterClosedError:
            os._exit(0)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
