"""A launch record keeps the launching tool call, so a lead revived mid-launch replays it instead of launching
its children again (`legion resume` after a root SIGKILL)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from legion.orchestration.agent_tree import AgentNode, AgentTree
from legion.orchestration.orchestrator import Orchestrator
from legion.orchestration.run import load_launch_records, save_launch_record


def test_a_restored_node_keeps_its_launching_tool_call(tmp_path: Path) -> None:
    node = AgentNode(id="w1", parent="lead", depth=2, role="worker", backend="inprocess", model="scripted/echo",
                     model_origin="card", transcript=tmp_path / "w1.jsonl", spec={}, task="do it", generations=1,
                     tool_call="call_7")
    save_launch_record(tmp_path, node)
    rows: list[dict[str, Any]] = [{"id": "w1", "parent_id": "lead", "depth": 2, "role": "worker",
                                   "model": "scripted/echo", "session_file": str(node.transcript),
                                   "status": "running", "team": None}]
    fake = SimpleNamespace(tree=AgentTree(), root_id=None,
                           ctx=SimpleNamespace(ledger=SimpleNamespace(list_artifacts=lambda node_id: [])))
    restored = Orchestrator.restore(fake, rows, load_launch_records(tmp_path))  # type: ignore[arg-type]
    assert [n.id for n in restored] == ["w1"]
    assert [n.id for n in fake.tree.by_tool_call("lead", "call_7")] == ["w1"]
