"""Builds one pi ``AssistantMessage`` from a provider's event stream (partial state survives an abort)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from legion.workers.providers.base import (
    ErrorEvent,
    ModelRef,
    ProviderEvent,
    StopEvent,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallStart,
    UsageEvent,
)
from legion.workers.transcript import now_ms


@dataclass
class PendingCall:
    id: str
    name: str
    raw: str = ""
    arguments: dict[str, Any] | None = None
    parse_error: str | None = None

    def finish(self) -> None:
        try:
            value = json.loads(self.raw) if self.raw.strip() else {}
        except json.JSONDecodeError as exc:
            self.parse_error = f"arguments are not valid JSON ({exc.msg} at char {exc.pos})"
            return
        if not isinstance(value, dict):
            self.parse_error = f"arguments must be a JSON object, got {type(value).__name__}"
            return
        self.arguments = value


@dataclass
class AssistantBuilder:
    model: ModelRef
    api: str
    text_parts: list[str] = field(default_factory=list)  # joined on demand: += on an attribute is quadratic
    thinking_parts: list[str] = field(default_factory=list)
    thinking_signature: str = ""
    calls: dict[int, PendingCall] = field(default_factory=dict)
    usage: UsageEvent = field(default_factory=UsageEvent)
    stop_reason: str | None = None
    error: str | None = None
    unusable_model: bool = False  # the error says this model cannot be used at all (`ErrorEvent.unusable_model`)

    def feed(self, event: ProviderEvent) -> None:
        if isinstance(event, TextDelta):
            self.text_parts.append(event.text)
        elif isinstance(event, ThinkingDelta):
            self.thinking_parts.append(event.text)
            self.thinking_signature = event.signature or self.thinking_signature
        elif isinstance(event, ToolCallStart):
            known = self.calls.get(event.index)
            if known is None:
                self.calls[event.index] = PendingCall(event.id, event.name)
            elif event.name and not known.name:  # a late name for a call whose deltas already began
                known.name = event.name
        elif isinstance(event, ToolCallDelta):
            call = self.calls.setdefault(event.index, PendingCall(f"call_{event.index}", ""))
            call.raw += event.args_delta
        elif isinstance(event, UsageEvent):
            self.usage = event
        elif isinstance(event, StopEvent):
            self.stop_reason = event.reason
        elif isinstance(event, ErrorEvent):
            self.error = event.message
            self.unusable_model = event.unusable_model

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def thinking(self) -> str:
        return "".join(self.thinking_parts)

    @property
    def never_started(self) -> bool:
        """The call failed before the model produced anything (no text, thinking or tool call)."""
        return bool(self.error) and not self.text_parts and not self.thinking_parts and not self.calls

    @property
    def is_empty(self) -> bool:
        return not self.error and not self.text.strip() and not self.calls

    def tool_calls(self) -> list[PendingCall]:
        calls = [self.calls[i] for i in sorted(self.calls)]
        for c in calls:
            if c.arguments is None and c.parse_error is None:
                c.finish()
        return calls

    def message(self, *, aborted: bool = False, error: str | None = None) -> dict[str, Any]:
        """The pi AssistantMessage; an aborted message keeps the text streamed so far but no tool calls."""
        content: list[dict[str, Any]] = []
        thinking, text = self.thinking, self.text
        if thinking:
            block = {"type": "thinking", "thinking": thinking}
            if self.thinking_signature:
                block["thinkingSignature"] = self.thinking_signature  # pi's field; sent back to Anthropic
            content.append(block)
        if text:
            content.append({"type": "text", "text": text})
        error = error or self.error
        if aborted:
            reason = "aborted"
        elif error:
            reason = "error"
        elif self.stop_reason == "length":
            reason = "length"  # tool calls cut off by the length limit are incomplete: dropped
        else:
            reason = "toolUse" if self.calls else "stop"
        if reason == "toolUse":
            for c in self.tool_calls():
                content.append({"type": "toolCall", "id": c.id, "name": c.name, "arguments": c.arguments or {}})
        msg: dict[str, Any] = {"role": "assistant", "content": content, "api": self.api,
                               "provider": self.model.provider, "model": self.model.model_id,
                               "usage": usage_dict(self.usage), "stopReason": reason, "timestamp": now_ms()}
        if error:
            msg["errorMessage"] = error
        elif aborted:
            msg["errorMessage"] = "Request was aborted"
        return msg


def usage_dict(u: UsageEvent) -> dict[str, Any]:
    """pi ``Usage`` shape (cost split is not known per category, so it is all under ``total``); an unknown
    price keeps pi's numeric ``total`` at 0 and says ``unknown: true`` beside it."""
    cost: dict[str, Any] = {"input": 0.0, "output": 0.0, "cacheRead": 0.0, "cacheWrite": 0.0,
                            "total": u.cost_usd or 0.0}
    if u.cost_usd is None:
        cost["unknown"] = True
    return {"input": u.input, "output": u.output, "cacheRead": u.cache_read, "cacheWrite": u.cache_write,
            "totalTokens": u.input + u.output + u.cache_read + u.cache_write, "cost": cost}
