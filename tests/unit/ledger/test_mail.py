"""Mail storage: limits, rate limit (query plan), the 5-value delivery domain, claim leases, events."""

from __future__ import annotations

import itertools

import pytest

from legion.ledger import (
    Delivery,
    DeliveryClaimLostError,
    InvalidDeliveryTransitionError,
    Ledger,
    LedgerError,
    MailInvalidFieldError,
    MailInvalidTextError,
    MailRateLimitedError,
    MailTooLargeError,
    MessageNotFoundError,
    open_ledger,
)
from legion.ledger.mail import RATE_COUNT_SQL

from .conftest import RUN, FakeClock, foreign_write

pytestmark = pytest.mark.timeout(30)


def test_send_stores_pending_and_writes_mail_sent(tree: Ledger, clock: FakeClock) -> None:
    sent = tree.send_mail("w1", "team", "status", "all good", kind="report", urgency="action-needed")
    msg = tree.get_message(sent.id)
    assert msg is not None
    assert (msg["from_node"], msg["to_node"], msg["subject"], msg["body"], msg["kind"], msg["urgency"]) == (
        "w1", "team", "status", "all good", "report", "action-needed",
    )
    assert msg["delivered"] == Delivery.PENDING and msg["delivered_at"] is None and msg["created_at"] == clock.now
    [event] = tree.events_after(0)
    assert event.id == sent.event_id and event.type == "mail_sent" and event.node_id == "w1"
    assert event.data["message_id"] == sent.id and event.data["to"] == "team"
    assert sent.warnings == ()
    assert [m["id"] for m in tree.pending_inbox("team")] == [sent.id]


def test_recent_mail_lists_the_newest_of_a_box_oldest_first(tree: Ledger, target: object) -> None:
    ids = [tree.send_mail("w1", "team", f"s{i}", "b").id for i in range(4)]
    back = tree.send_mail("team", "w1", "reply", "b").id
    assert [m["id"] for m in tree.recent_mail(to_node="team")] == ids
    assert [m["id"] for m in tree.recent_mail(to_node="team", limit=2)] == ids[2:]  # the newest two
    assert [m["id"] for m in tree.recent_mail(from_node="team")] == [back]
    assert [m["id"] for m in tree.recent_mail()] == [*ids, back]
    assert tree.recent_mail(to_node="w2") == []
    if isinstance(target, str):  # PostgreSQL: another run's mail in the same database is not this run's
        other = open_ledger(target, run_id="another-run")
        try:
            assert other.recent_mail() == []
        finally:
            other.close()


def test_subject_limit_in_bytes(tree: Ledger) -> None:
    tree.send_mail("w1", "team", "s" * 256, "b")
    with pytest.raises(MailTooLargeError, match="257 bytes"):
        tree.send_mail("w1", "team", "s" * 257, "b")
    with pytest.raises(MailTooLargeError):
        tree.send_mail("w1", "team", "é" * 129, "b")  # 258 bytes, 129 chars


def test_body_soft_and_hard_limits(tree: Ledger) -> None:
    assert tree.send_mail("w1", "team", "s", "x" * 4096).warnings == ()
    soft = tree.send_mail("w1", "team", "s", "x" * 4097)
    assert len(soft.warnings) == 1 and "soft limit" in soft.warnings[0]
    assert tree.send_mail("w1", "team", "s", "x" * 32768).warnings
    with pytest.raises(MailTooLargeError, match="hard limit"):
        tree.send_mail("w1", "team", "s", "x" * 32769)


def test_nul_and_bad_fields_refused_and_nothing_stored(tree: Ledger) -> None:
    with pytest.raises(MailInvalidTextError, match="U\\+0000"):
        tree.send_mail("w1", "team", "s", "a\x00b")
    with pytest.raises(MailInvalidTextError):
        tree.send_mail("w1", "team", "s\x00", "b")
    with pytest.raises(MailInvalidTextError, match="not valid Unicode"):
        tree.send_mail("w1", "team", "s", "\ud800")
    with pytest.raises(MailInvalidFieldError, match="kind"):
        tree.send_mail("w1", "team", "s", "b", kind="instruction")
    with pytest.raises(MailInvalidFieldError, match="urgency"):
        tree.send_mail("w1", "team", "s", "b", urgency="urgent")
    with pytest.raises(MailInvalidFieldError, match="recipient"):
        tree.send_mail("w1", "", "s", "b")
    with pytest.raises(MailInvalidFieldError, match="not a node"):
        tree.send_mail("ghost", "team", "s", "b")
    assert tree.mailbox_stats("team")["pending"] == 0
    assert tree.events_after(0) == []


def test_rate_limit_ten_per_five_minutes(tree: Ledger, clock: FakeClock) -> None:
    for _ in range(10):
        tree.send_mail("w1", "team", "s", "b")
        clock.advance(1000)
    with pytest.raises(MailRateLimitedError, match="10 mails"):
        tree.send_mail("w1", "team", "s", "b")
    tree.send_mail("w2", "team", "s", "b")  # per sender
    clock.advance(5 * 60 * 1000 - 10_000)  # the first mail leaves the window
    tree.send_mail("w1", "team", "s", "b")
    with pytest.raises(MailRateLimitedError):
        tree.send_mail("w1", "team", "s", "b")


def test_rate_limit_configurable(target, clock: FakeClock) -> None:  # type: ignore[no-untyped-def]
    led = open_ledger(target, clock=clock, mail_rate_per_5_min=2, run_id=RUN)
    try:
        led.insert_node(id="a", name="a", role="w", depth=0)
        led.send_mail("a", "a", "s", "b")
        led.send_mail("a", "a", "s", "b")
        with pytest.raises(MailRateLimitedError):
            led.send_mail("a", "a", "s", "b")
    finally:
        led.close()


@pytest.mark.sqlite_only
def test_rate_query_uses_idx_messages_rate(tree: Ledger) -> None:
    # docs/spec-conformance.md §10 items 3–4: the COUNT inside the write transaction must not scan the table.
    plan = tree._db.raw.execute("EXPLAIN QUERY PLAN " + RATE_COUNT_SQL, ("w1", 0)).fetchall()
    detail = " ".join(row[-1] for row in plan)
    assert "idx_messages_rate" in detail and "SEARCH" in detail and "SCAN" not in detail


ALL = list(Delivery.__members__.values())
LEGAL = {(0, 1), (0, 2), (0, 4), (1, 3), (1, 4)}


def _mail_in_state(led: Ledger, state: Delivery) -> int:
    sent = led.send_mail("w1", "w2", "s", "b")
    path = {0: [], 1: [1], 2: [2], 3: [1, 3], 4: [4]}[int(state)]
    for step in path:
        led.transition_delivery(sent.id, Delivery(step))
    return sent.id


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(range(5), range(5))))
def test_delivery_transition_table(target, clock: FakeClock, src: int, dst: int) -> None:  # type: ignore[no-untyped-def]
    led = open_ledger(target, clock=clock, mail_rate_per_5_min=1000, run_id=RUN)
    try:
        led.insert_node(id="w1", name="w1", role="w", depth=0)
        led.insert_node(id="w2", name="w2", role="w", depth=0)
        mid = _mail_in_state(led, Delivery(src))
        if src == dst or (src, dst) in LEGAL:
            assert led.transition_delivery(mid, Delivery(dst)) == dst
            assert led.get_message(mid)["delivered"] == dst  # type: ignore[index]
        else:
            with pytest.raises(InvalidDeliveryTransitionError, match=f"{src}->{dst} is illegal"):
                led.transition_delivery(mid, Delivery(dst))
            assert led.get_message(mid)["delivered"] == src  # type: ignore[index]
    finally:
        led.close()


def test_delivery_enum_and_alias() -> None:
    assert [int(d) for d in (Delivery.PENDING, Delivery.ACCEPTED, Delivery.BOUNCED, Delivery.DELIVERED, Delivery.OBSOLETE)] == [0, 1, 2, 3, 4]
    assert Delivery.INJECTED is Delivery.ACCEPTED


def test_delivery_events(tree: Ledger, clock: FakeClock) -> None:
    a = tree.send_mail("w1", "w2", "s", "b").id
    b = tree.send_mail("w1", "w2", "s", "b").id
    c = tree.send_mail("w1", "w2", "Phase timeout: planning", "b", kind="notice").id
    cursor = tree.last_event_id()
    clock.advance(50)
    tree.transition_delivery(a, Delivery.ACCEPTED)  # no event
    assert tree.events_after(cursor) == []
    assert tree.get_message(a)["delivered_at"] == clock.now  # type: ignore[index]
    tree.transition_delivery(a, Delivery.DELIVERED)
    tree.transition_delivery(b, Delivery.BOUNCED, reason="intercepted_by_input_handler")
    tree.transition_delivery(c, Delivery.OBSOLETE)
    got = [(e.type, e.node_id, e.data.get("reason")) for e in tree.events_after(cursor)]
    assert got == [
        ("mail_delivered", "w2", None),
        ("mail_bounced", "w1", "intercepted_by_input_handler"),
        ("mail_bounced", "w1", "obsolete_after_phase_change"),
    ]
    assert tree.mailbox_stats("w2") == {"pending": 0, "accepted": 0, "bounced": 1, "delivered": 1, "obsolete": 1}
    with pytest.raises(MessageNotFoundError):
        tree.transition_delivery(9999, Delivery.ACCEPTED)
    with pytest.raises(LedgerError, match="delivery state 7"):
        tree.transition_delivery(a, 7)


def test_accepted_to_terminal_recipient_lands_bounced(tree: Ledger) -> None:
    tree.update_node("w2", status="failed")
    mid = tree.send_mail("w1", "w2", "s", "b").id
    assert tree.transition_delivery(mid, Delivery.ACCEPTED) == Delivery.BOUNCED
    assert tree.get_message(mid)["delivered"] == Delivery.BOUNCED  # type: ignore[index]
    assert tree.events_after(0)[-1].data["reason"] == "recipient_terminal"


def test_claim_renew_release(tree: Ledger, clock: FakeClock) -> None:
    mid = tree.send_mail("w1", "w2", "s", "b").id
    token = tree.claim_for_delivery(mid)
    assert token == clock.now
    assert tree.claim_for_delivery(mid) is None  # held
    clock.advance(20_000)
    renewed = tree.renew_delivery_claim(mid, token)
    assert renewed == clock.now
    assert tree.renew_delivery_claim(mid, token) is None  # stale token
    clock.advance(59_999)
    assert tree.claim_for_delivery(mid) is None  # lease still live (renewed)
    clock.advance(1)
    stolen = tree.claim_for_delivery(mid)  # expired: the next claimer takes it
    assert stolen == clock.now
    assert tree.renew_delivery_claim(mid, renewed) is None  # the old holder lost it
    assert tree.release_delivery_claim(mid, renewed) is False
    assert tree.release_delivery_claim(mid, stolen) is True
    assert tree.get_message(mid)["delivered_at"] is None  # type: ignore[index]
    assert tree.claim_for_delivery(mid) is not None
    assert tree.release_delivery_claim(mid) is True
    tree.transition_delivery(mid, Delivery.ACCEPTED)
    assert tree.claim_for_delivery(mid) is None  # only PENDING mail can be claimed


def test_messages_in_state_cursor(tree: Ledger) -> None:
    ids = [tree.send_mail("w1", "w2", "s", "b").id for _ in range(5)]
    for mid in ids:
        tree.transition_delivery(mid, Delivery.ACCEPTED)
    page = tree.messages_in_state(Delivery.ACCEPTED, to_node="w2", after_id=ids[1], limit=2)
    assert [m["id"] for m in page] == ids[2:4]


def test_refusals_inside_a_caller_transaction_write_nothing(tree: Ledger, clock: FakeClock) -> None:
    with tree.transaction():
        tree.heartbeat("w1")
        for bad in (("ghost", "w2", "s", "b"), ("w1", "w2", "s", "\x00")):
            with pytest.raises((MailInvalidFieldError, MailInvalidTextError)):
                tree.send_mail(*bad)
        tree.append_event("w1", "node_launched")
    assert tree.get_message(1) is None
    assert [e.type for e in tree.events_after(0)] == ["node_launched"]


def test_limits_count_utf8_bytes_not_characters(tree: Ledger, clock: FakeClock) -> None:
    # Subject: 128 × 'é' = 256 bytes (accepted); 64 × 4-byte emoji = 256 bytes (accepted), one more byte refused.
    tree.send_mail("w1", "w2", "é" * 128, "b")
    tree.send_mail("w1", "w2", "\U0001f600" * 64, "b")
    with pytest.raises(MailTooLargeError, match="257 bytes"):
        tree.send_mail("w1", "w2", "\U0001f600" * 64 + "x", "b")
    # Body: 2048 × 'é' = 4096 bytes, no warning; one more byte (2049 chars only) warns.
    assert tree.send_mail("w1", "w2", "s", "é" * 2048).warnings == ()
    assert tree.send_mail("w1", "w2", "s", "é" * 2048 + "x").warnings
    clock.advance(5 * 60 * 1000)  # leave the rate window
    # Hard: 8192 × 4-byte emoji = 32768 bytes (stored), 8193 chars of which one ASCII refused.
    big = tree.send_mail("w1", "w2", "s", "\U0001f600" * 8192)
    assert tree.get_message(big.id)["body"] == "\U0001f600" * 8192  # type: ignore[index]
    with pytest.raises(MailTooLargeError, match="32769 bytes"):
        tree.send_mail("w1", "w2", "s", "\U0001f600" * 8192 + "x")
    assert tree.mailbox_stats("w2")["pending"] == 5


def test_expired_or_taken_lease_writes_nothing(tree: Ledger, clock: FakeClock) -> None:
    mid = tree.send_mail("w1", "w2", "s", "b").id
    token = tree.claim_for_delivery(mid)
    assert token is not None
    clock.advance(60_000)  # expired, nobody has claimed it yet: renewing must not revive it
    assert tree.renew_delivery_claim(mid, token) is None
    with pytest.raises(DeliveryClaimLostError, match="expired"):
        tree.transition_delivery(mid, Delivery.ACCEPTED, token=token)
    newer = tree.claim_for_delivery(mid)
    assert newer is not None and newer != token
    with pytest.raises(DeliveryClaimLostError, match="taken over"):  # the old holder finishes late
        tree.transition_delivery(mid, Delivery.ACCEPTED, token=token)
    msg = tree.get_message(mid)
    assert msg is not None and msg["delivered"] == Delivery.PENDING and msg["delivered_at"] == newer
    assert [e.type for e in tree.events_after(0)] == ["mail_sent"]
    clock.advance(59_999)  # the live holder writes
    assert tree.transition_delivery(mid, Delivery.ACCEPTED, token=newer) == Delivery.ACCEPTED
    assert tree.transition_delivery(mid, Delivery.ACCEPTED, token=token) == Delivery.ACCEPTED  # same value: no-op


def test_refusal_codes_are_machine_readable(tree: Ledger) -> None:
    with pytest.raises(MailInvalidTextError) as info:
        tree.send_mail("w1", "w2", "s", "\x00")
    assert info.value.code == "MAIL_INVALID_TEXT" and str(info.value).startswith("MAIL_INVALID_TEXT:")
    with pytest.raises(MailTooLargeError) as too_large:
        tree.send_mail("w1", "w2", "s" * 300, "b")
    assert too_large.value.code == "MAIL_TOO_LARGE"


def test_out_of_domain_delivery_values_are_ledger_errors(tree: Ledger, target) -> None:  # type: ignore[no-untyped-def]
    mid = tree.send_mail("w1", "w2", "s", "b").id
    for bad in (5, -1, True, "1"):
        with pytest.raises(LedgerError, match=r"not one of 0\.\.4"):
            tree.transition_delivery(mid, bad)  # type: ignore[arg-type]
    assert tree.get_message(mid)["delivered"] == Delivery.PENDING  # type: ignore[index]
    foreign_write(target, "UPDATE messages SET delivered = 9 WHERE id = ?",  # a value outside the domain
                  "UPDATE messages SET delivered = 9 WHERE id = %s", (mid,))
    with pytest.raises(LedgerError, match="corrupt"):
        tree.transition_delivery(mid, Delivery.ACCEPTED)
    with pytest.raises(LedgerError, match="stored delivered value"):
        tree.mailbox_stats("w2")


def test_addressed_names_every_recipient_without_a_read_after_the_first(target: object, tree: Ledger) -> None:
    """`addressed`: seeded by one read (mail already there), then kept by every send of this process, also through
    another Ledger on the same database (the root's writer thread has its own): a node not in it has no mail."""
    tree.send_mail("w1", "team", "before", "seeded by the first read")
    other = open_ledger(target, run_id=RUN)  # type: ignore[arg-type]
    try:
        assert other.addressed() == {"team"}
        tree.send_mail("team", "w2", "after", "kept by the send, no read")
        book = other.addressed()
        assert book is not None and "w2" in book and "w1" not in book and "root" not in book
        other.note_addressed(["root"])  # found by a reader (mail another process wrote)
        assert "root" in (tree.addressed() or set())
    finally:
        other.close()


def test_an_in_memory_ledger_keeps_no_book() -> None:
    with open_ledger(":memory:") as mem:
        assert mem.addressed() is None
