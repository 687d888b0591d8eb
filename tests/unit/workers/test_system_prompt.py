"""System prompt: base + role card body + run context; systemPromptMode; spec wiring."""

from __future__ import annotations

from pathlib import Path

import pytest

from legion.workers.context import Budget, SessionContext
from legion.workers.session_spec import SessionSpec, SpecError
from legion.workers.system_prompt import BASE_PROMPT, build_system_prompt


def test_append_and_replace_modes() -> None:
    ctx = SessionContext(node_id="w1", cwd="/repo", role="worker", team="red", parent_id="cent", depth=2,
                         budget=Budget(turn_budget=30, tool_timeout_ms=60000), acceptance_role="read-only")
    text = build_system_prompt("You review code.", ctx, ["read", "grep"], today="2026-01-02")
    assert text.startswith(BASE_PROMPT) and "You review code." in text
    assert "- You are node `w1`, role `worker`, team `red` at depth 2, child of `cent`." in text
    assert "- Working directory: /repo" in text and "- Date: 2026-01-02" in text and "- Tools: read, grep" in text
    assert "turnBudget 30, toolTimeoutMs 60000" in text and "read-only" in text
    replaced = build_system_prompt("Only me.", ctx, None, mode="replace", today="2026-01-02")
    assert replaced.startswith("Only me.") and BASE_PROMPT not in replaced and "- Tools:" not in replaced
    with pytest.raises(ValueError, match="append or replace"):
        build_system_prompt("", ctx, [], mode="merge")


def test_spec_builds_or_keeps_the_system_prompt(tmp_path: Path) -> None:
    base = {"nodeId": "n", "cwd": str(tmp_path), "model": "scripted/echo", "transcript": str(tmp_path / "n.jsonl")}
    built = SessionSpec.from_dict({**base, "rolePrompt": "Card body.", "tools": ["read"]})
    text = built.effective_system_prompt(["read"])
    assert "Card body." in text and "# Run context" in text and text.startswith(BASE_PROMPT)
    verbatim = SessionSpec.from_dict({**base, "systemPrompt": "exactly this", "rolePrompt": "ignored"})
    assert verbatim.effective_system_prompt(["read"]) == "exactly this"
    with pytest.raises(SpecError, match="systemPromptMode"):
        SessionSpec.from_dict({**base, "systemPromptMode": "merge"})


async def test_service_sessions_get_the_built_prompt(tmp_path: Path) -> None:
    from legion.workers.session import Session
    from legion.workers.session_service import SessionService

    svc = SessionService(send=None, request=None)
    spec = {"nodeId": "n", "cwd": str(tmp_path), "model": "scripted/echo", "transcript": str(tmp_path / "n.jsonl"),
            "rolePrompt": "Card body.", "team": "blue", "tools": ["read", "ls"]}
    await svc.handle_request({"op": "session.launch", "spec": spec})
    session = svc.host.get("n")
    assert isinstance(session, Session)
    assert "Card body." in session.system_prompt and "team `blue`" in session.system_prompt
    assert "- Tools: read, ls" in session.system_prompt
    await svc.close()
