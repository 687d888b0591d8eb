"""The last step of a session's system prompt: legion's base prompt + the role part + the run context.

There is one composer: the role part (card body, project context files, default reads) is composed from
the card by ``legion.agents.compose_system_prompt`` at launch and travels in the session spec as
``rolePrompt``; here the worker adds the one base prompt (``legion.agents.prompt.BASE_PROMPT``) in
``append`` mode (``replace`` leaves it out) and the run context section, which only the worker can write —
who the session is in the tree, where it works, which tools and budgets it has, whether it is read-only.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from legion.agents.fields import SYSTEM_PROMPT_MODES
from legion.agents.prompt import BASE_PROMPT
from legion.workers.context import SessionContext

__all__ = ["BASE_PROMPT", "SYSTEM_PROMPT_MODES", "build_system_prompt", "run_context"]



def run_context(ctx: SessionContext, tools: Sequence[str] | None, today: str | None = None) -> str:
    """The "# Run context" section (deterministic given ``today``; ``tools`` None = not listed)."""
    who = f"node `{ctx.node_id}`"
    if ctx.role:
        who += f", role `{ctx.role}`"
    if ctx.team:
        who += f", team `{ctx.team}`"
    lines = ["# Run context", f"- You are {who} at depth {ctx.depth}"
             + (f", child of `{ctx.parent_id}`." if ctx.parent_id else "."),
             f"- Working directory: {ctx.cwd}",
             f"- Date: {today or datetime.now(UTC).date().isoformat()}"]
    if tools is not None:
        lines.append(f"- Tools: {', '.join(tools) if tools else '(none)'}")
    budget = ctx.budget
    limits = [f"{name} {value}" for name, value in (("turnBudget", budget.turn_budget),
                                                    ("toolBudget", budget.tool_budget),
                                                    ("toolTimeoutMs", budget.tool_timeout_ms)) if value is not None]
    if limits:
        lines.append(f"- Budgets: {', '.join(limits)} (the run stops when a budget is spent)")
    if ctx.read_only:
        lines.append("- You are read-only: inspect and report; do not modify files, the repository or the system.")
    if ctx.utility:
        lines.append("- You are a utility agent: answer the question you were given and stop.")
    lines.append("- Never open legion.db directly; use the legion tools for anything about the tree or mail.")
    return "\n".join(lines)


def build_system_prompt(role_prompt: str, ctx: SessionContext, tools: Sequence[str] | None, *, mode: str = "append",
                        today: str | None = None) -> str:
    """Base prompt (append mode) + role card body + run context."""
    if mode not in SYSTEM_PROMPT_MODES:
        raise ValueError(f"systemPromptMode must be append or replace, got {mode!r}")
    parts = [BASE_PROMPT.strip()] if mode == "append" else []
    if role_prompt.strip():
        parts.append(role_prompt.strip())
    parts.append(run_context(ctx, tools, today))
    return "\n\n".join(parts)
