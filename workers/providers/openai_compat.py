"""OpenAI-compatible chat-completions provider (OpenAI, vLLM, llama.cpp, Ollama, OpenRouter …).

Configured like pi's ``models.json`` provider entries::

    {"baseUrl": "http://127.0.0.1:8000/v1", "api": "openai-completions",
     "apiKey": "VLLM_API_KEY",            # name of an environment variable holding the key (or apiKeyEnv)
     "headers": {"X-Extra": "1"},         # optional extra headers
     "timeoutMs": 120000,                 # optional read timeout per chunk
     "models": [{"id": "qwen2.5-coder", "cost": {"input": 0.5, "output": 1.5}, "maxTokens": 8192},
                "llama3:8b"]}              # ids or objects; cost in $ per million tokens

``apiKey`` names an environment variable (looked up in the *session's* environment mapping, never
``os.environ`` directly); ``apiKeyLiteral`` gives the key itself; without either no ``Authorization``
header is sent (local servers). An empty ``models`` list accepts any model id.

Streaming uses SSE with ``stream_options.include_usage``; tool-call argument deltas are forwarded as
they arrive. One pooled ``httpx.AsyncClient`` per provider (and event loop) serves every call of every
session in the process, so kept-alive connections are reused; ``aclose()`` closes it. Every failure becomes an ``ErrorEvent`` with a message naming the provider and cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from legion.workers.providers.base import (
    ErrorEvent,
    ModelRequest,
    ProviderError,
    ProviderEvent,
    StopEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallStart,
    UsageEvent,
)
from legion.workers.transcript import text_of

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_FINISH = {"stop": "stop", "length": "length", "tool_calls": "toolUse", "function_call": "toolUse"}
_DRAIN_S = 1.0
_EFFORT = {"minimal": "minimal", "low": "low", "medium": "medium", "high": "high", "xhigh": "high"}


def _excerpt(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


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
    name: str
    base_url: str
    api_key_env: str | None = None
    api_key_literal: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    timeout_ms: int = 120_000
    api: str = "openai-completions"
    # one pooled HTTP client per provider and event loop (connections are reused across calls and sessions)
    _client: httpx.AsyncClient | None = field(default=None, init=False, repr=False, compare=False)
    _client_loop: asyncio.AbstractEventLoop | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def from_config(cls, name: str, cfg: Mapping[str, Any]) -> OpenAICompatProvider:
        """Build from a models.json-style entry; raise ProviderError naming the bad key."""
        where = f"providers.{name}"
        base = cfg.get("baseUrl", "https://api.openai.com/v1" if name == "openai" else None)
        if not isinstance(base, str) or not base.startswith(("http://", "https://")):
            raise ProviderError(f"{where}.baseUrl must be an http(s) URL, got {base!r}")
        key = cfg.get("apiKeyEnv", cfg.get("apiKey", "OPENAI_API_KEY" if name == "openai" else None))
        if key is not None and (not isinstance(key, str) or not _ENV_NAME.match(key)):
            raise ProviderError(f"{where}.apiKey must name an environment variable (e.g. OPENAI_API_KEY); "
                                "put a literal key in apiKeyLiteral instead")
        raw_models = cfg.get("models", [])
        models_cfg: list[dict[str, Any]] = []
        for m in raw_models if isinstance(raw_models, list) else [None]:
            entry = {"id": m} if isinstance(m, str) else m
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                raise ProviderError(f"{where}.models must be a list of model ids or objects with an 'id' string")
            models_cfg.append(entry)
        headers = cfg.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
            raise ProviderError(f"{where}.headers must map header names to strings")
        timeout = cfg.get("timeoutMs", 120_000)
        if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0:
            raise ProviderError(f"{where}.timeoutMs must be a positive integer")
        literal = cfg.get("apiKeyLiteral")
        return cls(name=name, base_url=base.rstrip("/"), api_key_env=key,
                   api_key_literal=literal if isinstance(literal, str) else None, headers=dict(headers),
                   models={m["id"]: m for m in models_cfg}, timeout_ms=timeout)

    def client(self) -> httpx.AsyncClient:
        """The provider's pooled client for the running loop (a client is bound to the loop that made it)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client.is_closed or self._client_loop is not loop:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_ms / 1000, connect=10.0),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=32))
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the pooled client (when the hosting process stops)."""
        client, self._client, self._client_loop = self._client, None, None
        if client is not None and not client.is_closed:
            await client.aclose()

    def check_model(self, model_id: str) -> None:
        if self.models and model_id not in self.models:
            raise ProviderError(f"provider {self.name!r} has no model {model_id!r}; configured models: "
                                f"{', '.join(sorted(self.models))}")

    def _cost(self, model_id: str, tokens_in: int, tokens_out: int) -> float:
        cost = self.models.get(model_id, {}).get("cost") or {}
        try:
            return (tokens_in * float(cost.get("input", 0)) + tokens_out * float(cost.get("output", 0))) / 1e6
        except (TypeError, ValueError):
            return 0.0

    def _auth(self, env: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **self.headers}
        if self.api_key_literal:
            headers["Authorization"] = f"Bearer {self.api_key_literal}"
        elif self.api_key_env:
            key = env.get(self.api_key_env)
            if not key:
                return headers, (f"provider {self.name!r}: API key missing — environment variable "
                                 f"{self.api_key_env} is not set for this session (set it, or change "
                                 f"providers.{self.name}.apiKey)")
            headers["Authorization"] = f"Bearer {key}"
        return headers, None

    def _body(self, request: ModelRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model.model_id, "stream": True, "stream_options": {"include_usage": True},
            "messages": to_openai_messages(request.system_prompt, request.messages)}
        if request.tools:
            body["tools"] = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                               "parameters": t["parameters"]}}
                             for t in request.tools]
        max_tokens = self.models.get(request.model.model_id, {}).get("maxTokens")
        if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0:
            body["max_tokens"] = max_tokens
        effort = _EFFORT.get(request.model.thinking or "off")
        if effort:
            body["reasoning_effort"] = effort
        return body

    async def stream(self, request: ModelRequest) -> AsyncIterator[ProviderEvent]:
        try:
            self.check_model(request.model.model_id)
        except ProviderError as exc:
            yield ErrorEvent(str(exc))
            return
        headers, key_error = self._auth(request.env)
        if key_error:
            yield ErrorEvent(key_error)
            return
        url = f"{self.base_url}/chat/completions"
        try:
            async with self.client().stream("POST", url, headers=headers, json=self._body(request)) as resp:
                if resp.status_code >= 400:
                    body = (await resp.aread()).decode("utf-8", "replace")
                    yield ErrorEvent(f"provider {self.name!r}: HTTP {resp.status_code} from {url}: "
                                     f"{_excerpt(body) or resp.reason_phrase}")
                    return
                async for event in self._parse_sse(resp, request.model.model_id):
                    yield event
        except httpx.TimeoutException as exc:
            yield ErrorEvent(f"provider {self.name!r}: timed out talking to {url} "
                             f"({type(exc).__name__}; timeoutMs={self.timeout_ms})")
        except httpx.HTTPError as exc:
            yield ErrorEvent(f"provider {self.name!r}: connection to {url} failed mid-request: "
                             f"{type(exc).__name__}: {exc or 'no detail'}")

    async def _parse_sse(self, resp: httpx.Response, model_id: str) -> AsyncIterator[ProviderEvent]:
        finish: str | None = None
        done = False
        chunks = 0
        tool_ids: dict[int, str] = {}
        lines = resp.aiter_lines()
        async for line in lines:
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                await self._drain(lines)
                break
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError:
                yield ErrorEvent(f"provider {self.name!r}: malformed stream chunk {chunks + 1}: {_excerpt(data)}")
                return
            chunks += 1
            if not isinstance(chunk, dict):
                continue
            if isinstance(chunk.get("error"), dict | str):
                err = chunk["error"]
                msg = err.get("message", err) if isinstance(err, dict) else err
                yield ErrorEvent(f"provider {self.name!r}: stream error: {_excerpt(str(msg))}")
                return
            usage = chunk.get("usage")
            if isinstance(usage, dict):
                tin, tout = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
                cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                yield UsageEvent(input=tin - cached, output=tout, cache_read=cached,
                                 cost_usd=self._cost(model_id, tin, tout))
            for choice in chunk.get("choices") or []:
                for event in self._choice_events(choice, tool_ids):
                    yield event
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
        if not done and finish is None:
            yield ErrorEvent(f"provider {self.name!r}: stream ended before completion "
                             f"(connection closed after {chunks} chunks)")
            return
        if finish == "content_filter":
            yield ErrorEvent(f"provider {self.name!r}: response stopped by the content filter")
            return
        yield StopEvent(_FINISH.get(finish or "stop", "stop"))

    @staticmethod
    async def _drain(lines: AsyncIterator[str]) -> None:
        """Read to the end of the body so the kept-alive connection goes back to the pool; a server that
        holds the stream open after ``[DONE]`` gets a short grace, then the connection is dropped."""
        async def rest() -> None:
            async for _ in lines:
                pass
        with contextlib.suppress(TimeoutError, httpx.HTTPError):
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
