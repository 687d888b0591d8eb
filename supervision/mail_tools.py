"""`legion_mail` (SEED-SPEC §6): routing along tree edges and delivery are not built yet."""

from __future__ import annotations

from typing import Any

from legion.supervision.agent_tree import AgentNode
from legion.supervision.commands import Reply, tool
from legion.supervision.launch import LaunchError
from legion.supervision.orchestrator import Orchestrator


@tool("legion_mail")
async def legion_mail(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    raise LaunchError("legion_mail is not available in this version of legion: mail routing and delivery are not "
                      "built yet. Put what you need to say in your final answer (your parent receives it).",
                      "UNSUPPORTED")
