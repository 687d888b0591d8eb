"""Property-based checks: arbitrary mail text, delivery sequences and event data never corrupt the ledger."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from legion.ledger import (
    Delivery,
    InvalidDeliveryTransitionError,
    Ledger,
    LedgerError,
    MailRefusedError,
    open_ledger,
)

pytestmark = pytest.mark.timeout(120)
LEGAL = {(0, 1), (0, 2), (0, 4), (1, 3), (1, 4)}
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def led() -> Iterator[Ledger]:
    ledger = open_ledger(":memory:", mail_rate_per_5_min=10**9)
    ledger.insert_node(id="a", name="a", role="w", depth=0)
    ledger.insert_node(id="b", name="b", role="w", depth=0)
    yield ledger
    ledger.close()


@FAST
@given(subject=st.text(max_size=300), body=st.text(max_size=5000))
def test_any_text_is_stored_exactly_or_refused_cleanly(led: Ledger, subject: str, body: str) -> None:
    try:
        sent = led.send_mail("a", "b", subject, body)
    except MailRefusedError as exc:
        assert exc.code in ("MAIL_INVALID_TEXT", "MAIL_TOO_LARGE")
        return
    msg = led.get_message(sent.id)
    assert msg is not None and msg["subject"] == subject and msg["body"] == body
    assert "\x00" not in subject + body
    assert len(subject.encode()) <= 256


@FAST
@given(steps=st.lists(st.sampled_from(list(range(5))), max_size=8))
def test_delivery_sequences_follow_the_model(led: Ledger, steps: list[int]) -> None:
    mid = led.send_mail("a", "b", "s", "b").id
    state = 0
    for target in steps:
        if target == state or (state, target) in LEGAL:
            assert led.transition_delivery(mid, Delivery(target)) == target
            state = target
        else:
            with pytest.raises(InvalidDeliveryTransitionError):
                led.transition_delivery(mid, Delivery(target))
        assert led.get_message(mid)["delivered"] == state  # type: ignore[index]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.text(max_size=20)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@FAST
@given(data=st.dictionaries(st.text(max_size=10), json_values, max_size=5))
def test_event_data_round_trips(led: Ledger, data: dict[str, Any]) -> None:
    try:
        event_id = led.append_event("a", "phase_change", data)
    except LedgerError:
        return  # e.g. a string orjson refuses (lone surrogate): refused, nothing stored
    [event] = led.events_after(event_id - 1, limit=1)
    assert event.id == event_id and event.data == data
