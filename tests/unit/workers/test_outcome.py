"""derive_outcome: only the last turn's stopReason and output decide (SEED-SPEC §2.1)."""

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
