"""A node's process record (`NodeRecord.state`) and its agent (`AgentNode.status`) agree on which states are live:
both take their states from the ledger's statuses and ask the ledger's one `LIVE_STATUSES`."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from legion.ledger.constants import LIVE_STATUSES, NODE_STATUSES
from legion.orchestration.agent_tree import AgentNode, Status
from legion.supervision.registry import NodeRecord, NodeState

pytestmark = pytest.mark.timeout(10)


def _agent(status: str) -> AgentNode:
    return AgentNode(id="a", parent=None, depth=0, role="worker", backend="inprocess", model="m", model_origin="card",
                     transcript=Path("/nonexistent"), spec={}, task="t", generations=1, status=status)  # type: ignore[arg-type]


def test_states_are_ledger_statuses() -> None:
    assert set(get_args(NodeState)) <= set(NODE_STATUSES)
    assert set(get_args(Status)) == set(NODE_STATUSES)


@pytest.mark.parametrize("state", get_args(NodeState))
def test_record_and_agent_agree_on_live(state: str) -> None:
    record = NodeRecord("a", state=state)  # type: ignore[arg-type]
    assert record.live == _agent(state).live == (state in LIVE_STATUSES)


def test_running_and_starting_are_live_settled_is_not() -> None:
    assert NodeRecord("a", state="running").live and NodeRecord("a", state="starting").live
    assert not NodeRecord("a", state="settled").live and not _agent("settled").live and _agent("blocked").live
