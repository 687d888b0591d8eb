"""An abort that cuts the run of a child whose own children's results were waiting for its run boundary
(docs/spec-conformance.md §6.7: they are delivered there, so the cut run's settle wakes it with them at once) replies
as soon as that settle is recorded, and says the child runs again. It used to wait for the child to be idle — the
whole `ABORT_SETTLE_S`, 10 s, since the notices keep it running — and then to claim that the cut turn was still
being recorded. Found by the model-based test, tests/integration/test_orchestrator_model.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from legion.orchestration import actions
from legion.orchestration.launch import LaunchRequest
from tests.support import until
from tests.unit.orchestration.pool_double import start_run, write_project

pytestmark = pytest.mark.timeout(30)


async def test_an_abort_whose_settle_wakes_the_child_replies_once_the_cut_run_is_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(actions, "ABORT_SETTLE_S", 60.0)  # a reply that waits for an idle child never comes
    (tmp_path / "run").mkdir()
    orch, pool = start_run(tmp_path / "run", write_project(tmp_path / "project", {}))
    try:
        await orch.launch(None, LaunchRequest(agent="lead", task="lead the run", name="root", model="scripted/echo"))
        assert (await orch.handle_tool("root", "subagent", {"action": "launch", "agent": "lead", "task": "t",
                                                              "name": "a"}))["ok"]
        assert (await orch.handle_tool("a", "subagent", {"action": "launch", "agent": "worker", "task": "t",
                                                           "name": "b"}))["ok"]
        await pool.settle("b", "success")  # while a runs: its result waits for a's run boundary
        await until(lambda: orch.ctx.ledger.undelivered("a"), 5.0, "b's result owed to a")

        reply = await asyncio.wait_for(orch.handle_tool("root", "subagent", {"action": "abort", "name": "a"}), 5.0)

        assert reply["ok"] and reply["details"] == {"outcome": "interrupted", "status": "running"}, reply
        assert "still being recorded" not in reply["text"] and "running again" in reply["text"], reply["text"]
        a = orch.tree.get("a")
        assert a is not None and a.rounds == 1 and a.outcome == "aborted"  # the cut run is its round 1
        assert orch.ctx.ledger.undelivered("a") == [] and "a" in pool.running()  # woken with b's result
    finally:
        await orch.close()
        pool.close()
