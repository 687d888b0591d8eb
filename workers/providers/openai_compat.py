"""OpenAI-compatible chat-completions provider (OpenAI, vLLM, llama.cpp, Ollama, OpenRouter …).

The request goes through the official ``openai`` SDK (auth, retries of 429/5xx/connection errors with
its backoff and ``Retry-After``, typed errors); its streamed body is read line by line here and parsed
with orjson, because building the SDK's pydantic chunk objects costs several times the HTTP stream
itself (bench/providers.py measures the layer against a raw HTTP stream). Configuration: ``config.py``
(pi ``models.json`` entries). The built-in ``openai`` provider honours ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY`` from the session's environment as the SDK does.

Streaming uses ``stream_options.include_usage``; tool-call argument deltas are forwarded as they arrive.
One pooled HTTP client per provider (and event loop) serves every call of every session in the process,
so kept-alive connections are reused; ``aclose()`` closes it. Every failure becomes an ``ErrorEvent``
naming the provider, the cause and the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from legion.workers.providers.base import (
    CompletionRequest,
    ErrorEvent,
    ProviderEvent,
    StopEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallStart,
    UsageEvent,
)
from legion.workers.providers.config import ProviderSettings, parse_entry
from legion.workers.providers.errors import Where, describe, excerpt, not_a_stream
from legion.workers.providers.pool import ClientPool
from legion.workers.providers.pricing import closest, cost_usd, known_models
from legion.workers.providers.thinking import choose
from legion.workers.transcript import text_of

_FINISH = {"stop": "stop", "length": "length", "tool_calls": "toolUse", "function_call": "toolUse"}
_DRAIN_S = 1.0
_REASONING_PREFIXES = ("o1", "o3", "o4", "gpt-5")
_NO_KEY = "no-key"  # the SDK insists on a key; a provider without one sends no Authorization header


def to_openai_messages(system_prompt: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Convert pi AgentMessages to chat-completions messages."""
    out: list[dict[str, Any]] = []
    if system_prompt:
        out.append({"role": "system", "content": system_prompt})
    for m in messages:
        role = m.get("role")
        if role == "user":
            out.append({"role": "user", "content": text_of(m)})
        elif role == "assistant":
            calls = [b for b in m.get("content", []) if isinstance(b, dict) and b.get("type") == "toolCall"]
            text = text_of(m)
            if m.get("stopReason") in ("error", "aborted") and not calls and not text:
                continue  # a failed call carries nothing the model should see
            msg: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                msg["tool_calls"] = [{"id": c.get("id"), "type": "function",
                                      "function": {"name": c.get("name"),
                                                   "arguments": json.dumps(c.get("arguments") or {})}}
                                     for c in calls]
            out.append(msg)
        elif role == "toolResult":
            out.append({"role": "tool", "tool_call_id": m.get("toolCallId"), "content": text_of(m)})
    return out


@dataclass
class OpenAICompatProvider:
    settings: ProviderSettings
    api: str = "openai-completions"
    _pool: ClientPool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._pool = ClientPool(self._make_http, self._make_sdk)

    @property
    def name(self) -> str:
        return self.settings.name

    @classmethod
    def from_config(cls, name: str, cfg: Mapping[str, Any]) -> OpenAICompatProvider:
        """Build from a models.json-style entry; raise ProviderError naming the bad key."""
        return cls(parse_entry(name, cfg))

    def _make_http(self) -> Any:
        import openai

        return openai.DefaultAsyncHttpxClient(timeout=openai.Timeout(self.settings.timeout_ms / 1000, connect=10.0))

    def _make_sdk(self, http: Any, key: str, base_url: str) -> Any:
        import openai

        return openai.AsyncOpenAI(api_key=key, base_url=base_url, http_client=http,
                                  max_retries=self.settings.max_retries, default_headers=dict(self.settings.headers),
                                  timeout=openai.Timeout(self.settings.timeout_ms / 1000, connect=10.0))

    def client(self) -> Any:
        """The provider's pooled HTTP client for the running loop."""
        return self._pool.http()

    async def aclose(self) -> None:
        """Close the pooled client (when the hosting process stops)."""
        await self._pool.aclose()

    def check_model(self, model_id: str) -> None:
        self.settings.check_model(model_id)

    def _where(self, url: str) -> Where:
        s = self.settings
        return Where(s.name, url, s.key_env, s.timeout_ms, s.max_retries,
                     lambda m: closest(m, sorted(s.models) or list(known_models(s.name))))

    def _body(self, request: CompletionRequest) -> dict[str, Any]:
        model_id = request.model.model_id
        cfg = self.settings.model(model_id)
        body: dict[str, Any] = {
            "model": model_id, "stream": True, "stream_options": {"include_usage": True},
            "messages": to_openai_messages(request.system_prompt, request.messages)}
        if request.tools:
            body["tools"] = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                               "parameters": t["parameters"]}}
                             for t in request.tools]
        max_tokens = cfg.get("maxTokens")
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0:
            body["max_tokens"] = max_tokens
        reasoning = cfg.get("reasoning")
        if reasoning is None and self.settings.name == "openai":
            reasoning = model_id.startswith(_REASONING_PREFIXES)
        effort = choose(self.api, self.name, model_id, request.model.thinking,
                        reasoning=reasoning if isinstance(reasoning, bool) else None)
        if effort.value is not None:
            body["reasoning_effort"] = effort.value
        return body

    async def stream(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        try:
            self.check_model(request.model.model_id)
        except Exception as exc:
            yield ErrorEvent(str(exc))
            return
        key, key_error = self.settings.key(request.env)
        if key_error:
            yield ErrorEvent(key_error)
            return
        base_url = self.settings.url(request.env)
        url = f"{base_url}/chat/completions"
        body = self._body(request)
        extra = {} if key else {"Authorization": _omit()}
        try:
            sdk = self._pool.sdk(key or _NO_KEY, base_url)
            async with sdk.chat.completions.with_streaming_response.create(
                    **body, extra_headers=extra) as resp:
                problem = await not_a_stream(resp, self.name, url)
                if problem:
                    yield ErrorEvent(problem)
                    return
                async for event in self._parse_sse(resp.iter_lines(), request.model.model_id, base_url):
                    yield event
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:
            yield ErrorEvent(describe(exc, self._where(url), request.model.model_id))

    def _usage(self, usage: dict[str, Any], model_id: str, base_url: str) -> UsageEvent:
        tin, tout = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        fresh = max(0, tin - cached)
        cost = cost_usd(self.name, model_id, self.settings.model(model_id).get("cost"), input=fresh, output=tout,
                        cache_read=cached, base_url=base_url)
        return UsageEvent(input=fresh, output=tout, cache_read=cached, cost_usd=cost)

    async def _parse_sse(self, lines: AsyncIterator[str], model_id: str, base_url: str) -> AsyncIterator[ProviderEvent]:
        finish: str | None = None
        done = False
        chunks = 0
        refusal: list[str] = []
        tool_ids: dict[int, str] = {}
        async for line in lines:
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                await self._drain(lines)
                break
            try:
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError:
                yield ErrorEvent(f"provider {self.name!r}: malformed stream chunk {chunks + 1}: {excerpt(data)}")
                return
            chunks += 1
            if not isinstance(chunk, dict):
                continue
            if isinstance(chunk.get("error"), dict | str):
                err = chunk["error"]
                msg = err.get("message", err) if isinstance(err, dict) else err
                yield ErrorEvent(f"provider {self.name!r}: stream error: {excerpt(str(msg))}")
                return
            usage = chunk.get("usage")
            if isinstance(usage, dict):
                yield self._usage(usage, model_id, base_url)
            for choice in chunk.get("choices") or []:
                if not isinstance(choice, dict):
                    continue
                for event in self._choice_events(choice, tool_ids):
                    yield event
                said_no = (choice.get("delta") or {}).get("refusal")
                if isinstance(said_no, str) and said_no:
                    refusal.append(said_no)
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
        if not done and finish is None:
            yield ErrorEvent(f"provider {self.name!r}: stream ended before completion "
                             f"(connection closed after {chunks} chunks)")
            return
        if refusal:
            yield ErrorEvent(f"provider {self.name!r}: the model refused: {excerpt(''.join(refusal))} — rephrase "
                             "the request or use another model")
            return
        if finish == "content_filter":
            yield ErrorEvent(f"provider {self.name!r}: response stopped by the content filter — rephrase the "
                             "request or use another model")
            return
        yield StopEvent(_FINISH.get(finish or "stop", "stop"))

    @staticmethod
    async def _drain(lines: AsyncIterator[str]) -> None:
        """Read to the end of the body so the kept-alive connection goes back to the pool; a server that
        holds the stream open after ``[DONE]`` gets a short grace, then the connection is dropped."""
        async def rest() -> None:
            async for _ in lines:
                pass
        with contextlib.suppress(Exception):  # the answer is complete; a broken tail is harmless
            await asyncio.wait_for(rest(), _DRAIN_S)

    @staticmethod
    def _choice_events(choice: dict[str, Any], tool_ids: dict[int, str]) -> list[ProviderEvent]:
        delta = choice.get("delta") or {}
        events: list[ProviderEvent] = []
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            events.append(ThinkingDelta(reasoning))
        if isinstance(delta.get("content"), str) and delta["content"]:
            events.append(TextDelta(delta["content"]))
        for call in delta.get("tool_calls") or []:
            if not isinstance(call, dict):
                continue
            idx = OpenAICompatProvider._call_index(call, tool_ids)
            fn = call.get("function") or {}
            if idx not in tool_ids:
                tool_ids[idx] = call.get("id") or f"call_{idx}"
                events.append(ToolCallStart(idx, tool_ids[idx], fn.get("name") or ""))
            elif fn.get("name"):
                events.append(ToolCallStart(idx, tool_ids[idx], fn["name"]))
            args = fn.get("arguments")
            if isinstance(args, dict):  # some servers send the arguments already parsed
                args = json.dumps(args)
            if isinstance(args, str) and args:
                events.append(ToolCallDelta(idx, args))
        return events

    @staticmethod
    def _call_index(call: dict[str, Any], tool_ids: dict[int, str]) -> int:
        """The call's ``index``; without one (some servers send each call whole), a new id is a new call."""
        index = call.get("index")
        if isinstance(index, int) and not isinstance(index, bool):
            return index
        cid = call.get("id")
        known = next((i for i, v in tool_ids.items() if v == cid), None)
        if known is not None:
            return known
        if cid or not tool_ids:
            return max(tool_ids, default=-1) + 1
        return max(tool_ids)  # an id-less continuation belongs to the latest call


def _omit() -> Any:
    import openai

    return openai.Omit()

