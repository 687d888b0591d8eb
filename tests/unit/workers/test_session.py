"""Session semantics with scripted models (docs/spec-conformance.md §3.3): steer, follow-up, abort, budgets, retries, errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from legion.workers.context import Budget, SessionContext
from legion.workers.outcome import derive_outcome
from legion.workers.providers.registry import ProviderRegistry
from legion.workers.session import NOTE_TYPE_RESTART, RETRY_TYPE, Session, SessionConfig
from legion.workers.transcript import read_transcript, text_of
from tests.support import pid_alive, poller

pytestmark = pytest.mark.timeout(30)
FAST = SessionConfig(empty_backoff_s=0.01)


def make(tmp_path: Path, script: dict[str, Any] | None = None, *, model: str = "scripted/t", name: str = "s",
         events: list[tuple[str, dict[str, Any]]] | None = None, **kw: Any) -> Session:
    ctx_kw = {k: kw.pop(k) for k in list(kw) if k in ("budget", "team", "role", "env", "acceptance_role")}
    reg = ProviderRegistry(scripts={"t": script or {"default": {"text": "ok"}}})
    return Session(context=SessionContext(node_id=name, cwd=str(tmp_path), **ctx_kw), model=model,
                   transcript_path=tmp_path / f"{name}.jsonl", registry=reg, config=kw.pop("config", FAST),
                   on_event=(lambda t, b: events.append((t, b))) if events is not None else None, **kw)


def roles(s: Session) -> list[str]:
    return [f"{m['role']}:{text_of(m)}" if m["role"] != "assistant" else f"assistant:{m['stopReason']}:{text_of(m)}"
            for m in s.transcript.messages()]


until = poller(10.0, 0.01, await_result=True)


def gate_cmd(tmp_path: Path, name: str = "gate") -> str:
    return f"touch {tmp_path}/{name}.started; while [ ! -f {tmp_path}/{name} ]; do sleep 0.01; done; echo gated"


async def test_prompt_runs_to_final_answer_with_events(tmp_path: Path) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    s = make(tmp_path, {"turns": [{"text": "hello there", "chunks": 3}]}, events=events)
    assert s.state == "idle"
    assert await s.prompt("hi") == "accepted"
    assert s.state == "streaming"
    r = await s.wait_settled(10)
    assert r.settled and r.stop_reason == "stop" and r.outcome == "success"
    assert [t for t, _ in events] == ["turn_start", "text_delta", "text_delta", "text_delta", "usage",
                                      "agent_settled"]
    assert "".join(b["delta"] for t, b in events if t == "text_delta") == "hello there"
    assert events[-1][1]["outcome"] == "success"
    assert derive_outcome(s.transcript.path) == "success"
    assert s.stats()["turns"] == 1 and s.stats()["output"] > 0
    await s.dispose()


async def test_steer_while_tool_runs_is_consumed_after_the_batch(tmp_path: Path) -> None:
    script = {"turns": [{"text": "working", "tool_calls": [{"name": "bash", "arguments": {"command": gate_cmd(tmp_path)}},
                                                           {"name": "bash", "arguments": {"command": "echo second"}}]}],
              "rules": [{"match": "^change course$", "on": "user", "reply": {"text": "ack steer"}}],
              "default": {"text": "plain"}}
    s = make(tmp_path, script)
    await s.prompt("start")
    await until(lambda: (tmp_path / "gate.started").exists())
    assert await s.steer("change course") == "queued"
    (tmp_path / "gate").touch()
    r = await s.wait_settled(10)
    assert r.outcome == "success"
    assert roles(s) == ["user:start", "assistant:toolUse:working", "toolResult:gated\n", "toolResult:second\n",
                        "user:change course", "assistant:stop:ack steer"]
    await s.dispose()


async def test_withdraw_takes_back_only_queued_exact_texts(tmp_path: Path) -> None:
    script = {"turns": [{"text": "working", "tool_calls": [{"name": "bash", "arguments": {"command": gate_cmd(tmp_path)}}]}],
              "default": {"text": "plain"}}
    s = make(tmp_path, script)
    await s.prompt("start")
    await until(lambda: (tmp_path / "gate.started").exists())
    assert await s.steer("mail one") == "queued"
    assert await s.steer("keep me") == "queued"
    await s.follow_up("mail two")
    assert s.withdraw(["mail two", "mail one", "mail", "never queued"]) == ["mail one", "mail two"]
    assert s.withdraw(["mail one"]) == []  # taken once
    (tmp_path / "gate").touch()
    await s.wait_settled(10)
    assert roles(s) == ["user:start", "assistant:toolUse:working", "toolResult:gated\n", "user:keep me",
                        "assistant:stop:plain"]
    await s.dispose()


async def test_follow_up_only_after_the_final_answer(tmp_path: Path) -> None:
    script = {"turns": [{"text": "t1", "tool_calls": [{"name": "bash", "arguments": {"command": gate_cmd(tmp_path)}}]},
                        {"text": "final one"}, {"text": "after follow-up"}], "default": {"text": "third"}}
    s = make(tmp_path, script)
    await s.prompt("go")
    await until(lambda: (tmp_path / "gate.started").exists())
    await s.follow_up("next task")
    assert await s.prompt("queued prompt") == "queued"
    (tmp_path / "gate").touch()
    await s.wait_settled(10)
    assert roles(s) == ["user:go", "assistant:toolUse:t1", "toolResult:gated\n", "assistant:stop:final one",
                        "user:next task", "assistant:stop:after follow-up", "user:queued prompt",
                        "assistant:stop:third"]
    await s.dispose()


async def test_idle_follow_up_and_steer_start_a_run(tmp_path: Path) -> None:
    s = make(tmp_path)
    await s.follow_up("a")
    await s.wait_settled(5)
    assert await s.steer("b") == "accepted"
    await s.wait_settled(5)
    assert roles(s) == ["user:a", "assistant:stop:ok", "user:b", "assistant:stop:ok"]
    await s.dispose()


async def test_abort_when_idle_is_no_turn_and_clears_nothing(tmp_path: Path) -> None:
    s = make(tmp_path, {"turns": [{"text": "slow", "tool_calls": [
        {"name": "bash", "arguments": {"command": gate_cmd(tmp_path)}}]}], "default": {"text": "ok"}})
    assert await s.abort() == "no-turn"
    await s.prompt("go")
    await until(lambda: (tmp_path / "gate.started").exists())
    assert await s.steer("kept") == "queued"
    assert await s.abort(clear_queued=False) == "interrupted"
    assert s.state == "idle" and s.stats()["queuedSteers"] == 1
    assert await s.abort() == "no-turn"
    assert s.stats()["queuedSteers"] == 1  # no-turn clears nothing
    assert derive_outcome(s.transcript.path) == "aborted"
    await s.dispose()


async def test_abort_while_streaming_keeps_partial_text_and_session_continues(tmp_path: Path) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    s = make(tmp_path, {"turns": [{"text": "partial answer", "chunks": 2, "chunk_delay_ms": 60000}],
                        "default": {"text": "second try"}}, events=events)
    await s.prompt("go")
    await until(lambda: any(t == "text_delta" for t, _ in events))
    await s.steer("dropped")
    assert await s.abort() == "interrupted"
    assert s.stats()["queuedSteers"] == 0
    last = s.transcript.messages()[-1]
    assert last["stopReason"] == "aborted" and text_of(last) == "partial"
    assert derive_outcome(s.transcript.path) == "aborted"
    assert await s.prompt("again") == "accepted"
    r = await s.wait_settled(5)
    assert r.outcome == "success" and roles(s)[-1] == "assistant:stop:second try"
    await s.dispose()


async def test_abort_during_tool_kills_its_process_group(tmp_path: Path) -> None:
    cmd = f"echo $$ > {tmp_path}/pid; sleep 60"
    s = make(tmp_path, {"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": cmd}},
                                                   {"name": "read", "arguments": {"path": "x"}}]}]})
    await s.prompt("go")
    await until(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text().strip() != "")
    pid = int((tmp_path / "pid").read_text())
    assert await s.abort() == "interrupted"
    await until(lambda: not pid_alive(pid))
    assert roles(s)[-3:] == ["toolResult:aborted before completion", "toolResult:aborted before completion",
                             "assistant:aborted:"]
    await s.dispose()


async def test_abort_timeout_when_the_turn_does_not_stop(tmp_path: Path) -> None:
    release = asyncio.Event()

    async def stubborn(tool: str, args: dict[str, Any], ctx: SessionContext) -> dict[str, Any]:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await release.wait()  # ignores the interrupt until released
        return {"ok": True, "text": "late"}

    s = make(tmp_path, {"turns": [{"tool_calls": [{"name": "legion_tree", "arguments": {}}]}]},
             tools=["legion_tree"], requester=stubborn)
    await s.prompt("go")
    await until(lambda: s.stats()["toolCalls"] == 1)
    await asyncio.sleep(0.05)
    t0 = time.monotonic()
    assert await s.abort(timeout=0.2) == "timeout"
    assert time.monotonic() - t0 < 2 and s.state == "streaming"
    release.set()
    r = await s.wait_settled(5)
    assert r.settled and roles(s)[-1] == "assistant:aborted:"
    assert await s.prompt("still alive") == "accepted"
    await s.wait_settled(5)
    await s.dispose()


async def test_turn_budget_stops_the_run_with_a_recorded_reason(tmp_path: Path) -> None:
    loop_turn = {"tool_calls": [{"name": "ls", "arguments": {}}]}
    s = make(tmp_path, {"default": loop_turn}, budget=Budget(turn_budget=3))
    await s.prompt("go")
    r = await s.wait_settled(10)
    assert r.stop_reason == "error" and "turnBudget exhausted: 3 of 3" in (r.error or "")
    assert r.outcome == "failed" and s.stats()["turns"] == 3
    await s.dispose()


async def test_tool_budget_refuses_and_stops(tmp_path: Path) -> None:
    s = make(tmp_path, {"turns": [{"tool_calls": [{"name": "ls", "arguments": {}}, {"name": "ls", "arguments": {}}]}]},
             budget=Budget(tool_budget=1))
    await s.prompt("go")
    r = await s.wait_settled(10)
    msgs = s.transcript.messages()
    assert msgs[2]["isError"] is False and msgs[3]["isError"] is True
    assert text_of(msgs[3]).startswith("toolBudget exhausted: 1 of 1")
    assert r.stop_reason == "error" and "toolBudget" in (r.error or "")
    await s.dispose()


async def test_read_only_session_cannot_write(tmp_path: Path) -> None:
    s = make(tmp_path, {"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "touch made"}},
                                                  {"name": "write", "arguments": {"path": "w", "content": "x"}}]},
                                  {"text": "done"}]}, acceptance_role="read-only")
    await s.prompt("go")
    await s.wait_settled(10)
    assert not (tmp_path / "made").exists() and not (tmp_path / "w").exists()
    assert "read-only" in roles(s)[2] and "read-only" in roles(s)[3]
    await s.dispose()


async def test_empty_generation_is_retried_and_recorded(tmp_path: Path) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    s = make(tmp_path, {"turns": [{"empty_attempts": 2, "text": "finally"}]}, events=events)
    await s.prompt("go")
    r = await s.wait_settled(10)
    assert r.outcome == "success"
    retries = [e for e in read_transcript(s.transcript.path).entries if e.get("customType") == RETRY_TYPE]
    assert [e["data"]["attempt"] for e in retries] == [1, 2]
    assert [b["attempt"] for t, b in events if t == "empty_retry"] == [1, 2]
    await s.dispose()


async def test_empty_generation_exhausts_retries(tmp_path: Path) -> None:
    s = make(tmp_path, {"turns": [{"empty": True}], "default": {"text": "recovered"}})
    await s.prompt("go")
    r = await s.wait_settled(10)
    assert r.outcome == "failed" and "empty generation" in (r.error or "") and "3 times" in (r.error or "")
    await s.dispose()


async def test_malformed_tool_arguments_and_unknown_tool(tmp_path: Path) -> None:
    s = make(tmp_path, {"turns": [{"tool_calls": [{"name": "read", "arguments_raw": "{\"path\": "},
                                                  {"name": "teleport", "arguments": {}},
                                                  {"name": "read", "arguments": {"path": 5}}]},
                                  {"text": "recovered"}]})
    await s.prompt("go")
    r = await s.wait_settled(10)
    out = roles(s)
    assert "not valid JSON" in out[2] and "unknown tool 'teleport'" in out[3]
    assert "arguments.path: expected string" in out[4]
    assert r.outcome == "success"
    await s.dispose()


async def test_model_error_mid_stream_is_recorded_and_session_stays_usable(tmp_path: Path) -> None:
    s = make(tmp_path, {"turns": [{"text": "half", "error": "connection reset by peer"}, {"text": "fine"}]})
    await s.prompt("go")
    r = await s.wait_settled(10)
    assert r.outcome == "failed" and r.error == "connection reset by peer"
    last = s.transcript.messages()[-1]
    assert last["stopReason"] == "error" and last["errorMessage"] == "connection reset by peer"
    await s.prompt("retry")
    assert (await s.wait_settled(10)).outcome == "success"
    await s.dispose()


async def test_truncated_turn(tmp_path: Path) -> None:
    s = make(tmp_path, {"turns": [{"text": "cut", "stop_reason": "length"}]})
    await s.prompt("go")
    assert (await s.wait_settled(10)).outcome == "truncated"
    await s.dispose()


async def test_unknown_provider_is_a_recorded_error_and_model_can_change(tmp_path: Path) -> None:
    s = make(tmp_path, model="nosuch/model")
    await s.prompt("go")
    r = await s.wait_settled(5)
    assert r.outcome == "failed" and "unknown provider 'nosuch'" in (r.error or "")
    assert "openai, scripted" in (r.error or "")
    s.set_model("scripted/echo")
    await s.prompt("ping")
    await s.wait_settled(5)
    assert roles(s)[-1] == "assistant:stop:echo: ping"
    await s.dispose()


async def test_missing_script_file_is_clear(tmp_path: Path) -> None:
    s = make(tmp_path, model="scripted/missing.yaml")
    await s.prompt("go")
    r = await s.wait_settled(5)
    assert "cannot read script" in (r.error or "")
    await s.dispose()


async def test_resume_continues_the_transcript_with_restart_note(tmp_path: Path) -> None:
    script = {"turns": [{"text": "first"}, {"text": "second"}], "rules": [
        {"match": "worker hosting this session restarted", "on": "user", "reply": {"text": "noted restart"}}]}
    s = make(tmp_path, script, budget=Budget(turn_budget=5))
    await s.prompt("one")
    await s.wait_settled(5)
    await s.dispose()
    s2 = make(tmp_path, script, budget=Budget(turn_budget=5), restarted=True)
    assert s2.stats()["turns"] == 1
    entries = read_transcript(s2.transcript.path).entries
    assert entries[-1]["type"] == "custom_message" and entries[-1]["customType"] == NOTE_TYPE_RESTART
    await s2.prompt("two")
    await s2.wait_settled(5)
    assert roles(s2) == ["user:one", "assistant:stop:first", f"user:{entries[-1]['content']}", "user:two",
                         "assistant:stop:second"]
    await s2.dispose()


async def test_unanswered_tool_calls_get_results_on_resume(tmp_path: Path) -> None:
    s = make(tmp_path, {"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60"}}]}]})
    await s.prompt("go")
    await until(lambda: s.stats()["toolCalls"] == 1)
    # simulate a crash: the transcript stops after the toolUse message
    s.transcript.close()
    assert s._task is not None
    s._task.cancel()
    for pgid in list(s.tool_ctx.pgids):
        os.killpg(pgid, 9)
    s2 = make(tmp_path, {"default": {"text": "ok"}}, restarted=True)
    msgs = s2.transcript.messages()
    assert msgs[2]["role"] == "toolResult" and msgs[2]["isError"] and "result is unknown" in text_of(msgs[2])
    await s2.dispose()


async def test_input_handler_intercepts(tmp_path: Path) -> None:
    s = make(tmp_path, input_handler=lambda text, kind: text.startswith("/"))
    assert await s.steer("/cmd") == "intercepted"
    assert await s.prompt("/cmd") == "intercepted"
    assert s.state == "idle" and s.transcript.messages() == []
    await s.dispose()


async def test_throwing_event_callback_does_not_break_the_session(tmp_path: Path) -> None:
    def boom(t: str, b: dict[str, Any]) -> None:
        raise RuntimeError("observer bug")

    s = make(tmp_path, on_usage=lambda snap: 1 / 0)
    s.on_event = boom
    await s.prompt("go")
    assert (await s.wait_settled(5)).outcome == "success"
    await s.dispose()


async def test_per_session_context_isolation(tmp_path: Path) -> None:
    before = dict(os.environ)
    cmd = "echo $LEGION_TEAM/$LEGION_ROLE/$LEGION_NODE_ID/$SECRET"
    script = {"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": f"sleep 0.2; {cmd}"}}]},
                        {"text": "done"}]}
    a = make(tmp_path, script, name="alpha", team="red", role="worker", env={"SECRET": "a"})
    b = make(tmp_path, script, name="beta", team="blue", role="reviewer", env={"SECRET": "b"})
    await a.prompt("go")
    await b.prompt("go")
    await asyncio.gather(a.wait_settled(10), b.wait_settled(10))
    assert roles(a)[2] == "toolResult:red/worker/alpha/a\n"
    assert roles(b)[2] == "toolResult:blue/reviewer/beta/b\n"
    assert dict(os.environ) == before
    await a.dispose()
    await b.dispose()


async def test_dispose_sweeps_background_tool_groups(tmp_path: Path) -> None:
    cmd = f"sleep 60 >/dev/null 2>&1 & echo $! > {tmp_path}/bg"
    s = make(tmp_path, {"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": cmd}}]}, {"text": "ok"}]})
    await s.prompt("go")
    await s.wait_settled(10)
    bg = int((tmp_path / "bg").read_text())
    assert pid_alive(bg) and s.tool_ctx.pgids
    await s.dispose()
    await until(lambda: not pid_alive(bg))
    with pytest.raises(RuntimeError, match="disposed"):
        await s.prompt("late")


def test_transcript_lines_are_json(tmp_path: Path) -> None:
    async def run() -> Path:
        s = make(tmp_path, {"turns": [{"text": "x"}]})
        await s.prompt("go")
        await s.wait_settled(5)
        await s.dispose()
        return s.transcript.path

    path = asyncio.run(run())
    for line in path.read_text().splitlines():
        json.loads(line)


async def test_resume_mid_batch_answers_only_the_missing_calls(tmp_path: Path) -> None:
    from legion.workers.transcript import Transcript

    t = Transcript.open(tmp_path / "s.jsonl", cwd=str(tmp_path), provider="scripted", model_id="old")
    t.append_message({"role": "user", "content": "go", "timestamp": 1})
    t.append_message({"role": "assistant", "stopReason": "toolUse", "timestamp": 2, "provider": "scripted",
                      "model": "old", "api": "scripted", "usage": {"input": "junk", "output": 3, "cost": 5},
                      "content": [{"type": "toolCall", "id": "c1", "name": "ls", "arguments": {}},
                                  {"type": "toolCall", "id": "c2", "name": "ls", "arguments": {}}, "garbage"]})
    t.append_message({"role": "toolResult", "toolCallId": "c1", "toolName": "ls", "isError": False,
                      "content": [{"type": "text", "text": "a"}], "timestamp": 3})
    t.close()
    s = make(tmp_path, {"default": {"text": "continued"}}, restarted=True)
    msgs = s.transcript.messages()
    assert [m.get("toolCallId") for m in msgs if m["role"] == "toolResult"] == ["c1", "c2"]
    assert s.stats()["toolCalls"] == 2 and s.stats()["output"] == 3 and s.stats()["input"] == 0
    changes = [e for e in s.transcript.entries if e["type"] == "model_change"]
    assert [c["modelId"] for c in changes] == ["old", "t"]  # the resumed session runs on the spec's model
    assert s.continue_run()
    assert (await s.wait_settled(5)).outcome == "success"
    assert not s.continue_run()  # the last turn is complete: nothing to continue
    await s.dispose()


async def test_ledger_access_is_refused_through_tools(tmp_path: Path) -> None:
    (tmp_path / "legion.db").write_text("secret")
    s = make(tmp_path, {"turns": [{"tool_calls": [{"name": "read", "arguments": {"path": "legion.db"}},
                                                  {"name": "bash", "arguments": {"command": "cat legion.db"}},
                                                  {"name": "grep", "arguments": {"pattern": "secret"}}]},
                                  {"text": "done"}]})
    await s.prompt("go")
    await s.wait_settled(10)
    results = [m for m in s.transcript.messages() if m["role"] == "toolResult"]
    assert [m["isError"] for m in results] == [True, True, False]
    assert "secret" not in text_of(results[0]) + text_of(results[1])
    assert "legion.db:" not in text_of(results[2])  # grep skips the ledger (it may find the transcript itself)
    assert "legion ledger" in text_of(results[0]) and "legion ledger" in text_of(results[1])
    await s.dispose()


async def test_abort_right_after_prompt_records_and_settles(tmp_path: Path) -> None:
    """An abort before the run's task ever ran (no await in between) still records and settles the run."""
    events: list[tuple[str, dict[str, Any]]] = []
    s = make(tmp_path, {"turns": [{"hang": True}, "second answer"]}, events=events)
    assert await s.prompt("first") == "accepted"
    assert await s.abort(timeout=5) == "interrupted"
    result = await s.wait_settled(5)
    assert result.settled and result.outcome == "aborted"
    assert roles(s)[-2:] == ["user:first", "assistant:aborted:"]
    assert [t for t, _ in events].count("agent_settled") == 1
    assert await s.prompt("again") == "accepted"
    assert (await s.wait_settled(5)).outcome == "success"
    await s.dispose()


async def test_abort_swallowed_by_a_tool_still_stops_the_batch(tmp_path: Path) -> None:
    """A tool that swallows the interrupt finishes, but no later call of its batch runs after the abort."""
    entered = asyncio.Event()

    async def swallowing(tool: str, args: dict[str, Any], ctx: SessionContext) -> dict[str, Any]:
        entered.set()
        with contextlib.suppress(asyncio.CancelledError):  # ignores the interrupt and returns normally
            await asyncio.sleep(60)
        return {"ok": True, "text": "swallowed"}

    s = make(tmp_path, {"turns": [{"tool_calls": [
        {"name": "legion_tree", "arguments": {}},
        {"name": "bash", "arguments": {"command": f"touch {tmp_path}/ran"}}]}], "default": {"text": "later"}},
        tools=["legion_tree", "bash"], requester=swallowing)
    await s.prompt("go")
    await asyncio.wait_for(entered.wait(), 10)
    assert await s.abort(timeout=5) == "interrupted"
    assert not (tmp_path / "ran").exists()
    assert roles(s)[-3:] == ["toolResult:swallowed", "toolResult:aborted before completion", "assistant:aborted:"]
    assert s.outcome() == "aborted"
    assert await s.prompt("again") == "accepted"
    assert (await s.wait_settled(5)).outcome == "success"
    await s.dispose()


async def test_concurrent_prompts_start_one_run(tmp_path: Path) -> None:
    """Two prompts racing on an idle session: exactly one starts the run, the other waits as a follow-up."""
    s = make(tmp_path, {"rules": [{"match": "^(a|b)$", "on": "user", "reply": {"text": "answer"}}]})
    first, second = await asyncio.gather(s.prompt("a"), s.prompt("b"))
    assert sorted([first, second]) == ["accepted", "queued"]
    assert (await s.wait_settled(5)).outcome == "success"
    assert roles(s) == ["user:a", "assistant:stop:answer", "user:b", "assistant:stop:answer"]
    assert s.stats()["turns"] == 2
    await s.dispose()


def test_identity_never_leaks_from_the_hosting_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regressions 34/35: a pool worker's own role/team env never reaches a session's tools."""
    from legion.workers.session_spec import SessionSpec

    monkeypatch.setenv("LEGION_TEAM", "red")
    monkeypatch.setenv("LEGION_ROLE", "centurion")
    monkeypatch.setenv("PI_SUBAGENT_ROLE", "centurion")
    monkeypatch.setenv("LEGION_BENIGN", "kept")
    base = {"nodeId": "n", "cwd": "/tmp", "model": "scripted/echo", "transcript": "/tmp/n.jsonl"}
    plain = SessionSpec.from_dict(base).context.tool_env()
    assert plain["LEGION_NODE_ID"] == "n" and plain["LEGION_BENIGN"] == "kept"
    assert not {"LEGION_TEAM", "LEGION_ROLE", "PI_SUBAGENT_ROLE"} & set(plain)
    own = SessionSpec.from_dict({**base, "team": "blue", "role": "worker",
                                 "env": {"PI_SUBAGENT_ROLE": "worker"}}).context.tool_env()
    assert (own["LEGION_TEAM"], own["LEGION_ROLE"], own["PI_SUBAGENT_ROLE"]) == ("blue", "worker", "worker")
    stray = SessionContext(node_id="x", cwd="/tmp", env={"LEGION_TEAM": "red"}).tool_env()
    assert "LEGION_TEAM" not in stray


async def test_steer_during_a_final_answer_continues_the_run(tmp_path: Path) -> None:
    """A steer queued while the model streams its final answer is consumed at that boundary: one more turn."""
    events: list[tuple[str, dict[str, Any]]] = []
    script = {"turns": [{"text": "slow final answer", "chunks": 8, "chunk_delay_ms": 30}],
              "rules": [{"match": "^look again$", "on": "user", "reply": {"text": "looked again"}}]}
    s = make(tmp_path, script, events=events)
    await s.prompt("go")
    await until(lambda: any(t == "text_delta" for t, _ in events))
    assert await s.steer("look again") == "queued"
    result = await s.wait_settled(10)
    assert result.outcome == "success"
    assert roles(s) == ["user:go", "assistant:stop:slow final answer", "user:look again",
                        "assistant:stop:looked again"]
    assert [t for t, _ in events].count("agent_settled") == 1
    await s.dispose()


async def test_tool_output_cannot_fake_a_budget_stop(tmp_path: Path) -> None:
    """Only the guard stops a run for toolBudget; a failing tool whose output says so does not."""
    cmd = "echo 'toolBudget exhausted: 9 of 9'; exit 1"
    s = make(tmp_path, {"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": cmd}}]},
                                  {"text": "carried on"}]}, budget=Budget(tool_budget=5))
    await s.prompt("go")
    result = await s.wait_settled(10)
    assert result.outcome == "success" and roles(s)[-1] == "assistant:stop:carried on"
    await s.dispose()


async def test_steer_at_the_moment_the_run_settles_is_never_lost(tmp_path: Path) -> None:
    """A steer sent in reaction to agent_settled (the run's very end) starts a new run instead of sitting
    in the queue of a finished one."""
    results: list[str] = []
    tasks: list[asyncio.Task[None]] = []
    script = {"rules": [{"match": "^late$", "on": "user", "reply": {"text": "late answered"}}],
              "default": {"text": "first answer"}}

    async def steer_late() -> None:
        results.append(await s.steer("late"))

    def on_event(type_: str, body: dict[str, Any]) -> None:
        if type_ == "agent_settled" and not tasks:
            tasks.append(asyncio.get_running_loop().create_task(steer_late()))

    s = make(tmp_path, script)
    s.on_event = on_event
    await s.prompt("go")
    await until(lambda: bool(tasks) and tasks[0].done())
    assert results == ["accepted"]
    assert (await s.wait_settled(10)).outcome == "success"
    assert roles(s)[-2:] == ["user:late", "assistant:stop:late answered"]
    assert s.stats()["queuedSteers"] == 0
    await s.dispose()


async def test_wait_settled_reports_the_run_that_settled_even_if_another_starts_at_once(tmp_path: Path) -> None:
    """A steer scheduled during the final turn runs right after the settle; a waiter woken by that settle
    still gets that run's result, not a half-started next run's ``unknown``."""
    tasks: list[asyncio.Task[str]] = []
    script = {"rules": [{"match": "^late$", "on": "user", "reply": {"text": "late answered", "delay_ms": 300}}],
              "default": {"text": "first answer", "delay_ms": 100}}
    s = make(tmp_path, script)

    def on_event(type_: str, body: dict[str, Any]) -> None:
        if type_ == "usage" and not tasks:  # the final turn was just committed; the run settles next
            tasks.append(asyncio.get_running_loop().create_task(s.steer("late")))

    s.on_event = on_event
    await s.prompt("go")
    waiter = asyncio.create_task(s.wait_settled(10))
    await until(lambda: s.stats()["turns"] == 1)  # the waiter is blocked inside the first run
    first = await waiter
    assert first.settled and first.outcome == "success" and first.stop_reason == "stop"
    assert await tasks[0] == "accepted"
    assert (await s.wait_settled(10)).outcome == "success"
    await s.dispose()


async def test_resume_of_a_damaged_transcript_reports_it_and_keeps_every_valid_entry(tmp_path: Path) -> None:
    """One corrupt line: an event and a log line name it; the reply after it stays in the context."""
    from loguru import logger

    first = make(tmp_path, {"turns": ["one", "two", "three"]})
    for n in range(3):
        await first.prompt(f"q{n}")
        assert (await first.wait_settled(10)).settled
    await first.dispose()
    path = tmp_path / "s.jsonl"
    lines = path.read_bytes().split(b"\n")
    at = next(i for i, line in enumerate(lines) if b'"q0"' in line)
    lines[at] = lines[at].replace(b'"role"', b'"role', 1)  # one byte: the line is no longer JSON
    path.write_bytes(b"\n".join(lines))
    events: list[tuple[str, dict[str, Any]]] = []
    logged: list[str] = []
    sink = logger.add(lambda m: logged.append(str(m)), level="WARNING")
    try:
        resumed = make(tmp_path, events=events)
    finally:
        logger.remove(sink)
    try:
        repaired = [b for t, b in events if t == "transcript_repaired"]
        assert len(repaired) == 1 and repaired[0]["badLines"] == [at + 1] and repaired[0]["reattached"] == 1
        assert any(f"unreadable line(s) ({at + 1}) dropped" in line for line in logged)
        assert roles(resumed) == ["assistant:stop:one", "user:q1", "assistant:stop:two", "user:q2",
                                  "assistant:stop:three"]
    finally:
        await resumed.dispose()


async def test_a_deliberate_resume_of_a_stop_cut_run_starts_with_the_callers_message(tmp_path: Path) -> None:
    """`continue_cut=False` (a resume with new input, issue 21 item 2): the run a stop cut is not continued, no
    restart note; the caller's prompt is the first model input. A worker restart (`continue_cut` True) continues."""
    script = {"turns": [{"hang": True}], "default": {"text": "answered"}}
    s = make(tmp_path, script)
    await s.prompt("go")
    await until(lambda: s.state == "streaming")
    await s.dispose()  # a worker stop: the run is cut with cause "stop"
    resumed = make(tmp_path, script, restarted=True, continue_cut=False)
    assert resumed.continue_run() is False and resumed.state == "idle"
    assert not any(m.get("customType") == NOTE_TYPE_RESTART for m in resumed.transcript.messages())
    await resumed.prompt("PLEASE GO ON")
    await resumed.wait_settled(5)
    assert roles(resumed)[1:] == ["assistant:aborted:", "user:PLEASE GO ON", "assistant:stop:answered"]
    await resumed.dispose()


async def test_a_crash_mid_turn_still_continues_on_a_deliberate_resume(tmp_path: Path) -> None:
    """A run a crash left mid-turn (its last message a user one) continues, with the restart note, either way."""
    s = make(tmp_path)
    s.transcript.append_message({"role": "user", "content": [{"type": "text", "text": "go"}], "timestamp": 1})
    s.transcript.close()
    resumed = make(tmp_path, {"default": {"text": "continued"}}, restarted=True, continue_cut=False)
    assert any(m.get("customType") == NOTE_TYPE_RESTART for m in resumed.transcript.messages())
    assert resumed.continue_run() is True
    await resumed.wait_settled(5)
    assert roles(resumed)[-1] == "assistant:stop:continued"
    await resumed.dispose()


async def test_an_unusable_model_gives_way_to_the_next_fallback_model(tmp_path: Path) -> None:
    """An unknown provider, then a provider whose key is missing: the session runs on its third candidate, records
    each switch (a `model_change` entry and a `legion.model_fallback` entry) and emits `model_fallback`; the failed
    calls are not turns."""
    from legion.workers.session import FALLBACK_TYPE

    events: list[tuple[str, dict[str, Any]]] = []
    reg = ProviderRegistry({"keyless": {"baseUrl": "http://127.0.0.1:9/v1", "apiKey": "LEGION_UNIT_UNSET_KEY"}},
                           scripts={"t": {"default": {"text": "from the fallback"}}})
    s = Session(context=SessionContext(node_id="s", cwd=str(tmp_path), env={}), model="nowhere/m",
                transcript_path=tmp_path / "s.jsonl", registry=reg, config=FAST,
                on_event=lambda t, b: events.append((t, b)), fallback_models=["keyless/m1", "scripted/t"])
    await s.prompt("hi")
    r = await s.wait_settled(10)
    assert r.outcome == "success" and s.model.label == "scripted/t"
    assert roles(s) == ["user:hi", "assistant:stop:from the fallback"]
    switches = [b for t, b in events if t == "model_fallback"]
    assert [(b["from"], b["model"], b["remaining"]) for b in switches] == [
        ("nowhere/m", "keyless/m1", ["scripted/t"]), ("keyless/m1", "scripted/t", [])]
    assert "unknown provider 'nowhere'" in switches[0]["error"] and "LEGION_UNIT_UNSET_KEY" in switches[1]["error"]
    entries = read_transcript(s.transcript.path).entries
    assert [e["data"]["to"] for e in entries if e.get("customType") == FALLBACK_TYPE] == ["keyless/m1", "scripted/t"]
    assert [e["modelId"] for e in entries if e.get("type") == "model_change"][-2:] == ["m1", "t"]
    await s.dispose()


async def test_a_model_error_after_it_started_is_not_a_reason_to_fall_back(tmp_path: Path) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    s = make(tmp_path, {"turns": [{"error": "overloaded"}]}, events=events, fallback_models=["scripted/echo"])
    await s.prompt("hi")
    r = await s.wait_settled(10)
    assert r.outcome == "failed" and r.error == "overloaded" and s.model.label == "scripted/t"
    assert not [t for t, _ in events if t == "model_fallback"]
    await s.dispose()


async def test_without_fallback_models_an_unknown_provider_fails_the_run(tmp_path: Path) -> None:
    s = make(tmp_path, model="nowhere/m")
    await s.prompt("hi")
    r = await s.wait_settled(10)
    assert r.outcome == "failed" and "unknown provider 'nowhere'" in str(r.error)
    await s.dispose()


def test_a_spec_names_its_fallback_models_as_model_strings() -> None:
    from legion.workers.session_spec import SessionSpec, SpecError

    base = {"nodeId": "n", "cwd": "/tmp", "model": "scripted/echo", "transcript": "/tmp/n.jsonl"}
    assert SessionSpec.from_dict(base).fallback_models == ()
    spec = SessionSpec.from_dict({**base, "fallbackModels": ["a/b", "scripted/echo"]})
    assert spec.fallback_models == ("a/b", "scripted/echo")
    for bad in ("a/b", [""], [1]):
        with pytest.raises(SpecError, match="fallbackModels"):
            SessionSpec.from_dict({**base, "fallbackModels": bad})
