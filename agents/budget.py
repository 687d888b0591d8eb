"""Per-child budget and restart policy derived from a card (the single producer; docs/spec-conformance.md §1.6, §2.4).

Depth is counted in *generations*: a child's `max_depth` R is how many generations its subtree may
have, itself included (1 = leaf, may not spawn). R only tightens down the tree: it is the least of
the parent's R − 1, the lineage cap `legion.maxDepth` − the child's depth + 1, and the card's
`maxSubagentDepth`. Utility agents are always leaves. The lineage cap never exceeds the hard ceiling
`MAX_DEPTH_CEILING` (4, as the original's): a larger `legion.maxDepth` is capped, with one warning per run
(docs/spec-conformance.md §2.4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from legion.agents.card import AgentConfig
from legion.agents.guards import BUDGET_EXCEEDED, LaunchRefused
from legion.agents.phases import PhaseDeclaration
from legion.agents.settings import Settings

MAX_DEPTH_CEILING: Final = 4  # generations below the root at most, whatever legion.maxDepth says


def depth_cap(settings: Settings) -> tuple[int, str | None]:
    """The lineage cap launches use, and the warning to give once when `legion.maxDepth` exceeds the ceiling."""
    requested = int(settings.get("legion.maxDepth"))
    if requested <= MAX_DEPTH_CEILING:
        return requested, None
    return MAX_DEPTH_CEILING, (f"legion.maxDepth {requested} exceeds the hard ceiling {MAX_DEPTH_CEILING}; "
                               f"launches use maxDepth {MAX_DEPTH_CEILING} (set legion.maxDepth to at most "
                               f"{MAX_DEPTH_CEILING} to silence this)")


@dataclass(frozen=True)
class ChildBudget:
    """Field names match `legion.workers.context.Budget`, so `Budget(**asdict(b))` works."""

    turn_budget: int | None
    tool_budget: int | None
    tool_timeout_ms: int | None
    max_depth: int
    allow_nested: bool


@dataclass(frozen=True)
class RestartPolicy:
    restart: str
    max_restarts: int
    restart_period_ms: int


def child_budget(
    agent: AgentConfig,
    settings: Settings,
    *,
    child_depth: int,
    parent_max_depth: int | None = None,
    parent: str = "parent",
) -> ChildBudget:
    """The budget a new child runs under; refuses (`BUDGET_EXCEEDED`) when no generation is left."""
    lineage_cap, capped = depth_cap(settings)
    limits = [lineage_cap - child_depth + 1]
    if parent_max_depth is not None:
        limits.append(parent_max_depth - 1)
    if agent.max_subagent_depth is not None:
        limits.append(agent.max_subagent_depth)
    generations = min(limits)
    if generations < 1:
        requested = int(settings.get("legion.maxDepth"))
        cap = f"legion.maxDepth {requested} capped at the hard ceiling {lineage_cap}" if capped else \
            f"legion.maxDepth {lineage_cap}"
        raise LaunchRefused(
            f"'{parent}' cannot launch '{agent.name}' at depth {child_depth}: the depth budget is exhausted "
            f"({cap}, parent generations left {parent_max_depth})",
            code=BUDGET_EXCEEDED, scope="depth", depth=child_depth, requestedMaxDepth=requested,
            effectiveMaxDepth=lineage_cap,
        )
    if agent.utility:
        generations = 1
    return ChildBudget(
        turn_budget=agent.turn_budget,
        tool_budget=agent.tool_budget,
        tool_timeout_ms=agent.tool_timeout_ms,
        max_depth=generations,
        allow_nested=agent.allow_nested_subagents and generations > 1 and not agent.utility,
    )


def restart_policy(agent: AgentConfig, settings: Settings) -> RestartPolicy:
    """The card's restart fields, falling back to `supervision.*` settings."""
    sup = settings.supervision
    return RestartPolicy(
        restart=agent.restart,
        max_restarts=agent.max_restarts if agent.max_restarts is not None else sup.max_restarts,
        restart_period_ms=agent.restart_period_ms
        if agent.restart_period_ms is not None
        else sup.restart_period_ms,
    )


def phase_timeouts_ms(machine: PhaseDeclaration, settings: Settings) -> dict[str, int]:
    """Each declared non-terminal phase's timeout (0 = none), by the clock-source chain of
    `Settings.phase_timeout_ms`: an operator-written value > the declaration's `timeoutMs` > built-in.

    Only an explicitly written setting beats the card, so a default-filled 3600000 never hides a
    card's 300000 (docs/spec-conformance.md §10 item 18).
    """
    declared = machine.timeouts_ms()
    return {
        p.id: settings.phase_timeout_ms(p.id, declared.get(p.id)) for p in machine.phases if not p.terminal
    }
