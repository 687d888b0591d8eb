"""A batch of completion notices that could not be handed over (its parent's host, the pool, restarting after a
crash) is tried again shortly and holds the run open meanwhile (orchestration/orchestrator.py `deliver_notices`).
It used to wait for "the next boundary": when every other node had settled there was none, and the run ended with
the result still owed to its parent."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

from legion.ledger import open_ledger
from legion.orchestration import orchestrator
from legion.orchestration.agent_tree import AgentNode
from legion.orchestration.launch import RunContext
from legion.orchestration.orchestrator import Orchestrator


class _Host:
    """A host whose pool is restarting: the first `failures` prompts fail, as `ChildNotFound` does then."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.prompts: list[str] = []

    def serve_tools(self, handler: Any) -> None: ...
    def subscribe_sessions(self, fn: Any) -> None: ...
    def subscribe_status(self, fn: Any) -> None: ...

    def hosted(self, node_id: str) -> bool:
        return True

    async def session_request(self, node_id: str, op: str, **body: Any) -> dict[str, Any]:
        self.prompts.append(node_id)
        if len(self.prompts) <= self.failures:
            raise RuntimeError("worker 'pool' is not running")
        return {"ok": True, "disposition": "accepted"}


def _node(name: str, parent: str | None) -> AgentNode:
    return AgentNode(id=name, parent=parent, depth=0 if parent is None else 1, role="worker", backend="inprocess",
                     model="scripted/echo", model_origin="card", transcript=Path(f"/nonexistent/{name}.jsonl"),
                     spec={}, task="t", generations=1, status="settled")


def test_an_undelivered_notice_is_tried_again_and_holds_the_run_until_it_lands(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(orchestrator, "NOTICE_RETRY_S", 0.01)
    led = open_ledger(tmp_path / "legion.db")
    try:
        led.insert_node(id="root", name="root", role="root", depth=0, status="settled")
        led.insert_node(id="w1", name="w1", role="worker", depth=1, parent_id="root", status="settled")
        led.record_artifact(node_id="w1", name="w1", round=1, bytes=3)
        ctx = RunContext(run_dir=tmp_path, run_id="r", cwd=tmp_path, settings=cast(Any, None),
                         catalog=cast(Any, None), ledger=led, env={})
        host = _Host(failures=2)
        orch = Orchestrator(cast(Any, host), ctx)
        root = _node("root", None)
        orch.tree.add(root)
        orch.tree.add(_node("w1", "root"))
        orch.root_id = "root"

        async def deliver() -> None:
            await orch.deliver_notices("root")  # the pool is restarting: not handed over
            assert root.work.holds == 1 and not orch.done.is_set()  # a retry is due: the run stays open
            await asyncio.wait_for(orch.done.wait(), 5)

        asyncio.run(deliver())
        assert host.prompts == ["root", "root", "root"]  # two failures, then handed over
        assert led.undelivered("root") == [] and root.work.holds == 0
    finally:
        led.close()


class _BusyHost(_Host):
    """Each prompt succeeds; while the first is on its way, `arrive` records another child's result for it."""

    def __init__(self, arrive: Any) -> None:
        super().__init__(failures=0)
        self.arrive = arrive

    async def session_request(self, node_id: str, op: str, **body: Any) -> dict[str, Any]:
        if not self.prompts:
            self.arrive()
        return await super().session_request(node_id, op, **body)


def test_a_result_owed_to_a_settled_lead_holds_the_run_and_is_delivered(tmp_path: Path) -> None:
    """A result that reaches a lead while a batch of notices to it is on its way: the batch's end must not end the
    run with that result still owed (its delivery used to be spawned after the end-of-run check, and the lead's own
    result then found its root stopping: the chaos failure of stop 30)."""
    led = open_ledger(tmp_path / "legion.db")
    try:
        led.insert_node(id="root", name="root", role="root", depth=0, status="settled")
        led.insert_node(id="lead", name="lead", role="lead", depth=1, parent_id="root", status="settled")
        for w in ("w1", "w2"):
            led.insert_node(id=w, name=w, role="worker", depth=2, parent_id="lead", status="settled")
        led.record_artifact(node_id="w1", name="w1", round=1, bytes=3)
        ctx = RunContext(run_dir=tmp_path, run_id="r", cwd=tmp_path, settings=cast(Any, None),
                         catalog=cast(Any, None), ledger=led, env={})
        host = _BusyHost(lambda: led.record_artifact(node_id="w2", name="w2", round=1, bytes=3))
        orch = Orchestrator(cast(Any, host), ctx)
        for node in (_node("root", None), _node("lead", "root"), _node("w1", "lead"), _node("w2", "lead")):
            orch.tree.add(node)
        orch.root_id = "root"

        async def deliver() -> None:
            await orch.deliver_notices("lead")  # w1's result; w2's arrives meanwhile
            assert not orch.done.is_set()  # w2's result is still owed to the lead
            await asyncio.wait_for(orch.done.wait(), 5)

        asyncio.run(deliver())
        assert host.prompts == ["lead", "lead"]  # one batch each
        assert led.undelivered("lead") == [] and led.owed_consumers() == []
    finally:
        led.close()


def test_a_settle_or_notice_task_in_flight_holds_the_run_until_it_ends(tmp_path: Path) -> None:
    """Nothing live and nothing owed yet, but a spawned settle (or batch of notices) has not run to its end: what it
    records may wake a node, so the run ends only after it, from the task's own end."""
    led = open_ledger(tmp_path / "legion.db")
    try:
        led.insert_node(id="root", name="root", role="root", depth=0, status="settled")
        ctx = RunContext(run_dir=tmp_path, run_id="r", cwd=tmp_path, settings=cast(Any, None),
                         catalog=cast(Any, None), ledger=led, env={})
        orch = Orchestrator(cast(Any, _Host(failures=0)), ctx)
        orch.tree.add(_node("root", None))
        orch.root_id = "root"

        async def scenario() -> None:
            gate = asyncio.Event()
            orch._spawn(gate.wait(), "settled:w1")
            orch._check_done()
            assert not orch.done.is_set()  # the settle is still on its way
            gate.set()
            await asyncio.wait_for(orch.done.wait(), 5)  # its end checked again

        asyncio.run(scenario())
    finally:
        led.close()
