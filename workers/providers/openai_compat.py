"""OpenAI-compatible chat-completions provider (OpenAI, vLLM, llama.cpp, Ollama, OpenRouter …).

The request goes through the official ``openai`` SDK; the request, the stream loop, retries and pricing
are ``sdk_provider.py``'s (building the SDK's pydantic chunk objects would cost several times the HTTP
stream itself: bench/providers.py measures the layer against a raw HTTP stream). Configuration:
``config.py`` (pi ``models.json`` entries). The built-in ``openai`` provider honours ``OPENAI_BASE_URL``
and ``OPENAI_API_KEY`` from the session's environment as the SDK does.

Streaming uses ``stream_options.include_usage``; tool-call argument deltas are forwarded as they arrive.
An unknown model on a server with no configured models is answered with the models it lists.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

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
from legion.workers.providers.config import parse_entry
from legion.workers.providers.errors import Where, describe, excerpt, unknown_model_error
from legion.workers.providers.pricing import closest, known_models
from legion.workers.providers.sdk_provider import Parsed, SdkProvider, StreamState
from legion.workers.providers.sse import text as sse_text
from legion.workers.providers.thinking import choose
from legion.workers.transcript import text_of

_FINISH = {"stop": "stop", "length": "length", "tool_calls": "toolUse", "function_call": "toolUse"}
_REASONING_PREFIXES = ("o1", "o3", "o4", "gpt-5")


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
class _State(StreamState):
    """What one streamed response has said so far (``done``: [DONE] seen)."""

    finish: str | None = None
    refusal: list[str] = field(default_factory=list)
    tool_ids: dict[int, str] = field(default_factory=dict)


@dataclass
class OpenAICompatProvider(SdkProvider):
    api: str = "openai-completions"

    SDK: ClassVar[str] = "openai"
    CLIENT: ClassVar[str] = "AsyncOpenAI"
    PATH: ClassVar[str] = "/chat/completions"
    KEY_HEADERS: ClassVar[tuple[str, ...]] = ("Authorization",)

    @classmethod
    def from_config(cls, name: str, cfg: Mapping[str, Any]) -> OpenAICompatProvider:
        """Build from a models.json-style entry; raise ProviderError naming the bad key."""
        return cls(parse_entry(name, cfg))

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

    def _state(self, model_id: str, base_url: str) -> _State:
        return _State(model_id, base_url)

    async def _failure(self, exc: Exception, where: Where, key: str, base_url: str, model_id: str) -> str:
        if unknown_model_error(exc) and not self.settings.models and not known_models(self.name):
            served = await self._served_models(key, base_url)
            where = replace(where, closest=lambda m: closest(m, served))
        return describe(exc, where, model_id)

    async def _served_models(self, key: str, base_url: str) -> list[str]:
        """The model ids the server lists (``GET /models``), for an unknown-model error on a provider with no
        configured models (vLLM, Ollama, OpenRouter …); empty when the server does not say within 5 s."""
        try:
            async with asyncio.timeout(5):
                page = await (await self._pool.asdk(key, base_url)).with_options(max_retries=0).models.list()
                return [m.id for m in page.data if isinstance(getattr(m, "id", None), str)]
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception:  # the list is only a hint; the error stands without it
            return []

    def _usage_of(self, usage: dict[str, Any], st: _State) -> UsageEvent:
        tin, tout = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        return self._usage(st.model_id, st.base_url, input=max(0, tin - cached), output=tout, cache_read=cached)

    def _data(self, data: bytes, st: _State) -> Parsed:
        """The event(s) of one ``data:`` payload; the common one — a lone text delta — is one lookup chain."""
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            if sse_text(data) == "[DONE]":
                st.done = st.over = True
            else:
                st.over, st.error = True, f"malformed stream chunk {st.count + 1}: {excerpt(sse_text(data))}"
            return None
        st.count += 1
        try:
            (choice,) = chunk["choices"]
            delta = choice["delta"]
            content = delta["content"]
            if (content.__class__ is str and choice.get("finish_reason") is None and chunk.get("usage") is None
                    and len(delta) <= 2 and (len(delta) == 1 or "role" in delta) and "error" not in chunk):
                return TextDelta(content) if content else None
        except (KeyError, TypeError, ValueError, AttributeError):
            pass
        return self._chunk_events(chunk, st) if isinstance(chunk, dict) else None

    def _chunk_events(self, chunk: dict[str, Any], st: _State) -> list[ProviderEvent]:
        err = chunk.get("error")
        if isinstance(err, dict | str):
            msg = err.get("message", err) if isinstance(err, dict) else err
            st.over, st.error = True, f"stream error: {excerpt(str(msg))}"
            return []
        events: list[ProviderEvent] = []
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            events.append(self._usage_of(usage, st))
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            events += self._choice_events(choice, st.tool_ids)
            said_no = (choice.get("delta") or {}).get("refusal")
            if isinstance(said_no, str) and said_no:
                st.refusal.append(said_no)
            if choice.get("finish_reason"):
                st.finish = choice["finish_reason"]
        return events

    def _end(self, st: _State) -> list[ProviderEvent]:
        """The last event: how the stream ended."""
        return [self._last(st)]

    def _last(self, st: _State) -> ProviderEvent:
        p = f"provider {self.name!r}"
        if st.error:
            return ErrorEvent(st.error if st.error.startswith(p) else f"{p}: {st.error}")
        if not st.done and st.finish is None:
            return ErrorEvent(f"{p}: stream ended before completion (connection closed after {st.count} chunks)")
        if st.refusal:
            return ErrorEvent(f"{p}: the model refused: {excerpt(''.join(st.refusal))} — rephrase the request or "
                              "use another model")
        if st.finish == "content_filter":
            return ErrorEvent(f"{p}: response stopped by the content filter — rephrase the request or use "
                              "another model")
        if st.finish is not None and st.finish not in _FINISH:
            return ErrorEvent(f"{p}: the model stopped with an unrecognised finish_reason {st.finish!r} — its output "
                              "may be incomplete; retry, or use another model")
        return StopEvent(_FINISH.get(st.finish or "stop", "stop"))

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

