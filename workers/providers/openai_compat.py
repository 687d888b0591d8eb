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
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
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
from legion.workers.providers.errors import (
    Where,
    describe,
    excerpt,
    no_events,
    not_a_stream,
    unknown_model_error,
)
from legion.workers.providers.pool import ClientPool, raw_stream
from legion.workers.providers.pricing import closest, cost_usd, known_models
from legion.workers.providers.sse import data_batches, drain
from legion.workers.providers.sse import text as sse_text
from legion.workers.providers.thinking import choose
from legion.workers.transcript import text_of

_FINISH = {"stop": "stop", "length": "length", "tool_calls": "toolUse", "function_call": "toolUse"}
_REASONING_PREFIXES = ("o1", "o3", "o4", "gpt-5")
_NO_KEY = "no-key"
_PLAIN = frozenset({"role", "content"})  # the SDK insists on a key; a provider without one sends no Authorization header


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
class _State:
    """What one streamed response has said so far."""

    model_id: str
    base_url: str
    finish: str | None = None
    done: bool = False  # [DONE] seen
    over: bool = False  # stop reading (done, or an error)
    error: str | None = None
    chunks: int = 0
    refusal: list[str] = field(default_factory=list)
    tool_ids: dict[int, str] = field(default_factory=dict)


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
        try:
            sdk = await self._pool.asdk(key or _NO_KEY, base_url)  # imports the SDK off the loop the first time
            extra = {} if key else {"Authorization": _omit()}
            resp = await raw_stream(sdk, url, body, extra)
            try:
                problem = await not_a_stream(resp, self.name, url)
                if problem:
                    yield ErrorEvent(problem)
                    return
                state = _State(request.model.model_id, base_url)
                head = bytearray()
                batches = data_batches(resp, head)
                async for batch in batches:
                    for data in batch:
                        out = self._data(data, state)
                        if isinstance(out, list):
                            for event in out:
                                yield event
                        elif out is not None:
                            yield out
                    if state.over:
                        break
                if state.done:
                    await drain(batches)
                if not state.chunks:
                    state.error = state.error or no_events(head, self.name, url)
                yield self._end(state)
            finally:
                await resp.aclose()
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:
            where = self._where(url)
            if unknown_model_error(exc) and not self.settings.models and not known_models(self.name):
                served = await self._served_models(key or _NO_KEY, base_url)
                where = replace(where, closest=lambda m: closest(m, served))
            yield ErrorEvent(describe(exc, where, request.model.model_id))

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

    def _usage(self, usage: dict[str, Any], model_id: str, base_url: str) -> UsageEvent:
        tin, tout = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        fresh = max(0, tin - cached)
        cost = cost_usd(self.name, model_id, self.settings.model(model_id).get("cost"), input=fresh, output=tout,
                        cache_read=cached, base_url=base_url)
        return UsageEvent(input=fresh, output=tout, cache_read=cached, cost_usd=cost)

    def _data(self, data: bytes, st: _State) -> ProviderEvent | list[ProviderEvent] | None:
        """The event(s) of one ``data:`` payload; the common one — a lone text delta — is one lookup chain."""
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            if sse_text(data) == "[DONE]":
                st.done = st.over = True
            else:
                st.over, st.error = True, f"malformed stream chunk {st.chunks + 1}: {excerpt(sse_text(data))}"
            return None
        st.chunks += 1
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
            events.append(self._usage(usage, st.model_id, st.base_url))
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

    def _end(self, st: _State) -> ProviderEvent:
        """The last event: how the stream ended."""
        p = f"provider {self.name!r}"
        if st.error:
            return ErrorEvent(st.error if st.error.startswith(p) else f"{p}: {st.error}")
        if not st.done and st.finish is None:
            return ErrorEvent(f"{p}: stream ended before completion (connection closed after {st.chunks} chunks)")
        if st.refusal:
            return ErrorEvent(f"{p}: the model refused: {excerpt(''.join(st.refusal))} — rephrase the request or "
                              "use another model")
        if st.finish == "content_filter":
            return ErrorEvent(f"{p}: response stopped by the content filter — rephrase the request or use "
                              "another model")
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


def _omit() -> Any:
    import openai

    return openai.Omit()

