"""The dispatch tables of the legion tools and actions (circus's `commands/` shape), keyed by their specs.

An action is defined once, as an `ActionSpec` in `legion.workers.tools.action_specs` (its `subagent` fields,
its operator lanes, its CLI arguments); a legion tool by its schema in `legion.workers.tools.legion_tools`.
Here each gets its handler: `ACTIONS` maps every action to one, `TOOLS` every legion tool. Modules register
with the `action(name)` / `tool(name)` decorators: `actions.py` (the `subagent` actions, `vexillatio`,
`legion_tree`), `mail_tools.py` (`legion_mail`, the operator's `mail`), `teams.py` (`legion_phase`), `run.py`
(the operator's `pause`). A name without a spec, or registered twice, fails at import; `load_handlers` fails
when a spec has no handler. A handler gets the orchestrator, the calling node and the arguments and returns
a reply `{"ok", "text", "details"?, "code"?}`; a refusal raises `ActionRefused` with the spec's code.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from legion.workers.tools.action_specs import ACTION_SPECS
from legion.workers.tools.legion_tools import LEGION_TOOLS

if TYPE_CHECKING:
    from legion.orchestration.agent_tree import AgentNode
    from legion.orchestration.orchestrator import Orchestrator

Reply = dict[str, Any]
Handler = Callable[["Orchestrator", "AgentNode", dict[str, Any]], Awaitable[Reply]]
ACTIONS: dict[str, Handler] = {}
TOOLS: dict[str, Handler] = {}
HANDLER_MODULES = ("legion.orchestration.actions", "legion.orchestration.mail_tools", "legion.orchestration.teams",
                   "legion.orchestration.run")


class HandlerTableError(RuntimeError):
    """The handlers and the specs disagree: a handler without a spec, a second handler, or a spec without one."""


def _register(table: dict[str, Handler], known: Any, what: str, name: str) -> Callable[[Handler], Handler]:
    if name not in known:
        raise HandlerTableError(f"a handler for the unknown {what} {name!r}: define it first (known: "
                                f"{', '.join(known)})")

    def register(fn: Handler) -> Handler:
        if name in table and table[name] is not fn:
            raise HandlerTableError(f"a second handler for the {what} {name!r}: {table[name].__module__}."
                                    f"{table[name].__qualname__} and {fn.__module__}.{fn.__qualname__}")
        table[name] = fn
        return fn

    return register


def action(name: str) -> Callable[[Handler], Handler]:
    """Register the handler of the action `name` (an `ActionSpec` in workers/tools/action_specs.py)."""
    return _register(ACTIONS, ACTION_SPECS, "action", name)


def tool(name: str) -> Callable[[Handler], Handler]:
    """Register the handler of the legion tool `name` (workers/tools/legion_tools.py)."""
    return _register(TOOLS, LEGION_TOOLS, "legion tool", name)


def load_handlers() -> None:
    """Import every handler module once (they register themselves); every action and tool has its handler."""
    for module in HANDLER_MODULES:
        importlib.import_module(module)
    missing = [n for n in ACTION_SPECS if n not in ACTIONS] + [n for n in LEGION_TOOLS if n not in TOOLS]
    if missing:
        raise HandlerTableError(f"no handler for {', '.join(missing)}: register one with @action/@tool in one of "
                                f"{', '.join(HANDLER_MODULES)}")
