"""The native agent session (docs/architecture.md §6, docs/spec-conformance.md §3.3).

``Session`` runs the agent loop as one asyncio task per run: build the context (system prompt +
transcript branch), stream one model response, execute its tool calls in order, repeat until the model
stops. Between turns:

- steering messages (``steer``) are consumed at the turn boundary after the current tool batch (or
  after a final answer, which continues the run);
- follow-ups (``follow_up``, and ``prompt`` while busy) only when the agent would otherwise stop, one
  per boundary.

Dispositions are exactly what was observed: ``steer`` → ``queued | accepted | intercepted``
(``intercepted`` = the input handler swallowed it); ``prompt`` → ``accepted | queued`` (or
``intercepted`` when an input handler is installed and swallows it — the only addition to
docs/architecture.md §6);
``abort`` → ``interrupted | no-turn | timeout`` with one cap over clearing the queues and interrupting;
``no-turn`` clears nothing; the session stays continuable after any of them.

Why a run was cut is recorded in the transcript (a ``legion.run_cut`` custom entry right after the
aborted assistant message, ``cause`` ``abort`` or ``stop``), so a relaunch decides from the transcript
alone: ``continue_run`` continues a run its worker's stop cut (``dispose``: retire, pause, a bystander
of a team restart — infrastructure events), never one an explicit ``abort`` ended. A deliberate resume
with new input (``continue_cut=False``: `continue`/`resume` of a stopped or parked child, `legion resume`)
does not continue a stop-cut run and adds no restart note: the caller's message is the first model input
(docs/spec-conformance.md §2.2).

A model error, a tool error, a guard refusal or a budget stop ends the run with a recorded reason
(an assistant message with ``stopReason: "error"`` and ``errorMessage``, or an error tool result) —
nothing raises out of the run. Events go to ``on_event(type, body)``: ``turn_start``, ``text_delta``,
``tool_call`` (``phase`` start | end, ``tool``), ``usage``, ``empty_retry``, ``model_fallback`` (the model could
not be used, the next of ``fallback_models`` took over: ``from``, ``model``, ``error``, ``remaining``),
``agent_settled`` (with ``cut``, the cause, when an abort or a stop cut the run), and
``transcript_repaired`` when the transcript had damaged lines (``Transcript.repair``); usage snapshots
also go to ``on_usage(snapshot)``. Callback failures are logged and ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from loguru import logger

from legion.bus.protocol import (
    AGENT_SETTLED,
    EMPTY_RETRY,
    MODEL_FALLBACK,
    RETRY_SCHEDULED,
    RETRY_SUCCEEDED,
    TEXT_DELTA,
    TOOL_CALL,
    TRANSCRIPT_REPAIRED,
    TURN_START,
    USAGE,
)
from legion.procs import ProcRef, sweep_groups_async
from legion.workers.assembler import AssistantBuilder, PendingCall
from legion.workers.context import SessionContext, current_context, current_tool_call
from legion.workers.engine import AbortOutcome, PromptDisposition, SteerDisposition
from legion.workers.guard import Guard
from legion.workers.outcome import Outcome, outcome_of_messages
from legion.workers.providers.base import (
    CompletionRequest,
    ModelRef,
    Provider,
    ProviderError,
    RetryEvent,
    TextDelta,
    UsageEvent,
)
from legion.workers.providers.registry import ProviderRegistry
from legion.workers.tools.base import LegionRequester, Tool, ToolContext, ToolResult, run_tool, spec
from legion.workers.tools.catalog import select_tools
from legion.workers.transcript import FsyncPolicy, Message, Transcript, now_ms

EventCallback = Callable[[str, dict[str, Any]], None]
InputHandler = Callable[[str, str], bool]  # (text, kind: prompt|steer|follow_up) -> True = intercepted

RESTART_NOTE = ("[legion] The worker hosting this session restarted. The conversation continues from its "
                "transcript; a tool call that was running may not have completed — check its effects before "
                "relying on them.")
NOTE_TYPE_RESTART = "legion.worker_restart"
RUN_CUT_TYPE = "legion.run_cut"  # custom entry after an aborted run: {"cause": "abort" | "stop"}
CUT_ABORT = "abort"  # an operator/agent abort: the session stays idle (continuable on new input)
CUT_STOP = "stop"  # the worker stopped (retire, pause, a bystander restart): a relaunch continues the run
RETRY_TYPE = "legion.empty_generation_retry"
FALLBACK_TYPE = "legion.model_fallback"  # custom entry: {"from", "to", "error"} — the next fallback model took over


@dataclass(frozen=True)
class SessionConfig:
    empty_retries: int = 2
    empty_backoff_s: float = 0.25  # doubled per retry
    abort_timeout_s: float = 5.0
    fsync: FsyncPolicy = FsyncPolicy.SETTLE


@dataclass(frozen=True)
class SettleResult:
    settled: bool
    stop_reason: str | None = None
    error: str | None = None
    outcome: Outcome = "unknown"


@dataclass
class Usage:
    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    cost_usd: float = 0.0  # of the calls whose price is known
    unknown_cost_tokens: int = 0  # tokens of calls whose price is unknown (a cost budget counts these)

    def add(self, u: Any) -> None:
        """Add one pi ``Usage`` object; malformed fields (a foreign transcript) count as zero."""
        if not isinstance(u, dict):
            return
        self.input += _num(u.get("input"))
        self.output += _num(u.get("output"))
        self.cache_read += _num(u.get("cacheRead"))
        self.cache_write += _num(u.get("cacheWrite"))
        cost = u.get("cost")
        self.cost_usd += float(_num(cost.get("total"), float)) if isinstance(cost, dict) else 0.0
        if isinstance(cost, dict) and cost.get("unknown") is True:
            self.unknown_cost_tokens += sum(_num(u.get(k)) for k in ("input", "output", "cacheRead", "cacheWrite"))


def _num(value: Any, kind: type = int) -> Any:
    return kind(value) if isinstance(value, int | float) and not isinstance(value, bool) else kind(0)


def _tool_calls(message: Message) -> list[dict[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "toolCall"]


@dataclass
class _RunState:
    phase: str = "idle"  # model | tools
    builder: AssistantBuilder | None = None
    pending: list[PendingCall] = field(default_factory=list)


class Session:
    """One agent conversation bound to one transcript file."""

    def __init__(self, *, context: SessionContext, model: str, transcript_path: str | Path,
                 registry: ProviderRegistry, system_prompt: str = "", tools: Iterable[str] | None = None,
                 requester: LegionRequester | None = None, on_event: EventCallback | None = None,
                 on_usage: Callable[[dict[str, Any]], None] | None = None, input_handler: InputHandler | None = None,
                 config: SessionConfig | None = None, restarted: bool = False, continue_cut: bool = True,
                 fallback_models: Iterable[str] = ()) -> None:
        self.context = context
        self.config = config or SessionConfig()
        self.system_prompt = system_prompt
        self.on_event = on_event
        self.on_usage = on_usage
        self.input_handler = input_handler
        self._registry = registry
        self._provider: Provider | None = None
        self._provider_error: str | None = None
        self._ref = self._resolve(model)
        self._fallbacks: deque[str] = deque(m for m in fallback_models if m != model)  # the candidates not yet tried
        self.tools: dict[str, Tool] = select_tools(tools)
        self.transcript = Transcript.open(transcript_path, cwd=context.cwd, provider=self._ref.provider,
                                          model_id=self._ref.model_id, thinking=self._ref.thinking or "off",
                                          fsync=self.config.fsync)
        if self.transcript.repair is not None:
            repair = self.transcript.repair
            self._emit(TRANSCRIPT_REPAIRED, {"transcript": str(self.transcript.path), "badLines": repair.bad_lines[:100],
                                               "reattached": len(repair.reattached), "original": str(repair.original)})
        self.tool_ctx = ToolContext(context, Path(transcript_path).parent / f"{Path(transcript_path).stem}.out",
                                    requester)
        self.guard = Guard(context)
        # checked before every model call: a refusal (e.g. the tree-wide cost budget is spent) ends the run
        self.turn_gate: Callable[[], str | None] | None = None
        self.usage = Usage()
        self._steer_q: deque[str] = deque()
        self._follow_q: deque[str] = deque()
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._abort_requested = False
        self._abort_cause = CUT_ABORT
        self._run = _RunState()
        self._last_stop: str | None = None
        self._last_error: str | None = None
        self._settled = True
        self._last_settle: SettleResult | None = None
        self._disposed = False
        self._continue_cut = continue_cut
        self._rebuild_from_history(restarted)

    # ---- construction helpers ------------------------------------------------------------------

    def _resolve(self, model: str) -> ModelRef:
        try:
            self._provider, ref = self._registry.resolve(model)
            self._provider_error = None
            return ref
        except ProviderError as exc:
            self._provider, self._provider_error = None, str(exc)
            provider, _, rest = model.partition("/")
            return ModelRef(provider or "unknown", rest or model)

    def _rebuild_from_history(self, restarted: bool) -> None:
        """Recount budgets and usage from the transcript; close tool calls a crash left unanswered."""
        messages = self.transcript.messages()
        self._had_history = any(m.get("role") in ("user", "assistant") and not m.get("customType") for m in messages)
        last_assistant = -1
        for i, m in enumerate(messages):
            if m.get("role") == "assistant":
                last_assistant = i
                self.guard.turns += 1
                self.usage.add(m.get("usage"))
                self.guard.tool_calls += len(_tool_calls(m))
        tail = messages[last_assistant + 1:] if last_assistant >= 0 else []
        if last_assistant >= 0 and all(m.get("role") == "toolResult" for m in tail):
            answered = {m.get("toolCallId") for m in tail}
            for block in _tool_calls(messages[last_assistant]):
                if block.get("id") not in answered:
                    self._append_tool_result(str(block.get("id", "")), str(block.get("name", "")), ToolResult(
                        "the worker stopped while this tool call was running; its result is unknown", True))
        if self.transcript.resumed:
            last_model = next((e for e in reversed(self.transcript.entries) if e.get("type") == "model_change"), None)
            if last_model is None or (last_model.get("provider"), last_model.get("modelId")) != (
                    self._ref.provider, self._ref.model_id):
                self.transcript.append({"type": "model_change", "provider": self._ref.provider,
                                        "modelId": self._ref.model_id})
            real = [m for m in self.transcript.messages() if not m.get("customType")]
            mid_turn = bool(real) and real[-1].get("role") != "assistant"  # a crash cut it: nothing recorded the end
            if restarted and (self._continue_cut or mid_turn):
                self.transcript.append_note(NOTE_TYPE_RESTART, RESTART_NOTE)

    # ---- public interface ----------------------------------------------------------------------

    @property
    def state(self) -> Literal["idle", "streaming"]:
        return "streaming" if self._task is not None and not self._task.done() else "idle"

    @property
    def transcript_path(self) -> Path:
        return self.transcript.path

    @property
    def has_history(self) -> bool:
        return self._had_history

    @property
    def model(self) -> ModelRef:
        return self._ref

    def set_model(self, model: str) -> None:
        """Switch model for the next turn (recorded as a pi ``model_change`` entry)."""
        self._ref = self._resolve(model)
        self.transcript.append({"type": "model_change", "provider": self._ref.provider,
                                "modelId": self._ref.model_id})

    async def prompt(self, text: str) -> PromptDisposition:
        if self._intercepted(text, "prompt"):
            return "intercepted"
        if self.state == "idle":
            self._start(text)
            return "accepted"
        self._follow_q.append(text)
        return "queued"

    @property
    def tool_pgids(self) -> set[int]:
        """The process groups of this session's live tool processes (the root sweeps them after a crash)."""
        return {g for g in self.tool_ctx.pgids if isinstance(g, int)}

    def continue_run(self) -> bool:
        """Resume an interrupted run without new input (after a worker restart): starts the loop when the
        last real message is a user message or tool result, or an assistant turn cut by a worker stop
        (not by an explicit abort, and not when this is a deliberate resume: ``continue_cut`` False);
        returns whether it started."""
        if self.state != "idle" or self._disposed:
            return False
        real = [m for m in self.transcript.messages() if not m.get("customType")]
        if not real:
            return False
        if real[-1].get("role") == "assistant" and not (
                self._continue_cut and real[-1].get("stopReason") == "aborted" and self._last_cut_cause() == CUT_STOP):
            return False
        self._launch_loop()
        return True

    def _last_cut_cause(self) -> str | None:
        """The cause recorded for the last assistant message's abort (None: none recorded after it)."""
        for entry in reversed(self.transcript.entries):
            if entry.get("type") == "custom" and entry.get("customType") == RUN_CUT_TYPE:
                data = entry.get("data")
                return data.get("cause") if isinstance(data, dict) else None
            message = entry.get("message")
            if entry.get("type") == "message" and isinstance(message, dict) and message.get("role") == "assistant":
                return None
        return None

    async def steer(self, text: str) -> SteerDisposition:
        if self._intercepted(text, "steer"):
            return "intercepted"
        if self.state == "idle":
            self._start(text)
            return "accepted"
        self._steer_q.append(text)
        return "queued"

    def withdraw(self, texts: list[str]) -> list[str]:
        """Take back queued input not consumed yet (a boundary has not taken it): the postman hands a mail that
        reached a session just before it blocked in wait/collect to that call instead."""
        wanted = set(texts)
        taken: list[str] = []
        for queue in (self._steer_q, self._follow_q):
            kept = [t for t in queue if t not in wanted]
            taken += [t for t in queue if t in wanted]
            queue.clear()
            queue.extend(kept)
        return taken

    async def follow_up(self, text: str) -> None:
        if self.state == "idle":
            self._start(text)
        else:
            self._follow_q.append(text)

    async def abort(self, clear_queued: bool = True, timeout: float | None = None, *,
                    cause: str = CUT_ABORT) -> AbortOutcome:
        """Interrupt the current turn; one ``timeout`` covers clearing the queues and the interrupt.
        ``cause`` is recorded in the transcript (``stop`` = the worker is stopping; see the module doc)."""
        task = self._task
        if task is None or task.done():
            return "no-turn"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.config.abort_timeout_s if timeout is None else timeout)
        if clear_queued:
            self._steer_q.clear()
            self._follow_q.clear()
        self._abort_requested = True
        self._abort_cause = cause
        task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(task), max(0.0, deadline - loop.time()))
        except TimeoutError:
            return "timeout"
        except asyncio.CancelledError:
            if not task.done():
                raise
        self._on_task_done(task)  # idempotent; the done callback may not have run yet
        return "interrupted"

    async def wait_settled(self, timeout: float | None = None) -> SettleResult:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return SettleResult(False, self._last_stop, self._last_error, "unknown")
        # the result of the settle that woke us: a run started right after it must not show through
        return self._last_settle or SettleResult(True, self._last_stop, self._last_error, self.outcome())

    def outcome(self) -> Outcome:
        return outcome_of_messages(self.transcript.messages())

    def stats(self) -> dict[str, Any]:
        return {"state": self.state, "turns": self.guard.turns, "toolCalls": self.guard.tool_calls,
                "input": self.usage.input, "output": self.usage.output, "cacheRead": self.usage.cache_read,
                "cacheWrite": self.usage.cache_write, "costUsd": round(self.usage.cost_usd, 8),
                "costUnknown": self.usage.unknown_cost_tokens > 0, "unknownCostTokens": self.usage.unknown_cost_tokens,
                "queuedSteers": len(self._steer_q), "queuedFollowUps": len(self._follow_q),
                "model": self._ref.label}

    async def dispose(self, timeout: float = 5.0) -> list[ProcRef]:
        """Stop any turn, sweep the session's tool process groups (legion.procs), close the transcript.

        Returns the processes that survived the sweep (empty = clean).
        """
        if self._disposed:
            return []
        self._disposed = True
        if self.state == "streaming":
            await self.abort(clear_queued=True, timeout=timeout, cause=CUT_STOP)
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._task, 1.0)
        await self.tool_ctx.executor.aclose()  # its helper processes, killed and reaped (the sweep is the backstop)
        survivors = await sweep_groups_async(set(self.tool_ctx.pgids)) if self.tool_ctx.pgids else []
        self.tool_ctx.pgids.clear()
        self.transcript.close()
        if survivors:
            logger.warning("session {}: tool processes survived the sweep: {}", self.context.node_id, survivors)
        return survivors

    # ---- the run -------------------------------------------------------------------------------

    def _intercepted(self, text: str, kind: str) -> bool:
        if self.input_handler is None:
            return False
        try:
            return bool(self.input_handler(text, kind))
        except Exception:  # a broken handler must not swallow input silently
            logger.exception("input handler failed for session {}", self.context.node_id)
            return False

    def _start(self, text: str) -> None:
        if self._disposed:
            raise RuntimeError(f"session {self.context.node_id} is disposed")
        self._append_user(text)
        self._launch_loop()

    def _launch_loop(self) -> None:
        self._abort_requested = False
        self._abort_cause = CUT_ABORT
        self._idle.clear()
        self._settled = False
        self._task = asyncio.get_running_loop().create_task(self._run_loop(), name=f"session:{self.context.node_id}")
        self._task.add_done_callback(self._on_task_done)

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        """A run cancelled before its first step never entered ``_run_loop``: record and settle it here."""
        if task is self._task and not self._settled:
            with contextlib.suppress(Exception):
                if self._abort_requested and not self.transcript.closed:
                    self._record_abort()
            self._settle()

    def _append_user(self, text: str) -> None:
        self.transcript.append_message({"role": "user", "content": [{"type": "text", "text": text}],
                                        "timestamp": now_ms()})

    async def _run_loop(self) -> None:
        current_context.set(self.context)
        self._last_error = None
        try:
            while not self._abort_requested and await self._one_turn():
                pass
            if self._abort_requested:  # a step swallowed the cancellation; stop at this boundary anyway
                self._record_abort()
        except asyncio.CancelledError:
            if not self._abort_requested:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            self._record_abort()
        except Exception as exc:  # the loop must never die with an exception
            logger.exception("session {} run failed", self.context.node_id)
            try:
                self._record_error(f"internal error in the agent loop: {type(exc).__name__}: {exc}")
            except Exception:  # e.g. the transcript was closed by dispose: nothing left to record into
                logger.exception("session {}: the failure could not be recorded", self.context.node_id)
        finally:
            self._settle()

    async def _one_turn(self) -> bool:
        """Run one model turn (+ its tool batch); return True when the loop should continue."""
        refusal = self._gate_refusal() or self.guard.before_turn()
        if refusal:
            self._record_error(refusal)
            return False
        self._emit(TURN_START, {"turn": self.guard.turns})
        msg, calls = await self._model_turn()
        if msg["stopReason"] != "toolUse":
            return self._boundary(final=True)
        budget_hit = await self._tool_batch(calls)
        if budget_hit:
            self._record_error(budget_hit)
            return False
        return self._boundary(final=False)

    def _gate_refusal(self) -> str | None:
        if self.turn_gate is None:
            return None
        try:
            return self.turn_gate()
        except Exception as exc:  # a gate that cannot decide never stops a run
            logger.warning("session {}: turn gate failed: {!r}", self.context.node_id, exc)
            return None

    def _boundary(self, final: bool) -> bool:
        """Turn boundary: steering first; follow-ups only when the agent would otherwise stop."""
        if self._last_stop in ("error", "length", "aborted"):
            return False
        if self._steer_q:
            while self._steer_q:
                self._append_user(self._steer_q.popleft())
            return True
        if final and self._follow_q:
            self._append_user(self._follow_q.popleft())
            return True
        return not final

    async def _model_turn(self) -> tuple[Message, list[PendingCall]]:
        attempt = 0
        while True:
            builder = await self._stream(attempt)
            if self._fall_back(builder):
                attempt = 0
                continue
            if not builder.is_empty or attempt >= self.config.empty_retries:
                break
            attempt += 1
            backoff = self.config.empty_backoff_s * (2 ** (attempt - 1))
            self.transcript.append_custom(RETRY_TYPE, {"attempt": attempt, "maxRetries": self.config.empty_retries,
                                                       "model": self._ref.label, "backoffMs": int(backoff * 1000)})
            self._emit(EMPTY_RETRY, {"attempt": attempt, "backoffMs": int(backoff * 1000)})
            await asyncio.sleep(backoff)
        error = None
        if builder.is_empty:
            error = (f"model {self._ref.label} returned an empty generation (no text, no tool call) "
                     f"{attempt + 1} times")
        msg = builder.message(error=error)
        calls = builder.tool_calls() if msg["stopReason"] == "toolUse" else []
        self._run = _RunState("tools", None, list(calls))
        self._commit_assistant(msg)
        return msg, calls

    def _fall_back(self, builder: AssistantBuilder) -> bool:
        """The model could not be used at all (it could not be resolved, its key is missing, it is unknown or its
        authentication was refused) before it produced anything: the next fallback model takes this call, and the
        session stays on it (docs/spec-conformance.md §1.5). Any other error ends the run as usual."""
        unusable = self._provider is None or builder.unusable_model
        if not self._fallbacks or not builder.never_started or not unusable:
            return False
        failed, why = self._ref.label, str(builder.error)
        self.set_model(self._fallbacks.popleft())
        self.transcript.append_custom(FALLBACK_TYPE, {"from": failed, "to": self._ref.label, "error": why})
        logger.warning("session {}: model {} unusable ({}); switched to fallback model {}", self.context.node_id,
                       failed, why, self._ref.label)
        self._emit(MODEL_FALLBACK, {"from": failed, "model": self._ref.label, "error": why,
                                      "remaining": list(self._fallbacks)})
        return True

    async def _stream(self, attempt: int) -> AssistantBuilder:
        builder = AssistantBuilder(self._ref, self._provider.api if self._provider else "unknown")
        self._run = _RunState("model", builder)
        if self._provider is None:
            builder.error = self._provider_error
            return builder
        request = CompletionRequest(self._ref, self.system_prompt, self.transcript.messages(),
                               [spec(t) for t in self.tools.values()], attempt, self.context.env, self.context.cwd)
        try:
            async for event in self._provider.stream(request):
                builder.feed(event)
                if isinstance(event, TextDelta) and self.on_event is not None:
                    self._emit(TEXT_DELTA, {"delta": event.text})
                elif isinstance(event, RetryEvent):
                    self._emit_retry(event)
        except (asyncio.CancelledError, KeyboardInterrupt):
            raise
        except Exception as exc:  # a provider bug is a recorded model error
            builder.error = f"provider {self._ref.provider!r} failed: {type(exc).__name__}: {exc}"
        return builder

    async def _tool_batch(self, calls: list[PendingCall]) -> str | None:
        """Execute calls in order; return a budget-stop reason if the tool budget ran out."""
        budget_stop: str | None = None
        for call in calls:
            if self._abort_requested:  # an earlier call swallowed the interrupt: nothing more runs
                raise asyncio.CancelledError
            self._emit(TOOL_CALL, {"phase": "start", "id": call.id, "tool": call.name, "args": call.arguments or {}})
            budget_refusal = self.guard.tool_budget_refusal()
            result = ToolResult(budget_refusal, True) if budget_refusal else await self._execute(call)
            budget_stop = budget_stop or budget_refusal
            self._append_tool_result(call.id, call.name, result)
            self._run.pending = [c for c in self._run.pending if c.id != call.id]
            self._emit(TOOL_CALL, {"phase": "end", "id": call.id, "tool": call.name, "isError": result.is_error})
        return budget_stop

    async def _execute(self, call: PendingCall) -> ToolResult:
        tool = self.tools.get(call.name)
        if tool is None:
            self.guard.tool_calls += 1
            return ToolResult(f"unknown tool {call.name!r}; available tools: {', '.join(self.tools)}", True)
        if call.parse_error:
            self.guard.tool_calls += 1
            return ToolResult(f"{call.name}: {call.parse_error}; raw arguments: {call.raw[:200]!r}", True)
        refusal = self.guard.check_tool(call.name, call.arguments)
        if refusal:
            return ToolResult(refusal, True)
        token = current_tool_call.set(call.id)
        try:
            return await run_tool(tool, call.arguments, self.tool_ctx)
        finally:
            current_tool_call.reset(token)

    # ---- recording -----------------------------------------------------------------------------

    def _append_tool_result(self, call_id: str, name: str, result: ToolResult) -> None:
        msg: Message = {"role": "toolResult", "toolCallId": call_id, "toolName": name,
                        "content": [{"type": "text", "text": result.text}], "isError": result.is_error,
                        "timestamp": now_ms()}
        if result.details:
            msg["details"] = result.details
        self.transcript.append_message(msg)

    def _commit_assistant(self, msg: Message) -> None:
        self.transcript.append_message(msg)
        self._last_stop = msg["stopReason"]
        if msg.get("stopReason") == "error":
            self._last_error = msg.get("errorMessage")
        self.usage.add(msg["usage"])
        snapshot = self.stats()
        self._emit(USAGE, snapshot)
        if self.on_usage is not None:
            try:
                self.on_usage(snapshot)
            except Exception:  # observers never break the session
                logger.exception("on_usage callback failed for session {}", self.context.node_id)

    def _record_error(self, reason: str) -> None:
        builder = AssistantBuilder(self._ref, self._provider.api if self._provider else "unknown")
        self._commit_assistant(builder.message(error=reason))

    def _record_abort(self) -> None:
        run = self._run
        if run.phase == "model" and run.builder is not None:
            self._commit_assistant(run.builder.message(aborted=True))
        else:
            for call in run.pending:
                self._append_tool_result(call.id, call.name, ToolResult("aborted before completion", True))
            builder = AssistantBuilder(self._ref, self._provider.api if self._provider else "unknown",
                                       usage=UsageEvent())
            self._commit_assistant(builder.message(aborted=True))
        self.transcript.append_custom(RUN_CUT_TYPE, {"cause": self._abort_cause})

    def _settle(self) -> None:
        self._settled = True
        self._run = _RunState()
        with contextlib.suppress(OSError):
            self.transcript.sync()
        self._last_settle = SettleResult(True, self._last_stop, self._last_error, self.outcome())
        self._idle.set()
        body: dict[str, Any] = {"stopReason": self._last_stop, "error": self._last_error,
                                "outcome": self._last_settle.outcome}
        if self._abort_requested:  # why the run was cut: `stop` (its worker stopping) is not the run's end
            body["cut"] = self._abort_cause
        self._emit(AGENT_SETTLED, body)

    def _emit_retry(self, event: RetryEvent) -> None:
        """A retry of this turn's model request (docs/events.md, "Retries"); the root logs it (legion.log)."""
        body: dict[str, Any] = {"attempt": event.attempt, "max_retries": event.max_retries,
                                "provider": self._ref.provider, "model": self._ref.label}
        if event.name != RETRY_SUCCEEDED:
            body |= {"status_code": event.status_code, "error": event.error}
        if event.name == RETRY_SCHEDULED:
            body["delay_ms"] = event.delay_ms
        self._emit(event.name, body)

    def _emit(self, type_: str, body: dict[str, Any]) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(type_, body)
        except Exception:  # observers never break the session
            logger.exception("on_event callback failed for session {} ({})", self.context.node_id, type_)
