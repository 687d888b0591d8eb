"""Churn: many crash-looping workers under a live root, then a pause — nothing stuck, nothing leaked."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from legion.ledger import open_ledger
from legion.supervision.child_spec import ExitReason, RetireTimeouts
from legion.supervision.root import RootSupervisor
from legion.supervision.rpc_child import RpcNode
from legion.supervision.supervisor import Backoff
from legion.workers.fixture_worker import ENTRY, find_marked

pytestmark = pytest.mark.timeout(90)


async def test_crash_loops_then_pause_leave_no_survivor_and_no_stuck_status() -> None:
    base = Path(tempfile.mkdtemp(prefix="lgc", dir="/tmp"))
    marker = f"churn-{uuid.uuid4().hex[:10]}"
    root = RootSupervisor(base / "run", heartbeat_interval=0.2, max_restarts=10_000,
                          backoff=Backoff(base=0.01, cap=0.05))
    try:
        await root.start()
        fast = RetireTimeouts(retire=1.0, signal=0.3, kill=0.3)
        ids = [f"c{i}" for i in range(6)]
        await asyncio.gather(*(
            root.nodes.launch(RpcNode(i, ENTRY, {"mode": "crash", "exit_after": 0.05 + 0.03 * n, "children": 1,
                                           "marker": marker}, shutdown=fast))
            for n, i in enumerate(ids)
        ))
        await root.nodes.launch_team("steady", members=[RpcNode("s1", ENTRY, {"marker": marker, "children": 1},
                                                          shutdown=fast)])
        deadline = time.monotonic() + 30
        while min(root.registry.record(i).attempt for i in ids) < 4:
            assert time.monotonic() < deadline, "workers did not crash-loop"
            await asyncio.sleep(0.05)
        reason = await root.stop()
        assert reason == ExitReason.shutdown("session-shutdown")
        with open_ledger(root.ledger_path) as ledger:
            statuses = {n["id"]: n["status"] for n in ledger.subtree("root")}
            assert statuses["root"] == "retired"
            stuck = {k: v for k, v in statuses.items() if v not in ("retired", "failed", "settled")}
            assert stuck == {}
            launched = [e for e in ledger.events_after(0, limit=10_000) if e.type == "node_launched"]
            assert len(launched) >= 6 * 4
        assert root.lifecycle is not None and root.lifecycle.errors == 0
        deadline = time.monotonic() + 5
        while find_marked(marker):
            assert time.monotonic() < deadline, f"survivors: {find_marked(marker)}"
            await asyncio.sleep(0.05)
    finally:
        if root.supervisor is not None and not root._closed.is_set():
            await root.stop(force=True)
        shutil.rmtree(base, ignore_errors=True)
