"""What an action refuses with: one exception type and every refusal code of the orchestration layer.

An action (a model's tool call or an operator verb) that cannot be carried out raises `ActionRefused` with a code
from this module and a message that says how to fix it; the orchestrator turns it into the tool's error reply
(`{"ok": false, "code": …}`), the operator socket into its error frame (docs/protocol.md §4). The two codes the
agents layer's guards also use are defined there and re-exported here, and so is `CWD_NOT_ALLOWED` (a launch's `cwd`
outside its caller's allowed working directories: `legion.agents.cwd_admission`)."""

from __future__ import annotations

from typing import Any, Final

from legion.agents.cwd_admission import CWD_NOT_ALLOWED
from legion.agents.guards import BUDGET_EXCEEDED, INVALID_PARAMS

NAME_TAKEN: Final = "NAME_TAKEN"
UNKNOWN_AGENT: Final = "UNKNOWN_AGENT"
CHILD_TERMINAL: Final = "CHILD_TERMINAL"
NOT_YOUR_CHILD: Final = "NOT_YOUR_CHILD"
UNKNOWN_CHILD: Final = "UNKNOWN_CHILD"
SUBAGENT_NOT_STEERABLE: Final = "SUBAGENT_NOT_STEERABLE"
WORKTREE_REFUSED: Final = "WORKTREE_REFUSED"
MAIL_UNKNOWN_TARGET: Final = "MAIL_UNKNOWN_TARGET"
MAIL_CROSS_SUBTREE: Final = "MAIL_CROSS_SUBTREE"
MAIL_NO_RECIPIENT: Final = "MAIL_NO_RECIPIENT"
QUEUE_FULL: Final = "QUEUE_FULL"  # the pool's admission queue has no place (inprocess.maxQueuedLaunches)

__all__ = ["BUDGET_EXCEEDED", "CHILD_TERMINAL", "CWD_NOT_ALLOWED", "INVALID_PARAMS", "MAIL_CROSS_SUBTREE", "MAIL_NO_RECIPIENT",
           "MAIL_UNKNOWN_TARGET", "NAME_TAKEN", "NOT_YOUR_CHILD", "QUEUE_FULL", "SUBAGENT_NOT_STEERABLE", "UNKNOWN_AGENT",
           "UNKNOWN_CHILD", "WORKTREE_REFUSED", "ActionRefused"]


class ActionRefused(Exception):
    """A refused launch or action: `code` is one of this module's codes, the message says how to fix it."""

    def __init__(self, message: str, code: str = INVALID_PARAMS, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.details = details
