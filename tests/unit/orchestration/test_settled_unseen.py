"""A node relaunched idle may have ended a run whose settle the root never saw (its host died first); the root
records that round from the count of ended runs its worker took at the relaunch (orchestration/orchestrator.py
`_settled_unseen`). Counting the transcript later raced the input that follows the relaunch: when that input's
run had already ended in the transcript but its settle was still on its way, the round was recorded twice (seen
under two busy loops in tests/e2e/test_notices.py, a third round `r3` with round two's text)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from legion.ledger import open_ledger
from legion.ledger.ledger import Ledger
from legion.orchestration.agent_tree import AgentNode
from legion.orchestration.launch import RunContext
from legion.orchestration.orchestrator import Orchestrator
from legion.workers.outcome import run_ends
from legion.workers.transcript import Transcript


class _Host:
    def serve_tools(self, handler: Any) -> None: ...
    def subscribe_sessions(self, fn: Any) -> None: ...
    def subscribe_status(self, fn: Any) -> None: ...

    def hosted(self, node_id: str) -> bool:
        return True

    async def session_request(self, node_id: str, op: str, **body: Any) -> dict[str, Any]:
        return {"ok": True, "disposition": "accepted"}

    def settled_outcome(self, node_id: str, outcome: str) -> None: ...

    async def park(self, node_id: str) -> None: ...


def _transcript(path: Path, answers: list[str]) -> Path:
    t = Transcript.open(path, cwd="/w")
    for i, answer in enumerate(answers):
        t.append_message({"role": "user", "content": f"input {i}", "timestamp": 2 * i + 1})
        t.append_message({"role": "assistant", "content": [{"type": "text", "text": answer}], "stopReason": "stop",
                          "timestamp": 2 * i + 2})
    t.close()
    return path


def _orchestrator(tmp_path: Path, led: Ledger, transcript: Path) -> tuple[Orchestrator, AgentNode]:
    led.insert_node(id="root", name="root", role="root", depth=0, status="running")
    led.insert_node(id="c1", name="c1", role="worker", depth=1, parent_id="root", status="settled")
    led.record_artifact(node_id="c1", name="c1", round=1, bytes=3)
    ctx = RunContext(run_dir=tmp_path, run_id="r", cwd=tmp_path, settings=cast(Any, None),
                     catalog=cast(Any, None), ledger=led, env={})
    orch = Orchestrator(cast(Any, _Host()), ctx)
    for name, parent, status in (("root", None, "running"), ("c1", "root", "starting")):
        orch.tree.add(AgentNode(id=name, parent=parent, depth=0 if parent is None else 1, role="worker",
                                backend="inprocess", model="scripted/echo", model_origin="card",
                                transcript=transcript if name == "c1" else tmp_path / "root.jsonl", spec={},
                                task="t", generations=1, status=status))  # type: ignore[arg-type]
    orch.root_id = "root"
    c1 = orch.tree.get("c1")
    assert c1 is not None
    c1.rounds = 1
    return orch, c1


async def _relaunched_idle(orch: Orchestrator, node: AgentNode, ends: int) -> None:
    orch._on_status(node.id, "settled", None, {"outcome": "success", "resumed": True, "ends": ends})
    await asyncio.wait_for(_until_settled(node), 5)


async def _until_settled(node: AgentNode) -> None:
    while node.work.settling:
        await asyncio.sleep(0.005)


def test_a_run_the_input_after_the_relaunch_started_is_not_recorded_by_the_relaunch(tmp_path: Path) -> None:
    transcript = _transcript(tmp_path / "c1.jsonl", ["round one answer", "round two answer"])
    led = open_ledger(tmp_path / "legion.db")
    try:
        orch, c1 = _orchestrator(tmp_path, led, transcript)
        # relaunched idle with one ended run; the input's run (round two) has ended in the transcript since, and
        # its settle is still on its way
        assert run_ends(transcript) == 2
        asyncio.run(_relaunched_idle(orch, c1, ends=1))
        assert [a["round"] for a in led.list_artifacts(node_id="c1")] == [1]
    finally:
        led.close()


def test_a_run_that_ended_before_the_relaunch_unseen_is_recorded(tmp_path: Path) -> None:
    transcript = _transcript(tmp_path / "c1.jsonl", ["round one answer", "round two answer"])
    led = open_ledger(tmp_path / "legion.db")
    try:
        orch, c1 = _orchestrator(tmp_path, led, transcript)
        asyncio.run(_relaunched_idle(orch, c1, ends=2))  # its host died after round two ended, before its settle
        assert [a["round"] for a in led.list_artifacts(node_id="c1")] == [1, 2]
    finally:
        led.close()
