"""Thinking levels (pi's names) mapped per provider API, in one table.

A level an API or model cannot honour is downgraded to the nearest one it can, with a warning logged
once per (provider, model, level) — never an error mid-run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from loguru import logger

from legion.workers.providers.base import THINKING_LEVELS

# level -> what the API receives: Anthropic extended-thinking budget_tokens; OpenAI reasoning_effort.
# None = the API has no setting for the level (downgraded to the next lower one that has).
THINKING_TABLE: Final[dict[str, dict[str, int | str | None]]] = {
    "anthropic-messages": {"off": None, "minimal": 1024, "low": 2048, "medium": 8192, "high": 16384,
                           "xhigh": None},
    "openai-completions": {"off": None, "minimal": "minimal", "low": "low", "medium": "medium", "high": "high",
                           "xhigh": None},
}

_warned: set[tuple[str, str, str]] = set()


@dataclass(frozen=True)
class ThinkingChoice:
    level: str  # the level actually used
    value: int | str | None  # what the API receives (None: thinking off)
    warning: str | None = None


def choose(api: str, provider: str, model_id: str, level: str | None, *, reasoning: bool | None = None) -> ThinkingChoice:
    """The API setting for ``level``; a model configured ``reasoning: false`` thinks ``off``."""
    requested = level or "off"
    if requested == "off":
        return ThinkingChoice("off", None)
    table = THINKING_TABLE.get(api, {})
    if reasoning is False:
        return _warn(provider, model_id, requested, ThinkingChoice(
            "off", None, f"{provider}/{model_id} is configured with reasoning: false; thinking level "
                         f"{requested!r} is ignored (thinking off)"))
    index = THINKING_LEVELS.index(requested) if requested in THINKING_LEVELS else 0
    for candidate in reversed(THINKING_LEVELS[1:index + 1]):
        value = table.get(candidate)
        if value is not None:
            if candidate == requested:
                return ThinkingChoice(candidate, value)
            return _warn(provider, model_id, requested, ThinkingChoice(
                candidate, value, f"thinking level {requested!r} is not supported by {api} "
                                  f"({provider}/{model_id}); using {candidate!r}"))
    return _warn(provider, model_id, requested, ThinkingChoice(
        "off", None, f"{api} has no thinking setting; level {requested!r} ignored for {provider}/{model_id}"))


def _warn(provider: str, model_id: str, level: str, choice: ThinkingChoice) -> ThinkingChoice:
    key = (provider, model_id, level)
    if key not in _warned:
        _warned.add(key)
        logger.warning(choice.warning)
    return choice
