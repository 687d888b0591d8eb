"""legion against the real `pi` CLI (skipped when `pi` is not installed): transcripts and the pi engine.

1. pi is started in RPC mode on a legion transcript, offline and without any model call; ``get_messages``
   must return exactly the LLM context legion built from the same file, and pi must not rewrite it.
2. ``PiSession`` drives a real ``pi --mode rpc`` whose model is the local OpenAI-compatible stub
   (a pi ``models.json`` custom provider): a tool-calling run, an abort mid-stream, a continued run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from legion.workers.context import SessionContext
from legion.workers.pi_engine import PiSession
from legion.workers.providers.registry import ProviderRegistry
from legion.workers.session import Session, SessionConfig
from legion.workers.transcript import context_messages, read_transcript, text_of

sys.path.insert(0, str(Path(__file__).parent))
from openai_stub import OpenAIStub, Reply

PI = shutil.which("pi")
pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(PI is None, reason="the pi CLI is not installed "
                                 "(npm install -g @mariozechner/pi-coding-agent)")]


def _session(tmp_path: Path, script: dict[str, Any], *, restarted: bool = False) -> Session:
    reg = ProviderRegistry(scripts={"t": script})
    return Session(context=SessionContext(node_id="p1", cwd=str(tmp_path)), model="scripted/t",
                   transcript_path=tmp_path / "s.jsonl", registry=reg, restarted=restarted,
                   config=SessionConfig(empty_retries=1, empty_backoff_s=0.01))


async def _write_transcript(tmp_path: Path) -> list[dict[str, Any]]:
    first = _session(tmp_path, {"turns": [
        {"tool_calls": [{"name": "bash", "arguments": {"command": "echo hi"}}]},
        {"text": "done", "thinking": "hmm"}]})
    await first.prompt("hello")
    assert (await first.wait_settled(20)).settled
    await first.dispose()
    # a restarted worker: marked note (custom_message), an empty-generation retry (custom), an error turn
    second = _session(tmp_path, {"turns": ["x", "x", {"empty": True}, {"hang": True}]}, restarted=True)
    await second.prompt("go on")
    assert (await second.wait_settled(20)).settled
    await second.prompt("and again")
    assert await second.abort(timeout=10) == "interrupted"
    expected = second.transcript.messages()
    await second.dispose()
    return expected


def _pi_rpc(session_file: Path, home: Path, commands: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    env = {**os.environ, "HOME": str(home), "PI_OFFLINE": "1"}
    proc = subprocess.run([PI or "pi", "--mode", "rpc", "--offline", "--session", str(session_file),
                           "--no-extensions", "--no-skills", "--no-prompt-templates", "--no-context-files"],
                          input="".join(json.dumps(c) + "\n" for c in commands), capture_output=True,
                          text=True, timeout=45, env=env, cwd=session_file.parent)
    replies = {}
    for line in proc.stdout.splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and obj.get("type") == "response":
            replies[str(obj.get("id"))] = obj
    assert len(replies) == len(commands), f"pi answered {sorted(replies)}; stderr: {proc.stderr[-2000:]}"
    return replies


def _pi_shape(message: dict[str, Any]) -> dict[str, Any]:
    """Our context message as pi returns it: a marked note is pi's ``custom`` message."""
    if message.get("customType"):
        return {"role": "custom", "customType": message["customType"], "content": message["content"]}
    return message


async def test_pi_loads_a_legion_transcript(tmp_path: Path) -> None:
    expected = await _write_transcript(tmp_path)
    path = tmp_path / "s.jsonl"
    data = read_transcript(path)
    assert {e["type"] for e in data.entries} >= {"message", "model_change", "thinking_level_change", "custom",
                                                "custom_message"}
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    replies = _pi_rpc(path, tmp_path / "home", [{"id": "s", "type": "get_state"},
                                                {"id": "m", "type": "get_messages"}])
    assert replies["s"]["success"] and replies["m"]["success"], replies
    state = replies["s"]["data"]
    assert state["sessionId"] == data.header["id"]  # type: ignore[index]
    assert Path(state["sessionFile"]).resolve() == path.resolve()
    got = replies["m"]["data"]["messages"]
    assert len(got) == len(expected) == state["messageCount"]
    for ours, theirs in zip(expected, got, strict=True):
        shaped = _pi_shape(ours)
        assert {k: theirs.get(k) for k in shaped} == shaped
    stops = [m.get("stopReason") for m in got if m.get("role") == "assistant"]
    assert stops[:2] == ["toolUse", "stop"] and "error" in stops and stops[-1] == "aborted"
    assert any(m.get("role") == "custom" for m in got)  # the restart note
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest  # pi did not need to migrate or repair it


PI_ARGS = ["--offline", "--no-extensions", "--no-skills", "--no-prompt-templates", "--no-context-files"]


def _pi_env(tmp_path: Path, stub: OpenAIStub) -> dict[str, str]:
    """A HOME whose pi models.json has the local stub as provider ``stub`` (model ``m1``)."""
    home = tmp_path / "home"
    (home / ".pi" / "agent").mkdir(parents=True, exist_ok=True)
    (home / ".pi" / "agent" / "models.json").write_text(json.dumps({"providers": {"stub": {
        "baseUrl": stub.base_url, "api": "openai-completions", "apiKey": "STUB_KEY",
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
        "models": [{"id": "m1"}]}}}))
    return {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "STUB_KEY": "sk-stub",
            "PI_OFFLINE": "1"}


async def test_legion_and_pi_continue_each_others_transcript(tmp_path: Path) -> None:
    """native → pi → native on one file: each continues the other's conversation with full history."""
    await _write_transcript(tmp_path)  # native: tool call, restart note, retry record, error, abort
    path = tmp_path / "s.jsonl"
    before = path.read_bytes()
    stub = await OpenAIStub().start()
    try:
        stub.replies.append(Reply(text_chunks=["pi ", "was here"]))
        pi = await PiSession.create(context=SessionContext(node_id="p1", cwd=str(tmp_path),
                                                           env=_pi_env(tmp_path, stub)),
                                    model="stub/m1", transcript_path=path, extra_args=PI_ARGS)
        try:
            assert await pi.prompt("pi turn") == "accepted"
            assert (await pi.wait_settled(40)).outcome == "success"
        finally:
            await pi.dispose()
        sent = [text_of(m) for m in stub.requests[0].body["messages"]]
        assert "hello" in sent and "go on" in sent and sent[-1] == "pi turn"  # pi saw legion's history
    finally:
        await stub.close()
    assert path.read_bytes().startswith(before)  # pi only appended
    native = _session(tmp_path, {"default": {"text": "native again"}})
    assert native.stats()["turns"] >= 5
    history = [text_of(m) for m in native.transcript.messages() if not m.get("customType")]
    assert history[0] == "hello" and "pi was here" in history
    await native.prompt("back to legion")
    assert (await native.wait_settled(20)).outcome == "success"
    assert text_of(native.transcript.messages()[-1]) == "native again"
    await native.dispose()


async def test_pi_engine_drives_the_real_pi(tmp_path: Path) -> None:
    stub = await OpenAIStub().start()
    try:
        env = _pi_env(tmp_path, stub)
        stub.replies.extend([Reply(tool_calls=[("c1", "bash", ['{"command": ', '"echo from-pi"}'])]),
                             Reply(text_chunks=["Hel", "lo"]),
                             Reply(text_chunks=["slow"] * 200, chunk_delay=0.05),
                             Reply(text_chunks=["after abort"])])
        events: list[str] = []
        path = tmp_path / "p.jsonl"
        s = await PiSession.create(
            context=SessionContext(node_id="p", cwd=str(tmp_path), env=env), model="stub/m1",
            transcript_path=path, on_event=lambda t, b: events.append(t), extra_args=PI_ARGS)
        try:
            assert await s.prompt("hello") == "accepted"
            result = await s.wait_settled(40)
            assert result.settled and result.outcome == "success", result
            assert {"turn_start", "tool_call", "text_delta", "usage",
                    "agent_settled"} <= set(events)
            msgs = context_messages(read_transcript(path).leaf_path())
            assert [m["role"] for m in msgs] == ["user", "assistant", "toolResult", "assistant"]
            assert text_of(msgs[2]) == "from-pi\n" and text_of(msgs[3]) == "Hello"
            assert s.stats()["toolCalls"] == 1 and s.stats()["turns"] == 2

            assert await s.prompt("go slow") == "accepted"
            deadline = asyncio.get_running_loop().time() + 30
            while events.count("text_delta") < 4:  # the slow stream is flowing
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.02)
            assert await s.abort(timeout=10) == "interrupted"
            assert (await s.wait_settled(10)).outcome == "aborted"
            assert await s.prompt("continue") == "accepted"
            result = await s.wait_settled(40)
            assert result.outcome == "success"
            last = context_messages(read_transcript(path).leaf_path())[-1]
            assert text_of(last) == "after abort"
        finally:
            await s.dispose()
    finally:
        await stub.close()


async def test_pi_and_legion_agree_on_a_damaged_transcript(tmp_path: Path) -> None:
    """One corrupt line (the first user message): legion keeps every valid entry on resume, reports the
    damage, and leaves a file from which pi builds exactly the same context."""
    first = _session(tmp_path, {"turns": ["one", "two", "three"]})
    for n in range(3):
        await first.prompt(f"q{n}")
        assert (await first.wait_settled(20)).settled
    await first.dispose()
    path = tmp_path / "s.jsonl"
    lines = path.read_bytes().split(b"\n")
    at = next(i for i, line in enumerate(lines) if b'"q0"' in line)
    lines[at] = lines[at].replace(b'"role"', b'"role', 1)
    path.write_bytes(b"\n".join(lines))
    events: list[tuple[str, dict[str, Any]]] = []
    resumed = Session(context=SessionContext(node_id="p1", cwd=str(tmp_path)), model="scripted/t",
                      transcript_path=path, registry=ProviderRegistry(scripts={"t": {"turns": []}}),
                      on_event=lambda t, b: events.append((t, b)))
    expected = resumed.transcript.messages()
    await resumed.dispose()
    assert [t for t, _ in events] == ["transcript_repaired"]
    assert [text_of(m) for m in expected] == ["one", "q1", "two", "q2", "three"]
    replies = _pi_rpc(path, tmp_path / "home", [{"id": "m", "type": "get_messages"}])
    got = replies["m"]["data"]["messages"]
    assert [text_of(m) for m in got] == [text_of(m) for m in expected]
    for ours, theirs in zip(expected, got, strict=True):
        shaped = _pi_shape(ours)
        assert {k: theirs.get(k) for k in shaped} == shaped


# a pi extension whose bash calls need a confirmation; the dialog of `echo quick` times out (pi answers it)
_GATE = """export default function (pi) {
  pi.on("tool_call", async (event, ctx) => {
    if (event.toolName !== "bash") return;
    const command = String(event.input.command);
    const timeout = command.includes("quick") ? 300 : undefined;
    const ok = await ctx.ui.confirm("Run bash?", command, timeout ? { timeout } : undefined);
    if (!ok) return { block: true, reason: "denied by the host" };
  });
}
"""


async def test_pi_extension_dialogs_are_reported_answered_and_expire(tmp_path: Path) -> None:
    """An extension's confirm is a `ui_request` {phase: open}; `respond_ui` answers it (`answered`); one with a
    timeout that nobody answers is `expired` (pi resolved it: a confirm reads as "no"), and is no longer answerable."""
    stub = await OpenAIStub().start()
    try:
        env = _pi_env(tmp_path, stub)
        ext = tmp_path / "gate.ts"
        ext.write_text(_GATE)
        stub.replies.extend([Reply(tool_calls=[("c1", "bash", ['{"command": "echo answered-yes"}'])]),
                             Reply(tool_calls=[("c2", "bash", ['{"command": "echo quick"}'])]),
                             Reply(text_chunks=["done"])])
        events: list[tuple[str, dict[str, Any]]] = []
        s = await PiSession.create(
            context=SessionContext(node_id="p", cwd=str(tmp_path), env=env), model="stub/m1",
            transcript_path=tmp_path / "p.jsonl", on_event=lambda t, b: events.append((t, b)),
            extra_args=[*PI_ARGS, "-e", str(ext)])  # (`-e` loads it although discovery is off)
        try:
            assert await s.prompt("run them") == "accepted"
            deadline = asyncio.get_running_loop().time() + 40
            while not s.open_ui_requests:
                assert asyncio.get_running_loop().time() < deadline, events
                await asyncio.sleep(0.02)
            [request] = s.open_ui_requests
            assert request["method"] == "confirm" and request["title"] == "Run bash?"
            assert request["message"] == "echo answered-yes"
            assert await s.respond_ui(request["requestId"], {"confirmed": True})
            assert not await s.respond_ui(request["requestId"], {"confirmed": True})  # answered already
            result = await s.wait_settled(40)
            assert result.outcome == "success", result
        finally:
            await s.dispose()
    finally:
        await stub.close()
    phases = [(b["phase"], b.get("message")) for t, b in events if t == "ui_request" and b["phase"] == "open"]
    assert phases == [("open", "echo answered-yes"), ("open", "echo quick")]
    ends = [b["phase"] for t, b in events if t == "ui_request" and b["phase"] != "open"]
    assert ends == ["answered", "expired"]
    sent = json.dumps(stub.requests[2].body["messages"])
    assert "answered-yes" in sent and "denied by the host" in sent
    assert not s.open_ui_requests
