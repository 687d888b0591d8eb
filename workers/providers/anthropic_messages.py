"""Anthropic Messages API provider (``api: "anthropic-messages"``) through the official ``anthropic`` SDK.

The request, the stream loop, retries (the SDK's, which also cover 529 overloaded) and pricing are
``sdk_provider.py``'s; this module holds what is Anthropic's:

- text and thinking deltas stream as they arrive; a thinking block's signature is kept so the block
  can be sent back on the next call, as the API requires for thinking with tool use;
- ``tool_use`` blocks become tool calls (parallel calls: one per content block), tool results go back
  as ``tool_result`` blocks in one user message;
- extended thinking: ``budget_tokens`` from the thinking level (``thinking.py``);
- prompt caching: breakpoints on the system prompt, the tool list and the conversation prefix (the
  last block of the last message), so each call reads the previous call's prefix from the cache;
- usage counts cache reads and writes; ``stop_reason`` maps to the transcript's ``stopReason``, and
  ``refusal`` / ``model_context_window_exceeded`` end the run with a recorded reason and a fix.

The built-in ``anthropic`` provider honours ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` from the
session's environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final

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
)
from legion.workers.providers.config import parse_entry
from legion.workers.providers.errors import excerpt
from legion.workers.providers.sdk_provider import Parsed, SdkProvider, StreamState
from legion.workers.providers.sse import text as sse_text
from legion.workers.providers.thinking import choose
from legion.workers.transcript import text_of

DEFAULT_MAX_TOKENS: Final = 16384  # pi's default maxTokens
_STOP: Final = {"end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop", "max_tokens": "length",
                "tool_use": "toolUse"}
_CACHE: Final = {"type": "ephemeral"}


def _push(out: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]]) -> None:
    """Consecutive messages of one role become one (the API wants user/assistant alternating)."""
    if not blocks:
        return
    if out and out[-1]["role"] == role:
        out[-1]["content"].extend(blocks)
    else:
        out.append({"role": role, "content": blocks})


def _assistant_blocks(m: dict[str, Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for b in m.get("content") or []:
        if not isinstance(b, dict):
            continue
        kind = b.get("type")
        if kind == "thinking" and b.get("thinkingSignature") and b.get("thinking"):
            blocks.append({"type": "thinking", "thinking": b["thinking"], "signature": b["thinkingSignature"]})
        elif kind == "text" and b.get("text"):
            blocks.append({"type": "text", "text": b["text"]})
        elif kind == "toolCall":
            blocks.append({"type": "tool_use", "id": b.get("id"), "name": b.get("name"),
                           "input": b.get("arguments") or {}})
    return blocks


def to_anthropic_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Convert pi AgentMessages to Messages API messages (thinking without a signature is dropped)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "user":
            text = text_of(m)
            _push(out, "user", [{"type": "text", "text": text}] if text else [])
        elif role == "assistant":
            blocks = _assistant_blocks(m)
            if m.get("stopReason") in ("error", "aborted") and not any(b["type"] == "tool_use" for b in blocks):
                blocks = [b for b in blocks if b["type"] == "text"]  # a failed call: keep only what was said
            _push(out, "assistant", blocks)
        elif role == "toolResult":
            _push(out, "user", [{"type": "tool_result", "tool_use_id": m.get("toolCallId"),
                                 "content": text_of(m) or "(no output)", "is_error": bool(m.get("isError"))}])
    return out


def _mark_prefix(messages: list[dict[str, Any]]) -> None:
    """A cache breakpoint on the last cacheable block: the whole conversation so far is the prefix."""
    for block in reversed(messages[-1]["content"] if messages else []):
        if block.get("type") in ("text", "tool_result", "tool_use"):
            block["cache_control"] = _CACHE
            return


@dataclass
class _Turn(StreamState):
    """What one streamed response has said so far."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    stop_reason: str | None = None

    def take_usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        for attr, key in (("input", "input_tokens"), ("output", "output_tokens"),
                          ("cache_read", "cache_read_input_tokens"), ("cache_write", "cache_creation_input_tokens")):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                setattr(self, attr, value)


@dataclass
class AnthropicProvider(SdkProvider):
    api: str = "anthropic-messages"

    SDK: ClassVar[str] = "anthropic"
    CLIENT: ClassVar[str] = "AsyncAnthropic"
    CLIENT_OPTIONS: ClassVar[Mapping[str, Any]] = {"open_telemetry": False}
    PATH: ClassVar[str] = "/v1/messages"
    KEY_HEADERS: ClassVar[tuple[str, ...]] = ("X-Api-Key", "Authorization")
    CATALOG: ClassVar[str | None] = "anthropic"

    @classmethod
    def from_config(cls, name: str, cfg: Mapping[str, Any]) -> AnthropicProvider:
        return cls(parse_entry(name, {"api": "anthropic-messages", **cfg}))

    def _body(self, request: CompletionRequest) -> dict[str, Any]:
        model_id = request.model.model_id
        cfg = self.settings.model(model_id)
        configured = cfg.get("maxTokens")
        max_tokens = configured if isinstance(configured, int) and configured > 0 else DEFAULT_MAX_TOKENS
        reasoning = cfg.get("reasoning")
        level = choose(self.api, self.name, model_id, request.model.thinking,
                       reasoning=reasoning if isinstance(reasoning, bool) else None)
        messages = to_anthropic_messages(request.messages)
        _mark_prefix(messages)
        params: dict[str, Any] = {"model": model_id, "max_tokens": max_tokens, "messages": messages, "stream": True}
        if request.system_prompt:
            params["system"] = [{"type": "text", "text": request.system_prompt, "cache_control": _CACHE}]
        if request.tools:
            tools = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
                     for t in request.tools]
            tools[-1]["cache_control"] = _CACHE
            params["tools"] = tools
        if isinstance(level.value, int):
            params["thinking"] = {"type": "enabled", "budget_tokens": level.value}
            params["max_tokens"] = max(max_tokens, level.value + 4096)  # the budget counts toward max_tokens
        return params

    def _data(self, data: bytes, turn: _Turn) -> Parsed:
        """The events of one ``data:`` payload (a text delta — the common one — takes three lookups)."""
        try:
            event = orjson.loads(data)
        except orjson.JSONDecodeError:
            turn.over = True
            turn.error = f"provider {self.name!r}: malformed stream event {turn.count + 1}: {excerpt(sse_text(data))}"
            return []
        turn.count += 1
        if not isinstance(event, dict):
            return []
        kind = event.get("type")
        if kind == "content_block_delta":
            delta = event.get("delta")
            if isinstance(delta, dict) and delta.get("type") == "text_delta":
                text = delta.get("text")
                return TextDelta(text) if isinstance(text, str) and text else None
        elif kind == "error":
            turn.over, turn.error = True, self._stream_error(event.get("error"))
            return None
        events = self._events(kind, event, turn)
        turn.over = turn.over or turn.done
        return events

    def _state(self, model_id: str, base_url: str) -> _Turn:
        return _Turn(model_id, base_url)

    def _end(self, turn: _Turn) -> list[ProviderEvent]:
        """Usage (whatever was counted, so a failed call still costs what it cost) and how the stream ended."""
        model_id = turn.model_id
        events: list[ProviderEvent] = []
        if turn.count:
            events.append(self._usage(model_id, turn.base_url, input=turn.input, output=turn.output,
                                      cache_read=turn.cache_read, cache_write=turn.cache_write))
        error = turn.error
        if error is None and not turn.done:
            error = (f"provider {self.name!r}: stream ended before completion (connection closed after "
                     f"{turn.count} events)")
        error = error or self._stop_error(turn.stop_reason, model_id)
        events.append(ErrorEvent(error) if error else StopEvent(_STOP.get(turn.stop_reason or "end_turn", "stop")))
        return events

    @staticmethod
    def _events(kind: Any, data: dict[str, Any], turn: _Turn) -> list[ProviderEvent]:
        if kind == "content_block_delta":
            delta, index = data.get("delta") or {}, data.get("index", 0)
            dkind = delta.get("type")
            if dkind == "text_delta" and delta.get("text"):
                return [TextDelta(delta["text"])]
            if dkind == "thinking_delta" and delta.get("thinking"):
                return [ThinkingDelta(delta["thinking"])]
            if dkind == "signature_delta" and delta.get("signature"):
                return [ThinkingDelta("", signature=delta["signature"])]
            if dkind == "input_json_delta" and delta.get("partial_json"):
                return [ToolCallDelta(index, delta["partial_json"])]
        elif kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "tool_use":
                start: list[ProviderEvent] = [ToolCallStart(data.get("index", 0), str(block.get("id") or ""),
                                                            str(block.get("name") or ""))]
                if block.get("input"):  # a block that arrives whole
                    start.append(ToolCallDelta(data.get("index", 0), orjson.dumps(block["input"]).decode()))
                return start
            if block.get("type") == "text" and block.get("text"):
                return [TextDelta(block["text"])]
        elif kind == "message_start":
            turn.take_usage((data.get("message") or {}).get("usage"))
        elif kind == "message_delta":
            turn.stop_reason = (data.get("delta") or {}).get("stop_reason") or turn.stop_reason
            turn.take_usage(data.get("usage"))
        elif kind == "message_stop":
            turn.done = True
        return []

    def _stream_error(self, err: Any) -> str:
        kind = err.get("type") if isinstance(err, dict) else None
        msg = err.get("message") if isinstance(err, dict) else err
        p = f"provider {self.name!r}"
        if kind == "overloaded_error":
            return f"{p}: overloaded mid-stream ({excerpt(str(msg))}) — the turn can be retried; try again later"
        return f"{p}: stream error {kind or ''}: {excerpt(str(msg))}".replace("error :", "error:")

    def _stop_error(self, reason: str | None, model_id: str) -> str | None:
        p = f"provider {self.name!r}"
        if reason == "refusal":
            return f"{p}: the model refused to continue (stop_reason refusal) — rephrase the request or use another model"
        if reason == "model_context_window_exceeded":
            return (f"{p}: the conversation filled {model_id}'s context window — start a new session, cut large "
                    "tool outputs, or use a model with a larger context window")
        if reason is not None and reason not in _STOP:
            return (f"{p}: the model stopped with an unrecognised stop_reason {reason!r} — its output may be "
                    "incomplete; retry, or use another model")
        return None

