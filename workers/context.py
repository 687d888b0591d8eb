"""Per-session context: identity, role, team, phases, budget, cwd and environment of one session.

Sessions hosted in one pool process share ``os.environ``; everything session-specific travels in a
``SessionContext`` (docs/spec-conformance.md §3.5, §10 items 34–35) — nothing here reads or mutates ``os.environ``.
``current_context`` is a ``contextvars.ContextVar`` set inside each session's task, for code deep in a
call stack (tools) that has no explicit handle.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from legion.ledger.location import SECRET_ENV


@dataclass(frozen=True)
class Budget:
    """Per-session guard limits (None = unlimited); counted by ``legion.workers.guard``."""

    turn_budget: int | None = None
    tool_budget: int | None = None
    tool_timeout_ms: int | None = None
    max_depth: int | None = None
    allow_nested: bool = False

    def __post_init__(self) -> None:
        for name in ("turn_budget", "tool_budget", "tool_timeout_ms", "max_depth"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"Budget.{name} must be a non-negative integer or None, got {value!r}")


@dataclass(frozen=True)
class SessionContext:
    """Everything one session needs to know about itself; immutable, one per session."""

    node_id: str
    cwd: str
    role: str | None = None
    team: str | None = None
    phases: Any = None
    acceptance_role: str | None = None
    utility: bool = False
    budget: Budget = field(default_factory=Budget)
    env: Mapping[str, str] = field(default_factory=dict)
    ledger_path: str | None = None
    ledger_run: str | None = None  # the run id of a shared (PostgreSQL) ledger
    run_dir: str | None = None
    parent_id: str | None = None
    depth: int = 0

    def __post_init__(self) -> None:
        if not self.node_id or not isinstance(self.node_id, str):
            raise ValueError("SessionContext.node_id must be a non-empty string")
        if not isinstance(self.cwd, str) or not self.cwd:
            raise ValueError("SessionContext.cwd must be a non-empty path string")
        # freeze a private copy so a caller mutating its dict cannot leak into this session
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    @property
    def read_only(self) -> bool:
        return self.acceptance_role == "read-only"

    def tool_env(self) -> dict[str, str]:
        """Environment for a tool subprocess: the session's own mapping plus its identity markers, which
        come from this context only (a session without a team never shows another one's team)."""
        env = dict(self.env)
        env["LEGION_NODE_ID"] = self.node_id
        for key, value in (("LEGION_ROLE", self.role), ("LEGION_TEAM", self.team)):
            if value:
                env[key] = value
            else:
                env.pop(key, None)
        return env


# Identity and budget variables of a launching process (docs/spec-conformance.md §1.6 and legion's own markers): a
# session never inherits them from the process hosting it (§10 items 34–35); its context sets its own.
IDENTITY_ENV = frozenset({
    "LEGION_NODE_ID", "LEGION_ROLE", "LEGION_TEAM", "PI_LEGION_DB", "PI_LEGION_NODE_ID", "PI_SUBAGENT_ROLE",
    "PI_SUBAGENT_ACCEPTANCE_ROLE", "PI_LEGION_PHASES", "PI_SUBAGENT_UTILITY_CHILD", "PI_SUBAGENT_CHILD",
    "PI_SUBAGENT_CHILD_ROLE", "PI_SUBAGENT_PARENT_PATH", "PI_SUBAGENTS_TEAM", "PI_SUBAGENT_MAX_DEPTH",
    "PI_SUBAGENT_ALLOW_NESTED", "PI_SUBAGENT_MAX_TOOL_CALLS", "PI_SUBAGENT_MAX_TURNS",
    "PI_SUBAGENT_TOOL_TIMEOUT_MS"})


def inherited_env(process_env: Mapping[str, str]) -> dict[str, str]:
    """A snapshot of the hosting process's environment without identity/budget variables, and without the
    ledger's credentials (a session's tools have no business with the ledger's database)."""
    return {k: v for k, v in process_env.items() if k not in IDENTITY_ENV and k not in SECRET_ENV}


current_context: contextvars.ContextVar[SessionContext | None] = contextvars.ContextVar(
    "legion_session_context", default=None)

# The id of the tool call being executed (set by the session around each call): a legion tool request
# carries it, so a launch replayed by a restarted parent gets the existing child back.
current_tool_call: contextvars.ContextVar[str | None] = contextvars.ContextVar("legion_tool_call", default=None)
