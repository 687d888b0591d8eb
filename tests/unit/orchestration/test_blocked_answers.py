"""How a steer's message answers the dialog a blocked child waits on (`legion.orchestration.blocked.answer_for`)."""

from __future__ import annotations

import pytest

from legion.orchestration.blocked import answer_for, notice_text
from legion.orchestration.refusals import INVALID_PARAMS, ActionRefused

CONFIRM = {"requestId": "r1", "method": "confirm", "title": "Run bash?", "message": "rm -rf build"}
SELECT = {"requestId": "r2", "method": "select", "title": "Which?", "options": ["Allow", "Block"]}
INPUT = {"requestId": "r3", "method": "input", "title": "Name?", "placeholder": "a name"}


@pytest.mark.parametrize(("request_", "message", "response", "how"), [
    (CONFIRM, "approve", {"confirmed": True}, "approved"),
    (CONFIRM, " Yes ", {"confirmed": True}, "approved"),
    (CONFIRM, "reject", {"confirmed": False}, "rejected"),
    (SELECT, "Block", {"value": "Block"}, "chose 'Block'"),
    (SELECT, "allow", {"value": "Allow"}, "chose 'Allow'"),
    (SELECT, "reject", {"cancelled": True}, "rejected"),
    (INPUT, "alpha beta", {"value": "alpha beta"}, "answered"),
    (INPUT, "cancel", {"cancelled": True}, "rejected"),
])
def test_a_message_answers_the_dialog(request_: dict[str, object], message: str, response: dict[str, object],
                                      how: str) -> None:
    assert answer_for("c1", request_, message) == (response, how)


@pytest.mark.parametrize(("request_", "message", "hint"), [
    (CONFIRM, "maybe later", "'approve' or 'reject'"),
    (SELECT, "Perhaps", "one of 'Allow', 'Block', or 'reject'"),
])
def test_a_message_that_does_not_answer_is_refused_with_the_way_to_answer(
        request_: dict[str, object], message: str, hint: str) -> None:
    with pytest.raises(ActionRefused) as info:
        answer_for("c1", request_, message)
    assert info.value.code == INVALID_PARAMS
    assert "does not answer it" in str(info.value) and hint in str(info.value)
    assert info.value.details["state"] == "blocked"


def test_the_notice_names_the_question_and_the_answer() -> None:
    text = notice_text("c1", SELECT)
    assert "'c1' is blocked" in text and "Title: Which?" in text and "Options: Allow, Block" in text
    assert "subagent steer (name 'c1'" in text
