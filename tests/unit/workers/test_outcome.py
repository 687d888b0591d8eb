"""derive_outcome: only the last turn's stopReason and output decide (docs/spec-conformance.md §2.1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from legion.workers.outcome import derive_outcome, last_turn_output, outcome_of_messages
from legion.workers.transcript import Transcript, create_empty


def _a(text: str, stop: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}] if text else [], "stopReason": stop}


def _u(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


@pytest.mark.parametrize(("messages", "expected"), [
    ([_u("go"), _a("done", "stop")], "success"),
    ([_u("go"), _a("", "stop")], "failed"),
    ([_u("go"), _a("   ", "stop")], "failed"),
    ([_u("go"), _a("cut", "length")], "truncated"),
    ([_u("go"), _a("", "error")], "failed"),
    ([_u("go"), _a("part", "aborted")], "aborted"),
    ([_u("go"), _a("x", "toolUse")], "unknown"),
    ([_u("go"), _a("x", "sensitive")], "failed"),  # an unrecognised stop reason is not a missing one
    ([_u("go"), {"role": "assistant", "content": [{"type": "text", "text": "x"}]}], "unknown"),
    ([_u("go"), _a("done", "stop"), _u("more")], "unknown"),
    ([_u("go"), _a("x", "toolUse"), {"role": "toolResult", "content": []}], "unknown"),
    ([_u("go")], "unknown"),
    ([], "unknown"),
    ([_u("go"), _a("bad", "error"), _u("retry"), _a("good", "stop")], "success"),
    ([_u("go"), _a("good", "stop"), _u("again"), _a("", "error")], "failed"),
    ([_u("go"), _a("good", "stop"), {"role": "user", "content": "note", "customType": "legion.worker_restart"}],
     "success"),
])
def test_outcome_table(messages: list[dict[str, Any]], expected: str) -> None:
    assert outcome_of_messages(messages) == expected


def test_derive_outcome_from_file(tmp_path: Path) -> None:
    p = create_empty(tmp_path / "s.jsonl")
    assert derive_outcome(p) == "unknown"
    assert derive_outcome(tmp_path / "missing.jsonl") == "unknown"
    t = Transcript.open(p, cwd="/w")
    t.append_message({"role": "user", "content": "go", "timestamp": 1})
    t.append_message({**_a("the answer", "stop"), "timestamp": 2})
    t.close()
    assert derive_outcome(p) == "success"
    assert last_turn_output(Transcript.open(p, cwd="/w").messages()) == "the answer"


def test_final_answer_only_for_a_completed_run(tmp_path: Path) -> None:
    """What `legion resume` records from a transcript: a last assistant turn that ended the run with text."""
    from legion.workers.outcome import final_answer

    p = tmp_path / "s.jsonl"
    t = Transcript.open(p, cwd="/w")
    t.append_message({"role": "user", "content": "go", "timestamp": 1})
    t.append_message({**_a("", "toolUse"), "content": [{"type": "toolCall", "id": "c1", "name": "bash",
                                                        "arguments": {}}], "timestamp": 2})
    assert final_answer(p) is None  # cut mid tool call
    t.append_message({"role": "toolResult", "toolCallId": "c1", "content": [], "timestamp": 3})
    assert final_answer(p) is None  # cut mid model call
    t.append_message({**_a("the answer", "stop"), "timestamp": 4})
    answer = final_answer(p)
    assert answer is not None and answer.text == "the answer"
    assert abs(answer.at_ms - int(__import__("time").time() * 1000)) < 60_000  # the entry's own time
    t.append_note("legion.worker_restart", "restarted")  # a system note after it changes nothing
    assert final_answer(p) is not None
    t.append_message({"role": "user", "content": "more", "timestamp": 5})
    assert final_answer(p) is None  # new input not yet answered
    t.append_message({**_a("", "stop"), "timestamp": 6})
    assert final_answer(p) is None  # an empty answer is a failure, not an answer
    t.close()
    assert final_answer(tmp_path / "missing.jsonl") is None


def test_result_text_says_why_a_turn_failed() -> None:
    """A model error or an unrecognised stop reason is in the result text a parent reads (issue 21, item 14)."""
    from legion.workers.outcome import failure_reason, result_text

    error = {**_a("", "error"), "errorMessage": "provider 'p': HTTP 400 bad request"}
    assert result_text([_u("go"), error]) == "(failed: provider 'p': HTTP 400 bad request)"
    assert result_text([_u("go"), _a("half", "sensitive")]) == (
        "half\n\n(failed: the model stopped with an unrecognised stop reason 'sensitive')")
    assert result_text([_u("go"), _a("done", "stop")]) == "done"
    assert failure_reason([_u("go"), _a("done", "stop")]) is None
    assert failure_reason([_u("go"), error, _u("again")]) is None  # a later input: that turn is not the last
