"""Launch guards that concern cards (docs/spec-conformance.md §2.3): pure checks the orchestrator calls first.

They run before anything is created (no worktree, run dir or ledger row), and refuse with
`LaunchRefused` carrying the seed's error code. The worktree downgrade only warns, once per
`WarnOnce` (one per orchestrator instance), and is never an error (docs/spec-conformance.md §10 item 28).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from legion.agents.card import AgentConfig
from legion.agents.errors import AgentDefinitionError
from legion.agents.phases import PhaseDeclaration, decode_declaration, validate_phases
from legion.agents.schema import SchemaError
from legion.agents.settings import Settings
from legion.codes import BUDGET_EXCEEDED, INVALID_PARAMS

Backend = Literal["rpc", "inprocess"]


class LaunchRefused(AgentDefinitionError):
    """A launch refused by a guard; `code` is the seed's error code."""

    def __init__(self, message: str, *, code: str = INVALID_PARAMS, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.details = details  # what a `budget_refused` event records besides the message


@dataclass
class WarnOnce:
    """Keys already warned about (keep one per orchestrator instance)."""

    seen: set[str] = field(default_factory=set)

    def first(self, key: str) -> bool:
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def check_launch_enabled(settings: Settings) -> None:
    """`enabled: false` refuses new launches only (control actions keep working)."""
    if not settings.enabled:
        raise LaunchRefused(
            "new launches are disabled ('enabled': false in settings); status, collect, wait, stop and "
            "the other control actions still work. Set 'enabled': true to launch again"
        )


def check_centurion_dispatch(agent: AgentConfig, *, parent: str, node: str, parent_is_root: bool) -> None:
    """A centurion is dispatchable only from the root session (docs/spec-conformance.md §10 item 20)."""
    if agent.is_centurion and not parent_is_root:
        raise LaunchRefused(
            f"centurion is dispatchable only from the root shell; '{parent}' at '{node}' cannot",
            code=BUDGET_EXCEEDED,
        )


def phases_for_launch(
    agent: AgentConfig, declared: Any = None, *, from_root: bool, start: str | None = None
) -> PhaseDeclaration | None:
    """The phase machine a launch runs: dispatch-declared (G4) > the centurion card's > none.

    A declaration at dispatch is root-only (G2) and centurion-only (G3); the guards of docs/spec-conformance.md §2.3. `start` applies to a bare
    phase list, or to a machine object without its own `start`. Undeclared = no machine.
    """
    if declared is None:
        if start is not None:
            raise LaunchRefused("'start' needs a phase declaration in the same launch")
        return agent.phases if agent.is_centurion else None
    if not from_root:
        raise LaunchRefused("phases can be declared only by the root session (G2); launch without 'phases'")
    if not agent.is_centurion:
        raise LaunchRefused(
            f"phases can be declared only for a centurion (G3), not for '{agent.name}'; launch without 'phases'"
        )
    try:
        if start is not None:
            declared = _with_start(decode_declaration(declared, "phases"), start)
        return validate_phases(declared, "phases")
    except SchemaError as exc:
        raise LaunchRefused(f"invalid phase declaration: {exc}") from None


def _with_start(declared: Any, start: str) -> Any:
    """`start` applies to a bare phase list (in any written form) or a machine without its own start."""
    if isinstance(declared, list):
        return {"start": start, "phases": declared}
    if isinstance(declared, dict) and "start" not in declared:
        return {**declared, "start": start}
    return declared


def worktree_for_launch(
    agent: AgentConfig, requested: bool | None = None, *, warn_once: WarnOnce | None = None
) -> tuple[bool, str | None]:
    """(worktree, warning): a non-centurion request (by the call or by its card) is downgraded to False
    with one warning per `WarnOnce`, never refused."""
    want = (agent.worktree or agent.worktree_downgraded) if requested is None else requested
    if not want or agent.is_centurion:
        return want, None
    if warn_once is not None and not warn_once.first("worktree-downgrade"):
        return False, None
    return False, (
        f"worktree requested for '{agent.name}', but worktrees are centurion-only: it runs without one "
        "and shares its parent's checkout (set worktree: false)"
    )


def backend_for_launch(worktree: bool, settings: Settings) -> Backend:
    """rpc for a launch with a worktree (a centurion) or when `supervision.forceRpc`, else inprocess."""
    return "rpc" if worktree or settings.supervision.force_rpc else "inprocess"
