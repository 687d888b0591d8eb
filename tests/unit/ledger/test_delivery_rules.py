"""The frozen delivery predicates (docs/spec-conformance.md §6.3; regressions 11, 13, 14, 16, 17)."""

from __future__ import annotations

import pytest

from legion.ledger import Delivery, Ledger
from legion.ledger.delivery_rules import (
    OBSOLETE_REASON,
    has_ended,
    is_phase_timeout_notice,
    is_terminal,
    obsolete_reason,
)

from .conftest import FakeClock

pytestmark = pytest.mark.timeout(30)

NOTICE = {"kind": "notice", "subject": "Phase timeout: implementing"}


@pytest.mark.parametrize(
    ("node", "terminal", "ended"),
    [
        ({"status": "running", "phase": "implementing"}, False, False),
        ({"status": "failed", "phase": None}, True, True),
        ({"status": "running", "phase": "done"}, True, True),
        ({"status": "running", "phase": "aborted"}, True, True),
        ({"status": "settled", "phase": "reviewing"}, False, True),
        ({"status": "retired", "phase": "implementing"}, False, True),
        (None, False, False),
    ],
)
def test_terminal_and_ended(node: dict[str, object] | None, terminal: bool, ended: bool) -> None:
    assert is_terminal(node) is terminal
    assert has_ended(node) is ended


def test_only_phase_timeout_notices_can_be_obsolete() -> None:
    # docs/spec-conformance.md §10 item 14: kind must be notice and the subject must start "Phase timeout:".
    ended = {"status": "retired", "phase": "implementing", "phase_since": 1}
    assert is_phase_timeout_notice(NOTICE)
    for other in (
        {"kind": "report", "subject": "Phase timeout: implementing"},
        {"kind": "instruction", "subject": "Phase timeout: implementing"},
        {"kind": "notice", "subject": "phase timeout: implementing"},
        {"kind": "notice", "subject": "Re: Phase timeout: implementing"},
        {"kind": None, "subject": "Phase timeout: x"},
    ):
        assert not is_phase_timeout_notice(other)
        assert obsolete_reason(other, ended, "implementing", 1) is None


def test_obsolete_when_sender_moved_on_or_ended() -> None:
    live = {"status": "running", "phase": "implementing", "phase_since": 100}
    assert obsolete_reason(NOTICE, live, "implementing", 100) is None
    assert obsolete_reason(NOTICE, {**live, "phase": "reviewing"}, "implementing", 100) == OBSOLETE_REASON
    # docs/spec-conformance.md §10 item 17: a revival re-entering the same phase moves phase_since -> old notice obsolete.
    assert obsolete_reason(NOTICE, {**live, "phase_since": 200}, "implementing", 100) == OBSOLETE_REASON
    # docs/spec-conformance.md §10 item 16: a sender that ended inside the timed-out phase.
    assert obsolete_reason(NOTICE, {**live, "status": "settled"}, "implementing", 100) == OBSOLETE_REASON
    assert obsolete_reason(NOTICE, None, "implementing", 100) == OBSOLETE_REASON


def test_pending_to_obsolete_before_injection(tree: Ledger) -> None:
    # docs/spec-conformance.md §10 item 11: checked before delivery -> PENDING -> OBSOLETE, never injected.
    tree.update_node("team", phase="implementing", phase_since=100)
    mid = tree.send_mail("team", "root", NOTICE["subject"], "…", kind="notice", urgency="action-needed").id
    tree.update_node("team", phase="reviewing", phase_since=200)
    msg = tree.get_message(mid)
    assert msg is not None
    reason = obsolete_reason(msg, tree.get_node("team"), "implementing", 100)
    assert reason == OBSOLETE_REASON
    assert tree.transition_delivery(mid, Delivery.OBSOLETE, reason=reason) == Delivery.OBSOLETE
    assert tree.events_after(0)[-1].data["reason"] == OBSOLETE_REASON


def test_rotating_confirmation_cursor_reaches_every_accepted_mail(tree: Ledger, clock: FakeClock) -> None:
    # docs/spec-conformance.md §10 item 13: with > 20 undecidable ACCEPTED mails a later one is still reached
    # within ceil(M/20) ticks by taking id > cursor and wrapping at the end.
    ids = []
    for i in range(45):
        ids.append(tree.send_mail(f"w{1 + i % 2}", "root", "s", "b").id)
        clock.advance(60_000)  # stay under the per-sender rate limit
    for mid in ids:
        tree.transition_delivery(mid, Delivery.ACCEPTED)
    target = ids[-1]
    cursor, ticks, reached = 0, 0, False
    while not reached and ticks < 10:
        ticks += 1
        page = tree.messages_in_state(Delivery.ACCEPTED, to_node="root", after_id=cursor, limit=20)
        if not page:
            cursor = 0
            page = tree.messages_in_state(Delivery.ACCEPTED, to_node="root", after_id=cursor, limit=20)
        reached = target in [m["id"] for m in page]
        cursor = page[-1]["id"]
    assert reached and ticks <= -(-45 // 20)
