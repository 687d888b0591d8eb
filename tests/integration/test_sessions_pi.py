"""The pi engine against a protocol fake of `pi --mode rpc` (a real child process over stdin/stdout)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from legion.workers.context import SessionContext
from legion.workers.outcome import derive_outcome
from legion.workers.pi_engine import PiError, PiSession
from legion.workers.session import NOTE_TYPE_RESTART
from legion.workers.transcript import read_transcript, text_of
from tests.support import poller

pytestmark = pytest.mark.timeout(60)
FAKE = [sys.executable, str(Path(__file__).parent / "fake_pi.py")]


until = poller(15.0, 0.01)


async def make(tmp_path: Path, events: list[tuple[str, dict[str, Any]]] | None = None, **kw: Any) -> PiSession:
    return await PiSession.create(context=SessionContext(node_id="p", cwd=str(tmp_path)), model="openai/gpt-4o:high",
                                  transcript_path=tmp_path / "p.jsonl", command=FAKE,
                                  on_event=(lambda t, b: events.append((t, b))) if events is not None else None, **kw)


def texts(path: Path) -> list[str]:
    return [f"{e['message']['role']}:{text_of(e['message'])}" for e in read_transcript(path).entries
            if e["type"] == "message"]


async def test_prompt_steer_follow_up_and_events(tmp_path: Path) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    s = await make(tmp_path, events)
    assert s.state == "idle" and not s.has_history
    assert await s.prompt("hello") == "accepted"
    r = await s.wait_settled(15)
    assert r.settled and r.outcome == "success" and r.stop_reason == "stop"
    assert texts(s.transcript_path) == ["user:hello", "assistant:pi says: hello"]
    header = read_transcript(s.transcript_path).header
    assert header is not None and header["version"] == 3
    assert [t for t, _ in events] == ["turn_start", "text_delta", "usage", "agent_settled"]
    assert await s.prompt("SLOW one") == "accepted"
    assert await s.steer("steer me") == "queued"
    await s.follow_up("later")
    await s.wait_settled(15)
    slow = "pi says: SLOW one"
    assert texts(s.transcript_path)[2:] == ["user:SLOW one", "assistant:" + "".join(slow[i % len(slow)] for i in range(100)),
                                            "user:steer me", "assistant:pi says: steer me",
                                            "user:later", "assistant:pi says: later"]
    assert s.stats()["turns"] == 4 and s.stats()["costUsd"] == pytest.approx(0.004)
    assert await s.dispose() == []


async def test_abort_and_tool_events(tmp_path: Path) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    s = await make(tmp_path, events)
    assert await s.abort() == "no-turn"
    await s.prompt("SLOW TOOL work")
    await until(lambda: any(t == "text_delta" for t, _ in events))
    assert await s.abort() == "interrupted"
    assert s.state == "idle" and derive_outcome(s.transcript_path) == "aborted"
    assert [(t, b["phase"], b["tool"]) for t, b in events if t == "tool_call"] == [("tool_call", "start", "bash"),
                                                                                   ("tool_call", "end", "bash")]
    await s.prompt("again")
    assert (await s.wait_settled(15)).outcome == "success"
    await s.dispose()


async def test_crash_is_reported_and_resume_adds_the_note(tmp_path: Path) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    s = await make(tmp_path, events)
    await s.prompt("first")
    await s.wait_settled(15)
    await s.prompt("CRASH now")
    r = await s.wait_settled(15)
    assert r.settled and "pi exited with code 3" in (r.error or "")
    assert events[-1][0] == "agent_settled" and events[-1][1]["error"] == "pi exited with code 3"
    with pytest.raises(PiError, match="not running"):
        await s.prompt("dead")
    await s.dispose()
    s2 = await make(tmp_path, restarted=True)
    assert s2.has_history and not s2.continue_run()
    notes = [e for e in read_transcript(s2.transcript_path).entries if e.get("customType") == NOTE_TYPE_RESTART]
    assert len(notes) == 1
    await s2.prompt("resumed")
    assert (await s2.wait_settled(15)).outcome == "success"
    assert texts(s2.transcript_path)[-1] == "assistant:pi says: resumed"
    await s2.dispose()


async def test_missing_pi_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PiError, match="cannot start pi"):
        await PiSession.create(context=SessionContext(node_id="p", cwd=str(tmp_path)), model="openai/x",
                               transcript_path=tmp_path / "p.jsonl", command=[str(tmp_path / "no-such-pi")])


async def test_pi_engine_through_the_session_service(tmp_path: Path) -> None:
    from legion.workers.session_service import SessionService

    sent: list[dict[str, Any]] = []

    async def send(type_: str, body: dict[str, Any]) -> None:
        sent.append(body)

    svc = SessionService(send=send, request=None)
    svc.start()
    spec = {"nodeId": "pi1", "cwd": str(tmp_path), "model": "openai/gpt-4o", "engine": "pi", "piCommand": FAKE,
            "transcript": str(tmp_path / "pi1.jsonl"), "prompt": "via service"}
    r = await svc.handle_request({"op": "session.launch", "spec": spec})
    assert r == {"ok": True, "status": "started", "resumed": False}
    r = await svc.handle_request({"op": "session.wait", "nodeId": "pi1", "timeoutMs": 15000})
    assert r["outcome"] == "success"
    session = svc.host.get("pi1")
    assert isinstance(session, PiSession)
    pid = session._proc.pid if session._proc else 0
    r = await svc.handle_request({"op": "session.retire", "nodeId": "pi1"})
    assert r["found"] and r["survivors"] == []
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    await until(lambda: any(b["name"] == "agent_settled" for b in sent))
    r = await svc.handle_request({"op": "session.launch", "spec": {**spec, "engine": "claude"}})
    assert r["code"] == "INVALID_PARAMS" and "native or pi" in r["error"]
    await svc.close()


async def test_abort_never_claims_an_interrupt_when_pi_dies_instead(tmp_path: Path) -> None:
    """pi exits instead of answering the abort: the outcome is not ``interrupted`` (nothing was observed)."""
    events: list[tuple[str, dict[str, Any]]] = []
    s = await make(tmp_path, events)
    await s.prompt("SLOW DIE_ON_ABORT")
    await until(lambda: any(t == "text_delta" for t, _ in events))
    assert await s.abort(timeout=10) == "timeout"
    r = await s.wait_settled(15)
    assert r.settled and "pi exited with code 4" in (r.error or "")
    assert s.stats()["alive"] is False
    await s.dispose()
