"""The openai provider (official ``openai`` SDK) through the real session engine against a local stub:
thinking, parallel tool calls, cached usage priced by genai-prices, Retry-After, refusals, HTML, pi's
models.json and bad configuration."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai  # noqa: F401  # imported here, not inside a test's first session deadline: 12+ s when loaded
import pytest
from genai_prices import Usage, calc_price

from legion.workers.context import SessionContext
from legion.workers.providers.pi_models import PiModels, load_pi_models
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


def session(tmp_path: Path, reg: ProviderRegistry, model: str, env: dict[str, str], name: str = "o") -> Session:
    return Session(context=SessionContext(node_id=name, cwd=str(tmp_path), env=env), model=model,
                   transcript_path=tmp_path / f"{name}.jsonl", registry=reg, system_prompt="sys",
                   config=SessionConfig(empty_backoff_s=0.01))


async def run(s: Session, text: str = "hi") -> Any:
    await s.prompt(text)
    return await s.wait_settled(15)


async def test_builtin_openai_honours_env_and_prices_cached_usage(tmp_path: Path, stub: OpenAIStub) -> None:
    """OPENAI_BASE_URL/OPENAI_API_KEY from the session environment; reasoning deltas become thinking;
    gpt-5 is a reasoning model so the level is sent as reasoning_effort; xhigh is downgraded to high."""
    stub.replies.append(Reply(reasoning_chunks=["hmm"], text_chunks=["4"], usage=(1200, 300), cached=1000))
    reg = ProviderRegistry(pi_models=PiModels())
    s = session(tmp_path, reg, "openai/gpt-5:xhigh", {"OPENAI_API_KEY": "sk-o", "OPENAI_BASE_URL": stub.base_url})
    r = await run(s)
    assert r.outcome == "success"
    last = s.transcript.messages()[-1]
    assert last["content"][0] == {"type": "thinking", "thinking": "hmm"} and text_of(last) == "4"
    u = last["usage"]
    assert (u["input"], u["cacheRead"], u["output"]) == (200, 1000, 300)
    expected = calc_price(Usage(input_tokens=1200, cache_read_tokens=1000, output_tokens=300), "gpt-5",
                          provider_id="openai").total_price
    assert u["cost"]["total"] == pytest.approx(float(expected)) and u["cost"]["total"] > 0
    req = stub.requests[0]
    assert req.headers["authorization"] == "Bearer sk-o" and req.body["reasoning_effort"] == "high"
    await s.dispose()
    await reg.aclose()


async def test_non_reasoning_model_gets_no_effort_and_parallel_calls(tmp_path: Path, stub: OpenAIStub) -> None:
    stub.replies.append(Reply(tool_calls=[("c1", "ls", ["{}"]), ("c2", "ls", ['{"path": ', '"."}'])]))
    stub.replies.append(Reply(text_chunks=["both listed"]))
    reg = ProviderRegistry({"local": {"baseUrl": stub.base_url, "models": [{"id": "m", "reasoning": False}]}},
                           pi_models=PiModels())
    s = session(tmp_path, reg, "local/m:high", {})
    r = await run(s)
    assert r.outcome == "success"
    msgs = s.transcript.messages()
    assert [c["id"] for c in msgs[1]["content"] if c["type"] == "toolCall"] == ["c1", "c2"]
    assert [m["role"] for m in msgs[2:4]] == ["toolResult", "toolResult"]
    assert "reasoning_effort" not in stub.requests[0].body
    assert "authorization" not in stub.requests[0].headers  # no key configured: no Authorization header
    second = stub.requests[1].body["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool", "tool"]
    # a custom provider's model genai-prices cannot price: unknown, not 0
    assert msgs[-1]["usage"]["cost"].get("unknown") is True and s.stats()["costUnknown"] is True
    await s.dispose()
    await reg.aclose()


async def test_429_retry_after_then_success(tmp_path: Path, stub: OpenAIStub) -> None:
    stub.replies.append(Reply(status=429, body='{"error": {"message": "slow down"}}', headers={"retry-after": "0.4"}))
    stub.replies.append(Reply(text_chunks=["ok now"]))
    reg = ProviderRegistry({"local": {"baseUrl": stub.base_url}}, pi_models=PiModels())
    s = session(tmp_path, reg, "local/m", {})
    started = time.monotonic()
    assert (await run(s)).outcome == "success"
    assert time.monotonic() - started >= 0.35 and len(stub.requests) == 2
    await s.dispose()
    await reg.aclose()


@pytest.mark.parametrize(("reply", "fragment"), [
    (Reply(text_chunks=[], refusal="I can't help with that."), "refused: I can't help with that."),
    (Reply(content_type="text/html", body="<!doctype html><html><body>login</body></html>"), "HTML page"),
    (Reply(content_type="", body="<!doctype html><html><body>login</body></html>"), "HTML page"),
    (Reply(raw_lines=[b"<!doctype html><html><body>login</body></html>\n"]), "HTML page"),  # labelled a stream
    (Reply(status=502, content_type="text/html", body="<html><body>Bad gateway</body></html>"), "HTML page"),
    (Reply(raw_lines=[b'{"id": "c1", "choices": [{"message": {"content": "whole"}}]}\n']), "no server-sent events"),
    (Reply(status=401, body='{"error": {"message": "Incorrect API key"}}'), "authentication failed"),
    (Reply(status=400, body='{"error": {"code": "context_length_exceeded", "message": "maximum context length '
                            'is 128000 tokens"}}'), "context window"),
])
async def test_actionable_errors(tmp_path: Path, stub: OpenAIStub, reply: Reply, fragment: str) -> None:
    stub.replies.append(reply)
    reg = ProviderRegistry({"local": {"baseUrl": stub.base_url, "apiKey": "LOCAL_KEY", "maxRetries": 0}},
                           pi_models=PiModels())
    s = session(tmp_path, reg, "local/m", {"LOCAL_KEY": "k"})
    r = await run(s)
    assert r.outcome == "failed" and fragment in (r.error or ""), r.error
    if "authentication" in fragment:
        assert "LOCAL_KEY" in (r.error or "") and "'k'" not in (r.error or "")
    await s.dispose()
    await reg.aclose()


def test_unknown_configured_model_names_the_closest() -> None:
    reg = ProviderRegistry({"x": {"baseUrl": "http://h", "models": ["qwen2.5-coder", "llama3:8b"]}},
                           pi_models=PiModels())
    with pytest.raises(Exception, match=r"closest: qwen2.5-coder"):
        reg.resolve("x/qwen2.5-cder")


def test_provider_block_with_unknown_keys_is_a_clear_error() -> None:
    with pytest.raises(Exception, match=r"providers.x \(settings\) has unknown key\(s\) baseURL; allowed: .*baseUrl"):
        ProviderRegistry({"x": {"baseURL": "http://h"}}, pi_models=PiModels())


def _write_models_json(folder: Path, data: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "models.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


async def test_pi_models_json_custom_provider_is_used_unchanged(tmp_path: Path, stub: OpenAIStub,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A pi user's models.json (found through PI_CODING_AGENT_DIR) works in legion as written for pi:
    pi's apiKey rule (a variable name, else the key itself), pi-only keys, pi's cost fields."""
    agent_dir = tmp_path / "pi-agent"
    _write_models_json(agent_dir, {"providers": {
        "ollama": {"baseUrl": stub.base_url, "api": "openai-completions", "apiKey": "ollama",
                   "compat": {"supportsUsageInStreaming": True},
                   "models": [{"id": "llama3.1:8b", "name": "Llama", "reasoning": False, "input": ["text"],
                               "contextWindow": 128000, "maxTokens": 32000,
                               "cost": {"input": 1, "output": 2, "cacheRead": 0, "cacheWrite": 0}}]},
        "vllm": {"baseUrl": stub.base_url, "apiKey": "VLLM_KEY", "models": [{"id": "q"}]}}})
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(agent_dir))
    reg = ProviderRegistry()
    assert {"ollama", "vllm"} <= set(reg.known)
    stub.replies.append(Reply(text_chunks=["from ollama"], usage=(1000, 1000)))
    s = session(tmp_path, reg, "ollama/llama3.1:8b", {}, name="p1")
    assert (await run(s)).outcome == "success"
    assert stub.requests[0].headers["authorization"] == "Bearer ollama"  # a literal key, as pi reads it
    assert stub.requests[0].body["max_tokens"] == 32000 and stub.requests[0].body["model"] == "llama3.1:8b"
    assert s.transcript.messages()[-1]["usage"]["cost"]["total"] == pytest.approx(0.003)
    s2 = session(tmp_path, reg, "vllm/q", {"VLLM_KEY": "from-env"}, name="p2")
    assert (await run(s2)).outcome == "success"
    assert stub.requests[1].headers["authorization"] == "Bearer from-env"  # a variable name
    for x in (s, s2):
        await x.dispose()
    await reg.aclose()


@pytest.mark.parametrize(("content", "fragment"), [
    ('{"providers": {"ollama": {"baseUrl": "http://h"', "is not valid JSON (line 1"),
    ('["not", "an", "object"]', "must be an object with a 'providers' object"),
])
async def test_malformed_models_json_is_reported_not_fatal(tmp_path: Path, content: str, fragment: str) -> None:
    path = _write_models_json(tmp_path / "agent", content)
    reg = ProviderRegistry(pi_models=load_pi_models(path))
    assert "openai" in reg.known  # the rest of the registry works
    with pytest.raises(Exception, match=r"pi's models\.json was not loaded") as info:
        reg.resolve("ollama/llama3")
    assert fragment in str(info.value) and str(path) in str(info.value)
    assert path.read_text() == content  # read only; nothing lost


async def test_broken_models_json_block_is_reported_by_name(tmp_path: Path, stub: OpenAIStub) -> None:
    path = _write_models_json(tmp_path / "agent", {"providers": {
        "good": {"baseUrl": stub.base_url, "models": ["m"]},
        "bad": {"baseUrl": stub.base_url, "apiKeyy": "X"},
        "shell": {"baseUrl": stub.base_url, "apiKey": "!op read secret"}}})
    reg = ProviderRegistry(pi_models=load_pi_models(path))
    reg.resolve("good/m")
    with pytest.raises(Exception, match=r"'bad' \(from pi's models.json\) is not usable: .*unknown key\(s\) apiKeyy"):
        reg.resolve("bad/m")
    with pytest.raises(Exception, match="runs a shell command"):
        reg.resolve("shell/m")
    await reg.aclose()


@pytest.mark.parametrize("status", [529, 503])
async def test_overloaded_is_retried_then_reported(tmp_path: Path, stub: OpenAIStub, status: int) -> None:
    stub.replies.extend(Reply(status=status, body='{"error": {"message": "Overloaded"}}',
                              headers={"retry-after-ms": "20"}) for _ in range(2))
    stub.replies.append(Reply(text_chunks=["third time"]))
    reg = ProviderRegistry({"local": {"baseUrl": stub.base_url, "maxRetries": 2}}, pi_models=PiModels())
    s = session(tmp_path, reg, "local/m", {})
    assert (await run(s)).outcome == "success" and len(stub.requests) == 3  # two retries, then the answer
    stub.replies.extend(Reply(status=status, body='{"error": {"message": "Overloaded"}}',
                              headers={"retry-after-ms": "20"}) for _ in range(3))
    r = await run(s, "again")
    assert r.outcome == "failed" and "overloaded" in (r.error or "") and "after 2 retries" in (r.error or "")
    await s.dispose()
    await reg.aclose()


async def test_key_variable_set_but_empty(tmp_path: Path, stub: OpenAIStub) -> None:
    reg = ProviderRegistry(pi_models=PiModels())
    s = session(tmp_path, reg, "openai/gpt-4o", {"OPENAI_API_KEY": "", "OPENAI_BASE_URL": stub.base_url})
    r = await run(s)
    assert r.outcome == "failed" and "OPENAI_API_KEY is set but empty" in (r.error or "") and stub.requests == []
    await s.dispose()


async def test_unknown_model_names_the_closest_known_through_a_session(tmp_path: Path, stub: OpenAIStub) -> None:
    """A configured provider refuses before any request; the built-in one hears the server's 404 and names
    genai-prices' nearest ids. Both are the run's recorded reason."""
    reg = ProviderRegistry({"x": {"baseUrl": stub.base_url, "models": ["qwen2.5-coder", "llama3:8b"]}},
                           pi_models=PiModels())
    s = session(tmp_path, reg, "x/qwen2.5-cder", {}, name="c")
    r = await run(s)
    assert r.outcome == "failed" and "closest: qwen2.5-coder" in (r.error or "") and stub.requests == [], r.error
    stub.replies.append(Reply(status=404, body=json.dumps({"error": {
        "message": "The model `gpt-4oo` does not exist or you do not have access to it.", "code": "model_not_found"}})))
    s2 = session(tmp_path, reg, "openai/gpt-4oo", {"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": stub.base_url}, name="b")
    r2 = await run(s2)
    assert r2.outcome == "failed" and "unknown model 'gpt-4oo'" in (r2.error or "") and "gpt-4o" in (
        (r2.error or "").split("closest known:")[-1]), r2.error
    assert s2.transcript.messages()[-1]["stopReason"] == "error"
    for x in (s, s2):
        await x.dispose()
    await reg.aclose()


async def test_missing_key_names_the_variable_for_a_pi_provider(tmp_path: Path, stub: OpenAIStub) -> None:
    path = _write_models_json(tmp_path / "agent", {"providers": {
        "vllm": {"baseUrl": stub.base_url, "apiKey": "VLLM_API_KEY", "models": [{"id": "q"}]}}})
    reg = ProviderRegistry(pi_models=load_pi_models(path))
    s = session(tmp_path, reg, "vllm/q", {})
    r = await run(s)
    assert r.outcome == "failed" and "VLLM_API_KEY is not set" in (r.error or "") and str(path) in (r.error or "")
    assert stub.requests == []
    await s.dispose()
    await reg.aclose()


async def test_unknown_model_on_a_server_names_the_models_it_serves(tmp_path: Path, stub: OpenAIStub) -> None:
    """No configured models and none known to genai-prices (a vLLM/Ollama endpoint): the server's own model
    list (GET /models) gives the closest ids."""
    stub.replies.append(Reply(status=404, body=json.dumps({"error": {"message": "model 'qwen2.5-cder' not found"}})))
    stub.replies.append(Reply(content_type="application/json", body=json.dumps({"object": "list", "data": [
        {"id": "qwen2.5-coder", "object": "model", "created": 0, "owned_by": "me"},
        {"id": "llama3:8b", "object": "model", "created": 0, "owned_by": "me"}]})))
    reg = ProviderRegistry({"local": {"baseUrl": stub.base_url, "maxRetries": 0}}, pi_models=PiModels())
    s = session(tmp_path, reg, "local/qwen2.5-cder", {})
    r = await run(s)
    assert r.outcome == "failed" and "unknown model 'qwen2.5-cder'" in (r.error or ""), r.error
    assert "closest known: qwen2.5-coder" in (r.error or "") and stub.requests[1].path == "/v1/models", r.error
    await s.dispose()
    await reg.aclose()
