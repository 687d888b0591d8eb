"""What an action refuses with: one exception type and every refusal code of the orchestration layer.

An action (a model's tool call or an operator verb) that cannot be carried out raises `ActionRefused` with a code
from this module and a message that says how to fix it; the orchestrator turns it into the tool's error reply
(`{"ok": false, "code": …}`), the operator socket into its error frame (docs/protocol.md §4). The codes are defined
in `legion.codes` (every code of legion, in one module) and re-exported here for the layer's modules."""

from __future__ import annotations

from typing import Any

from legion.codes import (
    BUDGET_EXCEEDED,
    CHILD_TERMINAL,
    CWD_NOT_ALLOWED,
    INVALID_PARAMS,
    MAIL_CROSS_SUBTREE,
    MAIL_NO_RECIPIENT,
    MAIL_UNKNOWN_TARGET,
    NAME_TAKEN,
    NOT_YOUR_CHILD,
    QUEUE_FULL,
    START_FAILED,
    SUBAGENT_NOT_STEERABLE,
    UNKNOWN_AGENT,
    UNKNOWN_CHILD,
    WORKTREE_REFUSED,
)
from legion.ledger.errors import Refusal

__all__ = ["BUDGET_EXCEEDED", "CHILD_TERMINAL", "CWD_NOT_ALLOWED", "INVALID_PARAMS", "MAIL_CROSS_SUBTREE", "MAIL_NO_RECIPIENT",
           "MAIL_UNKNOWN_TARGET", "NAME_TAKEN", "NOT_YOUR_CHILD", "QUEUE_FULL", "START_FAILED",
           "SUBAGENT_NOT_STEERABLE", "UNKNOWN_AGENT",
           "UNKNOWN_CHILD", "WORKTREE_REFUSED", "ActionRefused"]


class ActionRefused(Refusal):
    """A refused launch or action: `code` is one of `legion.codes`, the message says how to fix it."""

    def __init__(self, message: str, code: str = INVALID_PARAMS, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.details = details
