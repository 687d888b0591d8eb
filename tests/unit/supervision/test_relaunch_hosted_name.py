"""A launch under the name of a node that is not live in the tree but whose session the host still holds (a revive
brought it back a moment ago and its status event has not arrived) is refused NAME_TAKEN before anything is planned,
and the tree keeps the node that runs (orchestration/orchestrator.py `_launch`). It once reached the supervisor
(START_FAILED) after putting a new, failed node in the tree in place of the running one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

from legion.orchestration.agent_tree import AgentNode
from legion.orchestration.launch import LaunchRequest, RunContext
from legion.orchestration.orchestrator import Orchestrator
from legion.orchestration.refusals import NAME_TAKEN, ActionRefused


class _Host:
    """Only what the orchestrator's construction and a refused launch touch; `hosted` is the fact under test."""

    def __init__(self, hosted: set[str]) -> None:
        self._hosted = hosted
        self.started: list[str] = []

    def serve_tools(self, handler: Any) -> None: ...
    def subscribe_sessions(self, fn: Any) -> None: ...
    def subscribe_status(self, fn: Any) -> None: ...

    def hosted(self, node_id: str) -> bool:
        return node_id in self._hosted

    async def launch_rpc_session(self, spec: Any, **kw: Any) -> None:
        self.started.append(str(kw.get("name")))


def _node(name: str, parent: str | None, status: str) -> AgentNode:
    return AgentNode(id=name, parent=parent, depth=0 if parent is None else 1, role="worker", backend="rpc",
                     model="scripted/echo", model_origin="card", transcript=Path(f"/nonexistent/{name}.jsonl"),
                     spec={}, task="t", generations=1, status=status)  # type: ignore[arg-type]


def test_a_name_whose_session_is_still_hosted_is_refused_and_the_tree_keeps_it() -> None:
    host = _Host({"w1"})
    orch = Orchestrator(cast(Any, host), cast(RunContext, None))
    lead, w1 = _node("lead", None, "running"), _node("w1", "lead", "failed")  # revived; its status not yet seen
    orch.tree.add(lead)
    orch.tree.add(w1)
    with pytest.raises(ActionRefused) as refused:
        asyncio.run(orch.launch(lead, LaunchRequest(agent="worker", task="again", name="w1")))
    assert refused.value.code == NAME_TAKEN and "still hosted" in str(refused.value)
    assert orch.tree.get("w1") is w1 and w1.status == "failed" and host.started == []
