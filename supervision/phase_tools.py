"""`legion_phase` (SEED-SPEC §5): the phase machine is not run yet."""

from __future__ import annotations

from typing import Any

from legion.supervision.agent_tree import AgentNode
from legion.supervision.commands import Reply, tool
from legion.supervision.launch import LaunchError
from legion.supervision.orchestrator import Orchestrator


@tool("legion_phase")
async def legion_phase(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    raise LaunchError("legion_phase is not available in this version of legion: the phase machine is not run "
                      "yet. Report your phase in your final answer.", "UNSUPPORTED")
