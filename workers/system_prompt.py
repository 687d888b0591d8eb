"""The system prompt of a native session: legion's base prompt, the role card body, the run context.

``systemPromptMode`` (card field): ``append`` (default) puts the card body after the base prompt;
``replace`` uses the card body alone. The run context section is always added — it tells the model
who it is in the tree, where it works, which tools and budgets it has, and whether it is read-only.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from legion.workers.context import SessionContext

BASE_PROMPT = (
    "You are an expert coding agent working inside legion, a supervised tree of agent sessions. You act "
    "through tools: read files before changing them, make precise edits, run commands to check your work, "
    "and report concisely what you did and what remains. Other agents may be working in the same "
    "repository; stay within your task. Your final message is your result: make it self-contained."
)
SYSTEM_PROMPT_MODES = ("append", "replace")


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
    parts = [BASE_PROMPT] if mode == "append" else []
    if role_prompt.strip():
        parts.append(role_prompt.strip())
    parts.append(run_context(ctx, tools, today))
    return "\n\n".join(parts)
