"""The registry of legion tool handlers (circus's `commands/` shape): one handler per action or tool.

`ACTIONS` maps each `subagent` action to its handler, `TOOLS` each legion tool; modules register with the
`action(name)` / `tool(name)` decorators: `actions.py` (the 13 `subagent` actions, `vexillatio`,
`legion_tree`), `mail_tools.py` (`legion_mail`), `teams.py` (`legion_phase`). A handler gets the
orchestrator, the calling node and the validated arguments and returns a reply
`{"ok", "text", "details"?, "code"?}`; a refusal raises `ActionRefused` with the spec's code.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from legion.orchestration.agent_tree import AgentNode
    from legion.orchestration.orchestrator import Orchestrator

Reply = dict[str, Any]
Handler = Callable[["Orchestrator", "AgentNode", dict[str, Any]], Awaitable[Reply]]
ACTIONS: dict[str, Handler] = {}
TOOLS: dict[str, Handler] = {}
HANDLER_MODULES = ("legion.orchestration.actions", "legion.orchestration.mail_tools", "legion.orchestration.teams")


def action(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        ACTIONS[name] = fn
        return fn

    return register


def tool(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        TOOLS[name] = fn
        return fn

    return register


def load_handlers() -> None:
    """Import every handler module once (they register themselves)."""
    for module in HANDLER_MODULES:
        importlib.import_module(module)
