"""The frozen delivery predicates of docs/spec-conformance.md §6.3 as pure functions (no I/O), shared by the postman.

- `is_terminal(node)`: failed, or a terminal phase (done/failed/aborted). Bounce and orphan scan share
  it, and it is deliberately *not* widened (§10 item 16 of the same document).
- `has_ended(node)`: is_terminal, or status settled/retired.
- `is_phase_timeout_notice(message)`: only `kind == "notice"` with a subject starting `Phase timeout:`
  can ever be auto-obsoleted (§10 item 14: there is no kind `instruction`).
- `obsolete_reason(message, sender, notice_phase, notice_phase_since)`: why such a notice lost its
  meaning, or None. "That phase" comes from the generating `phase_timeout` event's data, never from
  the body. Obsolete when the sender's current phase/phase_since differ (re-entering the same phase
  or a revival moving phase_since counts, §10 item 17) or the sender has ended (§10 item 16).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from legion.ledger.constants import TERMINAL_PHASES

PHASE_TIMEOUT_SUBJECT_PREFIX: Final = "Phase timeout:"
OBSOLETE_REASON: Final = "obsolete_after_phase_change"


def is_terminal(node: Mapping[str, Any] | None) -> bool:
    """A node that can never take mail again."""
    return node is not None and (node.get("status") == "failed" or node.get("phase") in TERMINAL_PHASES)


def has_ended(node: Mapping[str, Any] | None) -> bool:
    """Terminal, settled or retired (the sender side of the OBSOLETE rule)."""
    return node is not None and (is_terminal(node) or node.get("status") in ("settled", "retired"))


def is_phase_timeout_notice(message: Mapping[str, Any]) -> bool:
    """The only mail the OBSOLETE rule may ever touch."""
    subject = message.get("subject")
    return message.get("kind") == "notice" and isinstance(subject, str) and subject.startswith(PHASE_TIMEOUT_SUBJECT_PREFIX)


def obsolete_reason(
    message: Mapping[str, Any],
    sender: Mapping[str, Any] | None,
    notice_phase: str | None,
    notice_phase_since: int | None,
) -> str | None:
    """OBSOLETE_REASON when the notice lost its meaning before delivery/confirmation, else None."""
    if not is_phase_timeout_notice(message):
        return None
    if sender is None or has_ended(sender):
        return OBSOLETE_REASON
    if sender.get("phase") != notice_phase or sender.get("phase_since") != notice_phase_since:
        return OBSOLETE_REASON
    return None
