"""The anthropic provider through the real session engine and the real ``anthropic`` SDK against a local
Messages API stub: text, thinking, parallel tool calls, cache usage and price, retries, errors."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic  # noqa: F401  # imported here, not inside a test's first session deadline: 12+ s when loaded
import pytest
from genai_prices import Usage, calc_price

from legion.workers.context import SessionContext
from legion.workers.providers.pi_models import PiModels
from legion.workers.providers.registry import ProviderRegistry
from legion.workers.session import Session, SessionConfig
from legion.workers.transcript import text_of

sys.path.insert(0, str(Path(__file__).parent))
from anthropic_stub import AnthropicStub, Reply

pytestmark = pytest.mark.timeout(30)
MODEL = "claude-sonnet-4-5"


@pytest.fixture
async def stub() -> AsyncIterator[AnthropicStub]:
    server = await AnthropicStub().start()
    yield server
    await server.close()


def api_key(headers: dict[str, str]) -> str | None:
    """The key the SDK sent (``x-api-key``, or a bearer token in newer SDK versions)."""
    return headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ") or None


def session(tmp_path: Path, stub: AnthropicStub, *, model: str = f"anthropic/{MODEL}",
            env: dict[str, str] | None = None, cfg: dict[str, Any] | None = None, tools: list[str] | None = None,
            name: str = "a") -> Session:
    config = {"baseUrl": stub.base_url, "maxRetries": 1, "timeoutMs": 3000} if cfg is None else cfg
    reg = ProviderRegistry({"anthropic": config}, pi_models=PiModels())
    return Session(context=SessionContext(node_id=name, cwd=str(tmp_path),
                                          env={"ANTHROPIC_API_KEY": "sk-ant-test"} if env is None else env),
                   model=model, transcript_path=tmp_path / f"{name}.jsonl", registry=reg,
                   system_prompt="You are a test.", tools=tools, config=SessionConfig(empty_backoff_s=0.01))


async def run(s: Session, text: str = "hi") -> Any:
    await s.prompt(text)
    return await s.wait_settled(15)


async def test_text_thinking_cache_usage_and_price(tmp_path: Path, stub: AnthropicStub) -> None:
    usage = {"input_tokens": 1000, "output_tokens": 500, "cache_read_input_tokens": 2000,
             "cache_creation_input_tokens": 300}
    stub.replies.append(Reply(thinking=["let me ", "think"], text_chunks=["Hel", "lo"], usage=usage))
    s = session(tmp_path, stub, model=f"anthropic/{MODEL}:medium")
    deltas: list[str] = []
    s.on_event = lambda t, b: deltas.append(b["delta"]) if t == "text_delta" else None
    r = await run(s)
    assert r.outcome == "success" and deltas == ["Hel", "lo"]
    last = s.transcript.messages()[-1]
    assert last["api"] == "anthropic-messages" and last["stopReason"] == "stop"
    assert last["content"][0] == {"type": "thinking", "thinking": "let me think", "thinkingSignature": "sig-1"}
    assert text_of(last) == "Hello"
    u = last["usage"]
    assert (u["input"], u["output"], u["cacheRead"], u["cacheWrite"]) == (1000, 500, 2000, 300)
    expected = calc_price(Usage(input_tokens=3300, output_tokens=500, cache_read_tokens=2000, cache_write_tokens=300),
                          MODEL, provider_id="anthropic").total_price
    assert u["cost"]["total"] == pytest.approx(float(expected)) and "unknown" not in u["cost"]
    assert s.stats()["costUnknown"] is False and s.stats()["costUsd"] == pytest.approx(float(expected))
    req = stub.requests[0]
    assert req.path == "/v1/messages" and api_key(req.headers) == "sk-ant-test"
    body = req.body
    assert body["stream"] is True and body["model"] == MODEL
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 8192} and body["max_tokens"] > 8192
    assert body["system"] == [{"type": "text", "text": "You are a test.", "cache_control": {"type": "ephemeral"}}]
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    assert body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]
    await s.dispose()


async def test_parallel_tool_calls_round_trip(tmp_path: Path, stub: AnthropicStub) -> None:
    (tmp_path / "f.txt").write_text("content of f\n")
    stub.replies.append(Reply(thinking=["plan"], signature="sig-2", text_chunks=["Reading."], tool_calls=[
        ("toolu_1", "read", ['{"path": ', '"f.txt"}']), ("toolu_2", "ls", ["{}"])]))
    stub.replies.append(Reply(text_chunks=["done"]))
    s = session(tmp_path, stub, model=f"anthropic/{MODEL}:low")
    r = await run(s)
    assert r.outcome == "success"
    msgs = s.transcript.messages()
    calls = [b for b in msgs[1]["content"] if b["type"] == "toolCall"]
    assert msgs[1]["stopReason"] == "toolUse"
    assert calls == [{"type": "toolCall", "id": "toolu_1", "name": "read", "arguments": {"path": "f.txt"}},
                     {"type": "toolCall", "id": "toolu_2", "name": "ls", "arguments": {}}]
    second = stub.requests[1].body["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[1]["content"][0] == {"type": "thinking", "thinking": "plan", "signature": "sig-2"}
    assert [b["type"] for b in second[1]["content"]] == ["thinking", "text", "tool_use", "tool_use"]
    results = second[2]["content"]
    assert [(b["type"], b["tool_use_id"]) for b in results] == [("tool_result", "toolu_1"), ("tool_result", "toolu_2")]
    assert "content of f" in results[0]["content"] and results[-1]["cache_control"] == {"type": "ephemeral"}
    assert stub.requests[1].body["thinking"]["budget_tokens"] == 2048
    await s.dispose()


async def test_429_with_retry_after_is_retried(tmp_path: Path, stub: AnthropicStub) -> None:
    err = json.dumps({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})
    stub.replies.append(Reply(status=429, body=err, headers={"retry-after": "0.4"}))
    stub.replies.append(Reply(text_chunks=["after the wait"]))
    s = session(tmp_path, stub)
    started = time.monotonic()
    r = await run(s)
    assert r.outcome == "success" and len(stub.requests) == 2
    assert time.monotonic() - started >= 0.35  # the SDK waited as told
    assert text_of(s.transcript.messages()[-1]) == "after the wait"
    await s.dispose()


async def test_529_overloaded_is_reported_when_retries_run_out(tmp_path: Path, stub: AnthropicStub) -> None:
    err = json.dumps({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    stub.replies.extend(Reply(status=529, body=err, headers={"retry-after-ms": "10"}) for _ in range(2))
    s = session(tmp_path, stub)
    r = await run(s)
    assert r.outcome == "failed" and len(stub.requests) == 2
    assert "overloaded" in (r.error or "") and "after 1 retries" in (r.error or "") and "maxRetries" in (r.error or "")
    await s.dispose()


async def test_disconnect_mid_stream_keeps_the_partial_text(tmp_path: Path, stub: AnthropicStub) -> None:
    stub.replies.append(Reply(text_chunks=["one ", "two ", "three"], disconnect_after=4))
    s = session(tmp_path, stub)
    r = await run(s)
    assert r.outcome == "failed"
    assert "'anthropic'" in (r.error or "") and ("ended before completion" in (r.error or "")
                                                 or "connection" in (r.error or ""))
    last = s.transcript.messages()[-1]
    assert last["stopReason"] == "error" and text_of(last) == "one two "
    await s.dispose()


@pytest.mark.parametrize(("reply", "fragment"), [
    (Reply(raw_lines=[b'event: message_start\ndata: {"type": "message_start", "message": {"usage": {}}}\n\n',
                      b"event: content_block_delta\ndata: {oops\n\n"]), "malformed stream event 2"),
    (Reply(text_chunks=["par"], error_event={"type": "overloaded_error", "message": "Overloaded"}),
     "overloaded mid-stream"),
    (Reply(text_chunks=["I can't"], stop_reason="refusal"), "refused"),
    (Reply(text_chunks=["long"], stop_reason="model_context_window_exceeded"), "context window"),
    (Reply(content_type="text/html", body="<!DOCTYPE html><html><body>Sign in</body></html>"), "HTML page"),
    (Reply(status=502, content_type="text/html", body="<html><body>Bad gateway</body></html>"), "HTML page"),
    (Reply(content_type="", body="<!DOCTYPE html><html><body>Sign in</body></html>"), "HTML page"),
    (Reply(raw_lines=[b"<!DOCTYPE html><html><body>Sign in</body></html>\n"]), "HTML page"),  # labelled a stream
])
async def test_bad_streams_are_clear_recorded_errors(tmp_path: Path, stub: AnthropicStub, reply: Reply,
                                                     fragment: str) -> None:
    stub.replies.extend([reply, reply])  # a retried 502 sees the same answer
    s = session(tmp_path, stub)
    r = await run(s)
    assert r.outcome == "failed" and fragment in (r.error or ""), r.error
    assert s.transcript.messages()[-1]["stopReason"] == "error"
    stub.replies.clear()
    assert (await run(s, "again")).outcome == "success"  # the session stays usable
    await s.dispose()


@pytest.mark.parametrize(("status", "error", "fragments"), [
    (401, {"type": "authentication_error", "message": "invalid x-api-key"},
     ["authentication failed", "ANTHROPIC_API_KEY"]),
    (400, {"type": "invalid_request_error", "message": "prompt is too long: 250000 tokens > 200000 maximum"},
     ["context window", "larger context window"]),
    (404, {"type": "not_found_error", "message": "model: claude-sonet-4-5"}, ["unknown model", "claude-sonnet-4-5"]),
])
async def test_actionable_http_errors(tmp_path: Path, stub: AnthropicStub, status: int, error: dict[str, str],
                                      fragments: list[str]) -> None:
    stub.replies.append(Reply(status=status, body=json.dumps({"type": "error", "error": error})))
    s = session(tmp_path, stub, model="anthropic/claude-sonet-4-5" if status == 404 else f"anthropic/{MODEL}")
    r = await run(s)
    assert r.outcome == "failed" and all(f in (r.error or "") for f in fragments), r.error
    await s.dispose()


@pytest.mark.parametrize(("env", "fragment"), [({}, "ANTHROPIC_API_KEY is not set"),
                                               ({"ANTHROPIC_API_KEY": " "}, "ANTHROPIC_API_KEY is set but empty")])
async def test_missing_or_empty_key_names_the_variable(tmp_path: Path, stub: AnthropicStub, env: dict[str, str],
                                                       fragment: str) -> None:
    s = session(tmp_path, stub, env=env)
    r = await run(s)
    assert r.outcome == "failed" and fragment in (r.error or "") and stub.requests == []
    await s.dispose()


async def test_builtin_honours_anthropic_base_url_and_unknown_price(tmp_path: Path, stub: AnthropicStub) -> None:
    """No configuration at all: ANTHROPIC_BASE_URL/ANTHROPIC_API_KEY from the session environment; a model
    genai-prices does not know records its cost as unknown (not 0)."""
    stub.replies.append(Reply(text_chunks=["hi"], usage={"input_tokens": 7, "output_tokens": 3}))
    s = session(tmp_path, stub, model="anthropic/claude-private-preview", cfg={},
                env={"ANTHROPIC_API_KEY": "k2", "ANTHROPIC_BASE_URL": stub.base_url})
    r = await run(s)
    assert r.outcome == "success" and api_key(stub.requests[0].headers) == "k2"
    cost = s.transcript.messages()[-1]["usage"]["cost"]
    assert cost["unknown"] is True and cost["total"] == 0.0
    stats = s.stats()
    assert stats["costUnknown"] is True and stats["unknownCostTokens"] == 10
    await s.dispose()
