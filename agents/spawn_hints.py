"""Spawn hints (docs/spec-conformance.md §2.11): one `Hint:` line appended to a launch or start failure, pointing at the fix.

A pure, idempotent function: a message that already carries a hint (or a doctor excerpt) is returned as
is; credential failures (a missing or refused key) beat model-resolution failures; refusals whose own
message already says the fix (`NAME_TAKEN`, `BUDGET_EXCEEDED`, …) and plain errors get nothing.
"""

from __future__ import annotations

import re

from legion.codes import (
    BUDGET_EXCEEDED,
    CHILD_TERMINAL,
    INVALID_PARAMS,
    NAME_TAKEN,
    NOT_YOUR_CHILD,
    SUBAGENT_NOT_STEERABLE,
    UNKNOWN_CHILD,
)

HINT_MARKERS = ("Hint:", "--- Legion auto-doctor")
NO_HINT_CODES = frozenset({NAME_TAKEN, BUDGET_EXCEEDED, NOT_YOUR_CHILD, UNKNOWN_CHILD, CHILD_TERMINAL, INVALID_PARAMS,
                           SUBAGENT_NOT_STEERABLE})
_CREDENTIAL = re.compile(r"API key missing|No API key found for|Authentication failed for|authentication failed|"
                         r"No matching provider is authenticated|is set but empty", re.IGNORECASE)
_PROVIDER = re.compile(r"provider '([^']+)'")
_MODEL = re.compile(r"unknown provider|has no model|unknown model|model .* must be 'provider/model-id|"
                    r"model resolve failed|is not usable|cannot read script", re.IGNORECASE)


def append_hint(message: str, code: str | None = None) -> str:
    """`message` with a `Hint:` line when one applies (see the module docstring)."""
    if not message or any(marker in message for marker in HINT_MARKERS) or code in NO_HINT_CODES:
        return message
    if _CREDENTIAL.search(message):
        provider = _PROVIDER.search(message)
        which = f" for provider '{provider.group(1)}'" if provider else ""
        return (f"{message}\nHint: the key{which} is missing or refused — export it in the environment legion "
                "runs in (`legion doctor models` shows which variable each provider reads).")
    if _MODEL.search(message):
        return (f"{message}\nHint: check the model in the card, `.legion/settings.json` or pi's models.json "
                "(`legion doctor models` lists each card's effective model and whether its provider is configured).")
    return message
