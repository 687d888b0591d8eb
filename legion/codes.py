"""Every error and refusal code of legion, defined once (docs/architecture.md, glossary: refusal).

A code is the machine-readable half of an error that crosses a boundary: a tool's error reply
(`{"ok": false, "code": …}`), the operator socket's error frame (docs/protocol.md §4), a worker's reply to the
root, a `launch_failed` process event, a stored `node_failed`/`budget_refused` event. Every layer imports its
codes from here and restates none (`tests/unit/meta/test_vocabulary.py` checks it).

This module imports nothing, so every component may import it, the process layer too (its retire ladder raises
`RETIRE_FAILED`): like `legion.lazy_exports`, it is a leaf of the root package, below every component.
Phase-machine decision reasons (lower case, `legion.orchestration.phase_machine.REASONS`) and a node's failure
reasons (`legion.supervision.lifecycle`) are their own closed sets, not codes.
"""

from __future__ import annotations

from typing import Final

# -- any layer: a request that is malformed, or failed for a reason the caller cannot fix -------------------------
INVALID_PARAMS: Final = "INVALID_PARAMS"  # the request's parameters are invalid (the default refusal)
INTERNAL: Final = "INTERNAL"  # an unexpected exception inside the handler; the message names it
ERROR: Final = "ERROR"  # a worker's error reply that carried no code of its own

# -- definitions (legion.agents): cards, settings, teams, presets, models, verdicts ----------------------------
INVALID_DEFINITION: Final = "INVALID_DEFINITION"
INVALID_CARD: Final = "INVALID_CARD"
INVALID_SETTINGS: Final = "INVALID_SETTINGS"
INVALID_VERDICT: Final = "INVALID_VERDICT"  # a reviewer's answer has no well-formed verdict block

# -- launch and action refusals (the guards of legion.agents, the orchestration layer's actions) ------------------
BUDGET_EXCEEDED: Final = "BUDGET_EXCEEDED"  # a depth, fan-out or cost budget refuses the launch
CWD_NOT_ALLOWED: Final = "CWD_NOT_ALLOWED"  # a launch's cwd outside its caller's allowed working directories
NAME_TAKEN: Final = "NAME_TAKEN"
UNKNOWN_AGENT: Final = "UNKNOWN_AGENT"
CHILD_TERMINAL: Final = "CHILD_TERMINAL"
NOT_YOUR_CHILD: Final = "NOT_YOUR_CHILD"
UNKNOWN_CHILD: Final = "UNKNOWN_CHILD"
SUBAGENT_NOT_STEERABLE: Final = "SUBAGENT_NOT_STEERABLE"
WORKTREE_REFUSED: Final = "WORKTREE_REFUSED"

# -- mail (the ledger refuses a send; the postman refuses a recipient) ---------------------------------------------
MAIL_REFUSED: Final = "MAIL_REFUSED"
MAIL_INVALID_TEXT: Final = "MAIL_INVALID_TEXT"
MAIL_TOO_LARGE: Final = "MAIL_TOO_LARGE"
MAIL_INVALID_FIELD: Final = "MAIL_INVALID_FIELD"
MAIL_RATE_LIMITED: Final = "MAIL_RATE_LIMITED"
MAIL_UNKNOWN_TARGET: Final = "MAIL_UNKNOWN_TARGET"
MAIL_CROSS_SUBTREE: Final = "MAIL_CROSS_SUBTREE"
MAIL_NO_RECIPIENT: Final = "MAIL_NO_RECIPIENT"

# -- a session host's admission of a launch (legion.workers.pool), and its replies ----------------------------------
QUEUE_FULL: Final = "QUEUE_FULL"  # the admission queue has no place (inprocess.maxQueuedLaunches)
QUEUE_TIMEOUT: Final = "QUEUE_TIMEOUT"  # waited its queue time out
START_TIMEOUT: Final = "START_TIMEOUT"
START_FAILED: Final = "START_FAILED"
DUPLICATE: Final = "DUPLICATE"  # the node (or its transcript) already has a session
CANCELLED: Final = "CANCELLED"  # retired while queued or starting
CLOSED: Final = "CLOSED"  # the host is shutting down
NO_SESSION: Final = "NO_SESSION"  # a request about a session this worker does not host
UNKNOWN_OP: Final = "UNKNOWN_OP"  # a request op the worker does not know

# -- the root (legion.supervision) ---------------------------------------------------------------------------------
NO_REPLY: Final = "NO_REPLY"  # a pool did not answer a launch
DISK_FULL: Final = "DISK_FULL"  # the ledger cannot write; the run is pausing
RETIRE_FAILED: Final = "RETIRE_FAILED"  # a retire whose stop could not be verified; also a node's failure reason
