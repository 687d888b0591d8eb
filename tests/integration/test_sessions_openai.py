"""The openai-compatible provider against a local SSE server: streaming, tool-call deltas, usage, errors."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai  # noqa: F401  # imported here, not inside a test's first session deadline: 12+ s when loaded
import pytest

from legion.workers.context import SessionContext
from legion.workers.providers.base import ProviderError
from legion.workers.providers.registry import ProviderRegistry
from legion.workers.session import Session, SessionConfig
from legion.workers.transcript import text_of

sys.path.insert(0, str(Path(__file__).parent))
from openai_stub import OpenAIStub, Reply

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def stub() -> AsyncIterator[OpenAIStub]:
    server = await OpenAIStub().start()
    yield server
    await server.close()


def session(tmp_path: Path, stub: OpenAIStub, *, env: dict[str, str] | None = None, model: str = "local/m1",
            cfg: dict[str, Any] | None = None, name: str = "s") -> Session:
    config = cfg or {"baseUrl": stub.base_url, "apiKey": "LOCAL_KEY", "timeoutMs": 2000,
                     "models": [{"id": "m1", "cost": {"input": 1.0, "output": 2.0}}]}
    reg = ProviderRegistry({"local": config})
    return Session(context=SessionContext(node_id=name, cwd=str(tmp_path),
                                          env={"LOCAL_KEY": "sk-test"} if env is None else env),
                   model=model, transcript_path=tmp_path / f"{name}.jsonl", registry=reg,
                   system_prompt="You are a test.", config=SessionConfig(empty_backoff_s=0.01))


async def test_streams_text_with_usage_and_auth(tmp_path: Path, stub: OpenAIStub) -> None:
    stub.replies.append(Reply(text_chunks=["Hel", "lo ", "world"], usage=(1000, 500)))
    deltas: list[str] = []
    s = session(tmp_path, stub)
    s.on_event = lambda t, b: deltas.append(b["delta"]) if t == "text_delta" else None
    await s.prompt("hi")
    r = await s.wait_settled(10)
    assert r.outcome == "success" and deltas == ["Hel", "lo ", "world"]
    last = s.transcript.messages()[-1]
    assert text_of(last) == "Hello world" and last["api"] == "openai-completions" and last["provider"] == "local"
    assert last["usage"]["input"] == 1000 and last["usage"]["output"] == 500
    assert last["usage"]["cost"]["total"] == pytest.approx((1000 * 1.0 + 500 * 2.0) / 1e6)
    req = stub.requests[0]
    assert req.path == "/v1/chat/completions" and req.headers["authorization"] == "Bearer sk-test"
    assert req.body["stream"] is True and req.body["stream_options"] == {"include_usage": True}
    assert req.body["messages"][0] == {"role": "system", "content": "You are a test."}
    assert req.body["messages"][1] == {"role": "user", "content": "hi"}
    assert {t["function"]["name"] for t in req.body["tools"]} >= {"read", "bash", "edit", "write"}
    await s.dispose()


async def test_tool_call_deltas_round_trip(tmp_path: Path, stub: OpenAIStub) -> None:
    (tmp_path / "f.txt").write_text("content of f\n")
    stub.replies.append(Reply(text_chunks=["reading"], tool_calls=[("call_a", "read", ['{"pa', 'th": "f.t', 'xt"}'])]))
    stub.replies.append(Reply(text_chunks=["it says content"]))
    s = session(tmp_path, stub)
    await s.prompt("what is in f.txt?")
    r = await s.wait_settled(10)
    assert r.outcome == "success"
    msgs = s.transcript.messages()
    assert msgs[1]["stopReason"] == "toolUse"
    assert msgs[1]["content"][1] == {"type": "toolCall", "id": "call_a", "name": "read",
                                     "arguments": {"path": "f.txt"}}
    assert msgs[2]["role"] == "toolResult" and "content of f" in text_of(msgs[2])
    second = stub.requests[1].body["messages"]
    assert second[2]["tool_calls"][0]["function"] == {"name": "read", "arguments": json.dumps({"path": "f.txt"})}
    assert second[3]["role"] == "tool" and second[3]["tool_call_id"] == "call_a"
    await s.dispose()


@pytest.mark.parametrize("status", [500, 429])
async def test_http_500_is_a_clear_recorded_error(tmp_path: Path, stub: OpenAIStub, status: int) -> None:
    """The SDK retries 429/5xx (2 retries by default); when they run out the run ends with a clear error."""
    stub.replies.extend(Reply(status=status, body='{"error": {"message": "backend exploded"}}') for _ in range(3))
    s = session(tmp_path, stub)
    await s.prompt("hi")
    r = await s.wait_settled(10)
    assert r.outcome == "failed" and len(stub.requests) == 3
    assert f"HTTP {status}" in (r.error or "") and "backend exploded" in (r.error or "") and "'local'" in (r.error or "")
    await s.prompt("again")  # still usable
    assert (await s.wait_settled(10)).outcome == "success"
    await s.dispose()


async def test_disconnect_mid_stream(tmp_path: Path, stub: OpenAIStub) -> None:
    stub.replies.append(Reply(text_chunks=["one ", "two ", "three"], disconnect_after=2))
    s = session(tmp_path, stub)
    await s.prompt("hi")
    r = await s.wait_settled(10)
    assert r.outcome == "failed"
    err = r.error or ""
    assert "'local'" in err and ("stream ended before completion" in err or "connection" in err)
    last = s.transcript.messages()[-1]
    assert last["stopReason"] == "error" and text_of(last) == "one two "
    await s.dispose()


async def test_slow_stream_times_out_per_chunk(tmp_path: Path, stub: OpenAIStub) -> None:
    stub.replies.append(Reply(text_chunks=["a", "b"], chunk_delay=3.0))
    s = session(tmp_path, stub, cfg={"baseUrl": stub.base_url, "timeoutMs": 300})
    await s.prompt("hi")
    r = await s.wait_settled(10)
    assert r.outcome == "failed" and "timed out" in (r.error or "")
    await s.dispose()


async def test_slow_stream_can_be_aborted(tmp_path: Path, stub: OpenAIStub) -> None:
    stub.replies.append(Reply(text_chunks=["a", "b", "c"], chunk_delay=5.0))
    events: list[str] = []
    s = session(tmp_path, stub)
    s.on_event = lambda t, b: events.append(t)
    await s.prompt("hi")
    deadline = time.monotonic() + 10
    while "text_delta" not in events:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    assert await s.abort() == "interrupted"
    last = s.transcript.messages()[-1]
    assert last["stopReason"] == "aborted" and text_of(last) == "a"
    stub.replies.append(Reply(text_chunks=["fine"]))  # the pooled client recovers from the cut stream
    await s.prompt("again")
    assert (await s.wait_settled(10)).outcome == "success" and text_of(s.transcript.messages()[-1]) == "fine"
    await s.dispose()


async def test_missing_api_key_names_the_variable(tmp_path: Path, stub: OpenAIStub) -> None:
    s = session(tmp_path, stub, env={})
    await s.prompt("hi")
    r = await s.wait_settled(10)
    assert r.outcome == "failed" and "LOCAL_KEY is not set" in (r.error or "")
    assert stub.requests == []
    await s.dispose()


async def test_empty_generation_retry_over_http(tmp_path: Path, stub: OpenAIStub) -> None:
    stub.replies.extend([Reply(text_chunks=[]), Reply(text_chunks=["finally"])])
    s = session(tmp_path, stub)
    await s.prompt("hi")
    r = await s.wait_settled(10)
    assert r.outcome == "success" and len(stub.requests) == 2
    await s.dispose()


async def test_connection_refused(tmp_path: Path, stub: OpenAIStub) -> None:
    port = stub.port
    await stub.close()
    s = session(tmp_path, stub, cfg={"baseUrl": f"http://127.0.0.1:{port}/v1"})
    await s.prompt("hi")
    r = await s.wait_settled(10)
    assert r.outcome == "failed" and "failed" in (r.error or "") and str(port) in (r.error or "")
    await s.dispose()


def test_config_errors_are_clear() -> None:
    with pytest.raises(ProviderError, match="baseUrl must be an http"):
        ProviderRegistry({"x": {"baseUrl": "ftp://nope"}})
    with pytest.raises(ProviderError, match="apiKey must name an environment variable"):
        ProviderRegistry({"x": {"baseUrl": "http://h", "apiKey": "sk-live-1234"}})
    with pytest.raises(ProviderError, match="not supported"):
        ProviderRegistry({"x": {"baseUrl": "http://h", "api": "google-generative-ai"}})
    reg = ProviderRegistry({"x": {"baseUrl": "http://h", "models": [{"id": "a"}]}})
    with pytest.raises(ProviderError, match="configured models: a"):
        reg.resolve("x/b")
    with pytest.raises(ProviderError, match="known providers: anthropic, openai, scripted, x"):
        reg.resolve("y/b")
    _provider, ref = reg.resolve("openai/gpt-4o:high")
    assert (ref.provider, ref.model_id, ref.thinking) == ("openai", "gpt-4o", "high")
    assert reg.resolve("x/a")[1].thinking is None


async def test_models_json_variants_and_max_tokens(tmp_path: Path, stub: OpenAIStub) -> None:
    cfg = {"baseUrl": stub.base_url, "apiKeyEnv": "LOCAL_KEY", "models": ["plain", {"id": "m1", "maxTokens": 64}]}
    s = session(tmp_path, stub, cfg=cfg, model="local/m1:low")
    await s.prompt("hi")
    assert (await s.wait_settled(10)).outcome == "success"
    body = stub.requests[0].body
    assert body["max_tokens"] == 64 and body["reasoning_effort"] == "low" and body["model"] == "m1"
    assert stub.requests[0].headers["authorization"] == "Bearer sk-test"
    await s.dispose()
    with pytest.raises(ProviderError, match="list of model ids"):
        ProviderRegistry({"x": {"baseUrl": "http://h", "models": {"a": 1}}})


@pytest.mark.parametrize(("lines", "fragment"), [
    ([b'data: {"choices": [{"delta": {"content": "par"}}]}\n\n', b"data: {not json\n\n"], "malformed stream chunk 2"),
    ([b'data: {"error": {"message": "overloaded"}}\n\n'], "stream error: overloaded"),
    ([b'data: {"choices": [{"delta": {"content": "x"}, "finish_reason": "content_filter"}]}\n\n', b"data: [DONE]\n\n"],
     "content filter"),
    ([b": keep-alive comment\n\n", b"event: ping\n\n"], "stream ended before completion"),
])
async def test_malformed_streams_are_clear_errors(tmp_path: Path, stub: OpenAIStub, lines: list[bytes],
                                                  fragment: str) -> None:
    stub.replies.append(Reply(raw_lines=lines))
    s = session(tmp_path, stub)
    await s.prompt("hi")
    r = await s.wait_settled(10)
    assert r.outcome == "failed" and fragment in (r.error or "")
    await s.dispose()


async def test_one_pooled_connection_serves_successive_calls_and_sessions(tmp_path: Path, stub: OpenAIStub) -> None:
    """The provider reuses one HTTP client (and its kept-alive connection) across calls and sessions."""
    stub.keep_alive = True
    stub.replies.extend([Reply(tool_calls=[("c1", "ls", ["{}"])]), Reply(text_chunks=["one"]),
                         Reply(text_chunks=["two"])])
    config = {"baseUrl": stub.base_url, "apiKey": "LOCAL_KEY", "timeoutMs": 2000, "models": ["m1"]}
    reg = ProviderRegistry({"local": config})
    sessions = [Session(context=SessionContext(node_id=f"k{i}", cwd=str(tmp_path), env={"LOCAL_KEY": "sk"}),
                        model="local/m1", transcript_path=tmp_path / f"k{i}.jsonl", registry=reg)
                for i in range(2)]
    for s in sessions:
        await s.prompt("hi")
        assert (await s.wait_settled(10)).outcome == "success"
    assert len(stub.requests) == 3 and stub.connections == 1
    await reg.aclose()
    stub.replies.append(Reply(text_chunks=["three"]))  # a closed client is replaced on the next call
    await sessions[0].prompt("again")
    assert (await sessions[0].wait_settled(10)).outcome == "success" and stub.connections == 2
    for s in sessions:
        await s.dispose()
    await reg.aclose()


async def test_registry_cache_aclose_closes_pooled_clients(tmp_path: Path, stub: OpenAIStub) -> None:
    from legion.workers.session_spec import RegistryCache

    cache = RegistryCache()
    reg = cache.get({"local": {"baseUrl": stub.base_url, "models": ["m1"]}}, {})
    s = Session(context=SessionContext(node_id="rc", cwd=str(tmp_path)), model="local/m1",
                transcript_path=tmp_path / "rc.jsonl", registry=reg)
    await s.prompt("hi")
    assert (await s.wait_settled(10)).outcome == "success"
    provider = reg.resolve("local/m1")[0]
    client = provider.client()  # type: ignore[attr-defined]
    assert not client.is_closed
    await cache.aclose()
    assert client.is_closed
    await s.dispose()
