"""Provider protocol: a model provider streams one assistant response as a sequence of events.

Models are named ``provider/model-id[:thinking]``; the model id may itself contain ``/`` (OpenRouter
style ``openrouter/openai/gpt-4o``) and ``:`` (Ollama tags such as ``llama3:8b``) — only a trailing
known thinking level is stripped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

THINKING_LEVELS = ("off", "minimal", "low", "medium", "high", "xhigh")


class ProviderError(Exception):
    """A provider could not be resolved or configured (raised before any streaming)."""


@dataclass(frozen=True)
class ModelRef:
    provider: str
    model_id: str
    thinking: str | None = None

    @property
    def label(self) -> str:
        base = f"{self.provider}/{self.model_id}"
        return f"{base}:{self.thinking}" if self.thinking else base


def parse_model_ref(ref: str) -> ModelRef:
    """Parse ``provider/model-id[:thinking]``; raise ProviderError with the expected shape."""
    if not isinstance(ref, str) or "/" not in ref:
        raise ProviderError(f"model {ref!r} must be 'provider/model-id[:thinking]', e.g. 'openai/gpt-4o:high' "
                            "or 'scripted/echo'")
    provider, _, rest = ref.partition("/")
    thinking: str | None = None
    head, sep, tail = rest.rpartition(":")
    if sep and tail in THINKING_LEVELS:
        rest, thinking = head, tail
    if not provider or not rest:
        raise ProviderError(f"model {ref!r} has an empty provider or model id; expected 'provider/model-id'")
    return ModelRef(provider, rest, thinking)


# ---- stream events -------------------------------------------------------------------------------
# Not frozen: one is built per streamed token, and a frozen dataclass costs twice as much to build.

@dataclass(slots=True)
class TextDelta:
    text: str


@dataclass(slots=True)
class ThinkingDelta:
    text: str
    signature: str = ""  # Anthropic's block signature (sent back with the block on the next call)


@dataclass(slots=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(slots=True)
class ToolCallDelta:
    index: int
    args_delta: str


@dataclass(slots=True)
class UsageEvent:
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost_usd: float | None = 0.0  # None: the price of this model is unknown (not zero)


@dataclass(slots=True)
class StopEvent:
    reason: str  # "stop" | "length" | "toolUse"


@dataclass(slots=True)
class ErrorEvent:
    message: str
    # the model could not be used at all (unknown model, API key missing, authentication refused): another model
    # may work, so a session with fallback models tries the next one (docs/spec-conformance.md §1.5)
    unusable_model: bool = False


@dataclass(slots=True)
class RetryEvent:
    """A request of this response was retried, or its retries ended (`providers/retry.py`): `name` is one of the
    retry event names of `legion.bus.protocol`, `attempt` the retry's number (1 for the first)."""

    name: str
    attempt: int
    max_retries: int
    delay_ms: int = 0  # the wait before this retry (retry_scheduled)
    status_code: int | None = None  # the failed request's HTTP status; None for a connection error
    error: str = ""  # why the request failed (retry_scheduled, retry_gave_up)


ProviderEvent = (TextDelta | ThinkingDelta | ToolCallStart | ToolCallDelta | UsageEvent | StopEvent | ErrorEvent
                 | RetryEvent)


@dataclass
class CompletionRequest:
    """Everything a provider needs for one call; ``messages`` are pi ``AgentMessage`` dicts."""

    model: ModelRef
    system_prompt: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    attempt: int = 0  # 0 for the first call of a turn, n for the n-th empty-generation retry
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None


class Provider(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def api(self) -> str: ...

    def stream(self, request: CompletionRequest) -> AsyncIterator[ProviderEvent]:
        """Yield events for one assistant response; failures are ``ErrorEvent``s, never exceptions."""
        ...
