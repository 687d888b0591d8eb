"""The ``pi`` engine: a session run by a ``pi --mode rpc`` child process behind the AgentSession interface.

pi (pi-mono ``packages/coding-agent``) speaks JSON lines on stdin/stdout (``docs/rpc.md``): commands
``{"id", "type": "prompt" | "steer" | "follow_up" | "abort" | …}`` answered by
``{"type": "response", "id", "command", "success", "error"?}``, and agent events (``agent_start``,
``turn_start``, ``message_update`` with ``assistantMessageEvent.text_delta``, ``message_end``,
``tool_execution_start`` / ``_end``, ``agent_end``). pi writes the transcript itself (``--session``);
legion pre-creates it with a v3 header so pi continues that exact file, and derives the outcome from
it like for the native engine.

Mapping onto docs/architecture.md §6, claiming only what is observed:

- ``prompt``/``steer``/``follow_up`` on an idle session send ``prompt`` (``accepted``); while a run is
  going they send ``follow_up`` / ``steer`` (``queued``). pi's RPC does not report input-handler
  interception, so ``intercepted`` is never claimed.
- ``abort`` sends ``abort`` and waits for ``agent_end`` (``interrupted`` / ``timeout`` within one cap;
  ``no-turn`` when idle). ``interrupted`` needs pi's confirmation of the abort and then the run's end;
  a pi that dies or never answers gives ``timeout``. pi's RPC has no command to clear its queues, so ``clear_queued`` cannot be
  honoured here; ``stats()["clearQueuedSupported"]`` is False.
- ``continue_run`` is not possible without new input (pi has no "resume run" command): returns False.
- ``dispose`` closes stdin (pi's EOF), then TERM/KILL, then sweeps the child's process group.
- ``tool_pgids`` is the pi child's process group while it runs (pi leads its own group; the session
  service reports it to the root like native tool groups, so a killed worker's pi is swept).
- ``wait_settled`` returns the result recorded at the settle that woke it (a run pi starts right after
  must not show through).
- an extension's dialog (pi's extension UI sub-protocol: an ``extension_ui_request`` whose ``method`` is
  ``confirm``/``select``/``input``/``editor``) waits for an ``extension_ui_response`` on stdin. It is
  reported as a ``ui_request`` event with ``phase: open`` (the request), and answered with ``respond_ui``
  (``phase: answered``). pi resolves a dialog with a ``timeout`` by itself and does not say so: the request
  counts as ``expired`` at its timeout, at the next turn, or when the run ends. Fire-and-forget methods
  (``notify``, ``setStatus`` …) need no answer and are ignored (docs/spec-conformance.md §2.1, blocked).

Tested against a protocol fake (``tests/integration/fake_pi.py``) and, when ``pi`` is installed, against
the real pi 0.73 with the local OpenAI-compatible stub as its model (``test_sessions_pi_real.py``).
Observed pi behaviour to keep in mind: pi defers writing a new session's entries until the first
assistant message arrives, then appends everything it holds — including a second copy of the header
and of legion's pre-written entries (same ids; both pi and ``read_transcript`` tolerate this). A pi
crash before the first assistant message therefore loses the prompt from the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import orjson
from loguru import logger

from legion.bus.protocol import AGENT_SETTLED, TEXT_DELTA, TOOL_CALL, TURN_START, UI_REQUEST, USAGE
from legion.procs import ProcRef, sweep_groups_async
from legion.workers.context import SessionContext
from legion.workers.engine import AbortOutcome, PromptDisposition, SessionState, SteerDisposition
from legion.workers.outcome import derive_outcome
from legion.workers.providers.base import parse_model_ref
from legion.workers.session import NOTE_TYPE_RESTART, RESTART_NOTE, EventCallback, SettleResult, Usage
from legion.workers.transcript import Transcript, context_messages, read_transcript

COMMAND_TIMEOUT_S = 10.0
# node loads pi's modules before it reads its first command: seconds idle, many times that on a loaded machine
BOOT_TIMEOUT_S = 60.0
_LINE_LIMIT = 64 * 1024 * 1024
UI_DIALOGS = ("confirm", "select", "input", "editor")  # extension UI methods that wait for an answer
_UI_FIELDS = ("title", "message", "options", "placeholder", "prefill", "timeout")


class PiError(RuntimeError):
    """The pi process refused a command or is gone."""


class PiSession:
    """One agent conversation run by a ``pi --mode rpc`` process."""

    def __init__(self, *, context: SessionContext, model: str, transcript_path: str | Path,
                 command: Sequence[str] = ("pi",), extra_args: Sequence[str] = (), system_prompt: str = "",
                 on_event: EventCallback | None = None, on_usage: Callable[[dict[str, Any]], None] | None = None,
                 abort_timeout_s: float = 5.0, restarted: bool = False, stderr_path: str | Path | None = None) -> None:
        self.context = context
        self.model = parse_model_ref(model)
        self.on_event = on_event
        self.on_usage = on_usage
        self.abort_timeout_s = abort_timeout_s
        self._path = Path(transcript_path)
        self._argv = [*command, "--mode", "rpc", "--session", str(self._path), "--model", self.model.label,
                      *(["--append-system-prompt", system_prompt] if system_prompt else []), *extra_args]
        self._stderr_path = Path(stderr_path) if stderr_path else self._path.with_suffix(".pi-stderr.log")
        self._had_history = self._prepare_transcript(restarted)
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._answered = False  # pi has answered a command: it is booted
        self._streaming = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._exit_error: str | None = None
        self._last_settle: SettleResult | None = None  # the result of the latest settle, taken when it happened
        self._ui: dict[str, dict[str, Any]] = {}  # open extension dialogs by request id (see the module docstring)
        self.usage = Usage()
        self.turns = 0
        self.tool_calls = 0

    def _prepare_transcript(self, restarted: bool) -> bool:
        """Header (and restart note) written by legion before pi opens the file; returns has-history."""
        t = Transcript.open(self._path, cwd=self.context.cwd, provider=self.model.provider,
                            model_id=self.model.model_id, thinking=self.model.thinking or "off")
        try:
            history = any(m.get("role") in ("user", "assistant") and not m.get("customType") for m in t.messages())
            if restarted and history:
                t.append_note(NOTE_TYPE_RESTART, RESTART_NOTE)
            return history
        finally:
            t.close()

    @classmethod
    async def create(cls, **kwargs: Any) -> PiSession:
        session = cls(**kwargs)
        await session.start()
        return session

    async def start(self) -> None:
        """Spawn pi in its own process group with the session's environment and cwd."""
        with open(self._stderr_path, "ab") as err:
            try:
                self._proc = await asyncio.create_subprocess_exec(
                    *self._argv, cwd=self.context.cwd, env=self.context.tool_env(), stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE, stderr=err, start_new_session=True, limit=_LINE_LIMIT)
            except OSError as exc:
                raise PiError(f"cannot start pi ({self._argv[0]}): {exc.strerror}; install pi or set the pi "
                              "command in the session spec") from exc
        self._reader = asyncio.get_running_loop().create_task(self._read(), name=f"pi:{self.context.node_id}")

    # ---- AgentSession --------------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        return "streaming" if self._streaming else "idle"

    @property
    def transcript_path(self) -> Path:
        return self._path

    @property
    def has_history(self) -> bool:
        return self._had_history

    async def prompt(self, text: str) -> PromptDisposition:
        return await self._deliver("follow_up", text)

    async def steer(self, text: str) -> SteerDisposition:
        return await self._deliver("steer", text)

    async def follow_up(self, text: str) -> None:
        await self._deliver("follow_up", text)

    def withdraw(self, texts: list[str]) -> list[str]:
        """pi's RPC cannot take back one queued message: what it queued is consumed at its next boundary."""
        return []

    async def _deliver(self, kind: str, text: str) -> Literal["queued", "accepted"]:
        """Queue ``text`` as a pi ``kind`` command while a run streams, else start a run with it."""
        if self._streaming:
            await self._command({"type": kind, "message": text})
            return "queued"
        await self._start_run(text)
        return "accepted"

    async def abort(self, clear_queued: bool = True, timeout: float | None = None) -> AbortOutcome:
        if not self._streaming:
            return "no-turn"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.abort_timeout_s if timeout is None else timeout)
        try:
            await self._command({"type": "abort"}, timeout=max(0.0, deadline - loop.time()))
        except (TimeoutError, PiError):
            return "timeout"  # pi never confirmed the interrupt (it refused it, hung or died): claim nothing
        try:
            await asyncio.wait_for(self._idle.wait(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            return "timeout"
        return "interrupted"

    async def wait_settled(self, timeout: float | None = None) -> SettleResult:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return SettleResult(False, None, self._exit_error, "unknown")
        # the result of the settle that woke us: a run started right after it must not show through
        return self._last_settle or self._settle_result()

    def _settle_result(self) -> SettleResult:
        last = self._last_assistant()
        return SettleResult(True, last.get("stopReason") if last else None,
                            (last or {}).get("errorMessage") or self._exit_error, derive_outcome(self._path))

    def continue_run(self) -> bool:
        return False

    @property
    def open_ui_requests(self) -> list[dict[str, Any]]:
        """The extension dialogs pi is waiting on an answer for, oldest first."""
        return list(self._ui.values())

    async def respond_ui(self, request_id: str, response: dict[str, Any]) -> bool:
        """Answer an open extension dialog (``confirmed`` / ``value`` / ``cancelled``, as pi's docs/rpc.md names
        them); False when it is not open any more (answered, expired, or never asked)."""
        request = self._ui.pop(request_id, None)
        proc = self._proc
        if request is None or proc is None or proc.returncode is not None or proc.stdin is None:
            return False
        try:
            proc.stdin.write(orjson.dumps({"type": "extension_ui_response", "id": request_id, **response}) + b"\n")
            await proc.stdin.drain()
        except (ConnectionError, BrokenPipeError) as exc:
            raise PiError(f"pi for session {self.context.node_id} closed its input: {exc}") from exc
        self._emit(UI_REQUEST, {"phase": "answered", "requestId": request_id, "method": request["method"],
                                  "response": response})
        return True

    @property
    def tool_pgids(self) -> set[int]:
        """The pi child's process group (it leads its own; pi's tools run under it) while it is alive, so
        the root can sweep it after the worker is killed."""
        proc = self._proc
        return {proc.pid} if proc is not None and proc.returncode is None else set()

    def stats(self) -> dict[str, Any]:
        return {"state": self.state, "turns": self.turns, "toolCalls": self.tool_calls, "input": self.usage.input,
                "output": self.usage.output, "cacheRead": self.usage.cache_read,
                "cacheWrite": self.usage.cache_write, "costUsd": round(self.usage.cost_usd, 8),
                "costUnknown": self.usage.unknown_cost_tokens > 0, "unknownCostTokens": self.usage.unknown_cost_tokens,
                "model": self.model.label, "engine": "pi", "clearQueuedSupported": False,
                "alive": self._proc is not None and self._proc.returncode is None}

    async def dispose(self, timeout: float = 5.0) -> list[ProcRef]:
        proc = self._proc
        if proc is None:
            return []
        pgid = proc.pid
        if proc.returncode is None:
            if proc.stdin is not None:
                with contextlib.suppress(Exception):
                    proc.stdin.close()
            for sig, wait in ((None, min(timeout, 2.0)), (signal.SIGTERM, 1.0), (signal.SIGKILL, 1.0)):
                if sig is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(pgid, sig)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), wait)
                if proc.returncode is not None:
                    break
        survivors = await sweep_groups_async({pgid})
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
        return survivors

    # ---- protocol ------------------------------------------------------------------------------

    async def _start_run(self, text: str) -> None:
        self._streaming = True  # before the reply: pi's agent_start may trail it
        self._idle.clear()
        try:
            await self._command({"type": "prompt", "message": text})
        except BaseException:
            self._streaming = False
            self._idle.set()
            raise

    async def _command(self, cmd: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        if timeout is None:
            timeout = COMMAND_TIMEOUT_S if self._answered else BOOT_TIMEOUT_S
        proc = self._proc
        if proc is None or proc.returncode is not None or proc.stdin is None or self._exit_error:
            raise PiError(f"pi for session {self.context.node_id} is not running ({self._exit_error or 'not started'})")
        cid = f"legion-{next(self._ids)}"
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[cid] = fut
        try:
            proc.stdin.write(orjson.dumps({**cmd, "id": cid}) + b"\n")
            await proc.stdin.drain()
            reply = await asyncio.wait_for(fut, timeout)
        except (ConnectionError, BrokenPipeError) as exc:
            raise PiError(f"pi for session {self.context.node_id} closed its input: {exc}") from exc
        except TimeoutError as exc:
            raise PiError(f"pi did not answer {cmd['type']!r} within {timeout:g} s") from exc
        finally:
            self._pending.pop(cid, None)
        self._answered = True
        if not reply.get("success", False):
            raise PiError(f"pi refused {cmd['type']!r}: {reply.get('error') or 'no reason given'}")
        return reply

    async def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        stdout = self._proc.stdout
        try:
            while line := await stdout.readline():
                try:
                    msg = orjson.loads(line)
                except orjson.JSONDecodeError:
                    logger.warning("pi {}: ignoring a non-JSON stdout line: {!r}", self.context.node_id, line[:200])
                    continue
                if isinstance(msg, dict):
                    self._dispatch(msg)
        finally:
            code = await self._proc.wait()
            self._exit_error = f"pi exited with code {code}"
            self._ui_expired(None)
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(PiError(self._exit_error))
            if self._streaming:
                self._streaming = False
                self._last_settle = SettleResult(True, None, self._exit_error, "unknown")
                self._idle.set()
                self._emit(AGENT_SETTLED, {"stopReason": None, "error": self._exit_error, "outcome": "unknown"})

    def _dispatch(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "response":
            fut = self._pending.get(str(msg.get("id")))
            if fut is not None and not fut.done():
                fut.set_result(msg)
        elif kind == "extension_ui_request":
            self._ui_opened(msg)
        elif kind == "agent_start":
            self._streaming = True
            self._idle.clear()
        elif kind == "agent_end":
            self._ui_expired(None)
            self._streaming = False
            settle = self._last_settle = self._settle_result()
            self._idle.set()
            self._emit(AGENT_SETTLED, {"stopReason": settle.stop_reason, "error": settle.error,
                                         "outcome": settle.outcome})
        elif kind == "turn_start":
            self._ui_expired(None)  # a new turn: no dialog of the last one is waiting any more
            self.turns += 1
            self._emit(TURN_START, {"turn": self.turns})
        elif kind == "message_update":
            ev = msg.get("assistantMessageEvent") or {}
            if isinstance(ev, dict) and ev.get("type") == "text_delta" and isinstance(ev.get("delta"), str):
                self._emit(TEXT_DELTA, {"delta": ev["delta"]})
        elif kind == "message_end":
            self._message_end(msg.get("message"))
        elif kind in ("tool_execution_start", "tool_execution_end"):
            self._tool_event(kind, msg)

    def _ui_opened(self, msg: dict[str, Any]) -> None:
        method, rid = msg.get("method"), msg.get("id")
        if method not in UI_DIALOGS or not isinstance(rid, str) or rid in self._ui:
            return  # fire-and-forget (notify, setStatus …): nothing waits for an answer
        request = {"requestId": rid, "method": method, **{k: msg[k] for k in _UI_FIELDS if msg.get(k) is not None}}
        self._ui[rid] = request
        timeout = msg.get("timeout")
        if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
            # pi answers it itself at its timeout (docs/rpc.md) and does not tell
            asyncio.get_running_loop().call_later(timeout / 1000, self._ui_expired, rid)
        self._emit(UI_REQUEST, {"phase": "open", **request})

    def _ui_expired(self, request_id: str | None) -> None:
        """pi no longer waits on the dialog `request_id` (None: on any): it resolved it by itself."""
        for rid in [request_id] if request_id is not None else list(self._ui):
            request = self._ui.pop(rid, None)
            if request is not None:
                self._emit(UI_REQUEST, {"phase": "expired", "requestId": rid, "method": request["method"]})

    def _message_end(self, message: Any) -> None:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            return
        self.usage.add(message.get("usage"))
        snapshot = self.stats()
        self._emit(USAGE, snapshot)
        if self.on_usage is not None:
            try:
                self.on_usage(snapshot)
            except Exception:  # observers never break the session
                logger.exception("on_usage failed for pi session {}", self.context.node_id)

    def _tool_event(self, kind: str, msg: dict[str, Any]) -> None:
        body: dict[str, Any] = {"id": msg.get("toolCallId"), "tool": msg.get("toolName")}
        if kind == "tool_execution_start":
            self.tool_calls += 1
            body["args"] = msg.get("args") if isinstance(msg.get("args"), dict) else {}
            self._emit(TOOL_CALL, {"phase": "start", **body})
        else:
            body["isError"] = bool(msg.get("isError"))
            self._emit(TOOL_CALL, {"phase": "end", **body})

    def _last_assistant(self) -> dict[str, Any] | None:
        try:
            msgs = context_messages(read_transcript(self._path).leaf_path())
        except OSError:
            return None
        return next((m for m in reversed(msgs) if m.get("role") == "assistant"), None)

    def _emit(self, type_: str, body: dict[str, Any]) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(type_, body)
        except Exception:  # observers never break the session
            logger.exception("on_event failed for pi session {} ({})", self.context.node_id, type_)
