"""Issue 19 item 8, the ledger side: a full filesystem under a real ledger (a 1 MiB tmpfs; root only).

The writer says so at once (naming the filesystem and its free space), keeps ordinary writes until space is
freed, and fails the writes of a tool call (`fail_fast()`) instead of letting them wait: queued ones with
DiskFullError, new ones refused at submit, and the root's `legion.tool` dispatch answers DISK_FULL at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from legion.ledger import DiskFullError, Ledger, LedgerWriter, fail_fast, open_ledger
from legion.supervision import dispatch
from tests.support import small_filesystem

WAIT = 15.0
BIG = "x" * 300_000  # an event this size needs new pages in the WAL: it cannot land on a full disk


def _fill(folder: Path) -> Path:
    """Write zeros until the filesystem is full."""
    path = folder / "fill"
    with open(path, "wb") as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()
    return path


def _events(db: Path) -> list[int]:
    led = open_ledger(db)
    try:
        return [e.data["i"] for e in led.events_after(0, node_id="root") if e.data and "i" in e.data]
    finally:
        led.close()


@pytest.mark.timeout(60)
async def test_a_full_disk_is_reported_at_once_keeps_writes_and_fails_tool_writes_fast() -> None:
    with small_filesystem("1m") as fs:
        db = fs / "legion.db"
        with open_ledger(db) as led:
            led.insert_node(id="root", name="root", role="root", depth=0, status="running")
        reports: list[str] = []
        writer = LedgerWriter(db, on_disk_full=reports.append)
        try:
            entered, release = threading.Event(), threading.Event()

            def hold(_led: Ledger) -> None:
                entered.set()
                assert release.wait(WAIT)

            held = writer.submit(hold, "hold")  # keeps the next ops queued until the disk is full
            assert entered.wait(WAIT)
            kept = writer.submit(lambda led: led.append_event("root", "node_resumed", {"i": 1, "pad": BIG}), "kept")
            with fail_fast():
                dropped = writer.submit(lambda led: led.append_event("root", "node_resumed", {"i": 2, "pad": BIG}),
                                        "tool write")
            fill = _fill(fs)
            release.set()
            held.result(WAIT)
            with pytest.raises(DiskFullError, match=f"the filesystem at {fs} .* is full"):
                dropped.result(WAIT)
            assert reports and f"the filesystem at {fs}" in reports[0] and "free" in reports[0]
            assert writer.disk_full == reports[0]
            assert not kept.done()  # an ordinary write waits for space
            with fail_fast(), pytest.raises(DiskFullError):  # refused at once, never queued
                writer.submit(lambda led: led.append_event("root", "node_resumed", {"i": 3}), "refused")

            async def tool(node: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
                raise AssertionError("a tool call on a full disk must not run")

            root = SimpleNamespace(writer=writer, nodes=SimpleNamespace(tool_handler=tool))
            reply = await asyncio.wait_for(dispatch.request(
                root, None, {"op": "legion.tool", "tool": "legion_mail", "args": {}, "nodeId": "root"}, True), 1)
            assert reply is not None and reply["code"] == "DISK_FULL" and "legion resume" in reply["text"], reply

            os.unlink(fill)  # space again: the kept write lands, the condition ends
            kept.result(WAIT)
            assert writer.disk_full is None
        finally:
            writer.close(WAIT)
        assert _events(db) == [1]  # the dropped tool write left nothing behind
