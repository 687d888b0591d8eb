"""SessionService: the control-channel face of the sessions hosted by one worker process.

Both the rpc worker (one session) and the pool worker (many, ``inprocess``) use it. The root talks
to it with ``request`` messages whose ``op`` is one of:

==================  ==========================================  ==========================================
op                  body                                        reply (always has ``ok``)
==================  ==========================================  ==========================================
session.launch      ``spec`` (SessionSpec dict), ``wait``        ``status``: started | queued, ``resumed``
session.prompt      ``nodeId``, ``text``                         ``disposition``: accepted|queued|intercepted
session.steer       ``nodeId``, ``text``                         ``disposition``: queued|accepted|intercepted
session.follow_up   ``nodeId``, ``text``                         ``disposition``: queued|accepted
session.withdraw    ``nodeId``, ``texts``                        ``withdrawn``: the queued texts taken back
session.abort       ``nodeId``, ``clearQueued``, ``timeoutMs``   ``outcome``: interrupted|no-turn|timeout
session.wait        ``nodeId``, ``timeoutMs``                    ``settled``, ``stopReason``, ``error``, ``outcome``
session.stats       ``nodeId`` (optional: all sessions)          ``stats``
session.retire      ``nodeId``                                   ``found``, ``survivors`` (pids)
session.list        —                                            ``sessions``: {nodeId: state}
session.admission   —                                            ``slots``, ``queued``, ``maxActive``, ``maxQueued``
session.ui_respond  ``nodeId``, ``requestId``, ``response``      ``answered`` (False: the dialog is not open)
==================  ==========================================  ==========================================

``nodeId`` may be omitted when the worker hosts exactly one session. Failures answer
``{"ok": false, "error": <what and how to fix>, "code": …}``; nothing raises into the bus.

The worker sends one-way ``event`` messages ``{"name", "nodeId", …}``: ``turn_start``,
``text_delta``, ``tool_call`` (``phase`` start|end), ``ui_request`` (``phase`` open|answered|expired: a pi
extension's dialog), ``usage``, ``empty_retry``, ``agent_settled``,
``launch_queued``, ``launch_admitted``, ``session_started``, ``launch_failed``. Legion tool calls go
to the root as ``request`` ``{"op": "legion.tool", "tool", "args", "nodeId"}`` and expect
``{"ok", "text", "details"}``. Every usage snapshot (cumulative) is also written to the ledger
(``upsert_usage``), and a working session's node row is stamped (``heartbeat``) at most every 5 s (its launch
counts as a stamp: the root wrote the row to launch it). With a ``HeldWriter`` (the rpc worker), a session that
settles before a writer was opened sends its settle's usage in its ``agent_settled`` event instead (``usage``:
the ledger's columns and ``at``), and the root records it.

Ledger writes never run on the event loop: with a ``writer`` (a ``LedgerWriter``, as both workers use)
they are queued to its thread, coalesced per node and kind (``submit_latest``: a stalled ledger holds
one pending usage row and one stamp per node, and the newest always lands), so neither the application
heartbeat to the root nor any session waits on the ledger's write lock. Without a writer (direct
callers, tests) they are written inline.

Wire safety: model output may carry strings orjson refuses (a lone UTF-16 surrogate, e.g. an emoji
split across stream chunks). Events, legion tool requests and replies that fail to encode for that
reason are repaired with ``wire_safe`` / ``valid_unicode`` from ``legion.bus.protocol``, as the
transcript writer repairs its lines (pairs joined, lone halves → U+FFFD), and sent again — never
dropped, never raised into a session.

Tool process groups (docs/architecture.md §3: the app heartbeat carries the in-flight tool stack): every tool
runs in its own process group, so a SIGKILLed worker's tools re-parent to the root and only the
root can sweep them. ``heartbeat_info()`` (given to ``WorkerRuntime.beat_with``) reports
``toolPgids`` (every live tool group of every hosted session, sorted), ``toolsInFlight``, ``sessions``
and ``lastActivityMs`` (epoch ms of the last session event); and the
moment a tool registers a new group the worker sends a ``tool_groups`` event ``{"nodeId",
"pgids"}`` (the worker's whole set), so a crash right after a tool start is covered too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from loguru import logger

from legion.bus.protocol import (
    AGENT_SETTLED,
    LAUNCH_FAILED,
    SESSION_STARTED,
    TOOL_CALL,
    TOOL_GROUPS,
    ProtocolError,
    valid_unicode,
    wire_safe,
)
from legion.codes import DUPLICATE, INTERNAL, INVALID_PARAMS, NO_SESSION, START_FAILED, UNKNOWN_OP
from legion.workers.context import SessionContext, current_tool_call
from legion.workers.engine import AgentSession
from legion.workers.fleet_gate import OtherRuns, fleet_gate
from legion.workers.held_writer import HeldWriter
from legion.workers.pool import AdmissionError, PoolLimits, SessionHost
from legion.workers.session_spec import RegistryCache, SessionSpec, SpecError, build_session
from legion.workers.transcript import Transcript

if TYPE_CHECKING:
    from legion.ledger import Ledger, LedgerWriter

SendFn = Callable[[str, dict[str, Any]], Awaitable[None]]
RequestFn = Callable[[str, dict[str, Any], float], Awaitable[dict[str, Any]]]
_MAX_ARGS_BYTES = 2000
_EVENT_QUEUE = 10_000
_HEARTBEAT_S = 5.0
_USAGE_COLUMNS = ("tokens_in", "tokens_out", "cost_usd", "unknown_cost_tokens")  # as `usage_totals` names them
_USAGE_BARRIER_S = 10.0
_LEGION_TOOL_TIMEOUT_S = 600.0


class NoSession(ValueError):
    """A request names a session this worker does not host (e.g. one its previous incarnation hosted)."""


class UsageSink(Protocol):
    def upsert_usage(self, node_id: str, tokens_in: int, tokens_out: int, cost_usd: float,
                     unknown_cost_tokens: int = 0) -> None: ...

    def usage_totals(self, node_ids: list[str] | None = None, *,
                     excluding: list[str] | None = None) -> dict[str, Any]: ...


class ClosableUsageSink(UsageSink, Protocol):
    def close(self) -> None: ...


class SessionService:
    """Routes control requests to a SessionHost and streams session events back to the root."""

    def __init__(self, *, send: SendFn | None, request: RequestFn | None, limits: PoolLimits | None = None,
                 ledger: UsageSink | None = None, writer: LedgerWriter | HeldWriter | None = None,
                 open_reader: Callable[[], ClosableUsageSink] | None = None) -> None:
        """`ledger` answers reads (the budgets' usage totals) and, without a `writer`, takes the writes.
        `open_reader` (blocking; run in a thread) opens that reader when the first session with a budget is
        launched, and `close` closes it: a worker whose sessions have no budget never opens a second connection
        (in an rpc worker, the reader's engine and SQLite connection were ~3 MB of its ~10 MB)."""
        self._send = send
        self._request = request
        self.ledger = ledger
        self.writer = writer
        self._open_reader = open_reader if ledger is None else None
        self._reader_lock = asyncio.Lock()
        self._opened_reader: ClosableUsageSink | None = None
        self.host = SessionHost(limits, on_process_event=self._process_event)
        self.registries = RegistryCache()
        self._events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue(_EVENT_QUEUE)
        self._sender: asyncio.Task[None] | None = None
        self._pending_launches: set[asyncio.Task[None]] = set()
        self._beats: dict[str, float] = {}
        self._usage_writes: dict[str, Future[None]] = {}  # node -> its newest queued usage write
        self._other_runs: OtherRuns | None = None  # the fleet gate's cached view of the project's other runs
        self._latest_usage: dict[str, dict[str, float]] = {}  # node -> its newest usage, as usage_totals names it
        self._started: dict[str, dict[str, Any]] = {}  # the last session_started body per node (the launch reply)
        self._pending_sends: set[asyncio.Future[None]] = set()
        self.last_activity_ms: int | None = None  # epoch ms of the last session event (heartbeat)
        self.dropped_events = 0
        self.repaired_frames = 0  # frames sent only after their strings were repaired (wire safety)
        # the rpc worker's one session: once it settled, and until new input, the worker sends no heartbeat (its
        # root stops watching a settled worker, and soon parks it: docs/architecture.md §3)
        self.quiet_when_settled = False
        self._quiet = False

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._sender is None and self._send is not None:
            self._sender = asyncio.get_running_loop().create_task(self._pump(), name="session-events")

    async def close(self, timeout: float = 1.0) -> None:
        """Retire every session (tool groups swept, transcripts synced), close the pooled HTTP clients
        and flush pending events."""
        for task in list(self._pending_launches):
            task.cancel()
        await self.host.close(timeout)
        reader, self._opened_reader = self._opened_reader, None
        if reader is not None:
            with contextlib.suppress(Exception):  # a reader only: nothing of ours is lost with it
                reader.close()
        try:
            await self.registries.aclose()
        except Exception as exc:  # a client that fails to close must not keep the worker from stopping
            logger.warning("closing the provider registries failed: {!r}", exc)
        if self._sender is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._events.join(), 1.0)
            self._sender.cancel()
            with contextlib.suppress(BaseException):
                await self._sender

    # ---- launch --------------------------------------------------------------------------------

    async def launch(self, spec: SessionSpec) -> tuple[AgentSession, bool]:
        """Admit and start one session (queueing if the host is full); returns it and whether it resumed."""
        node = spec.node_id
        wanted = Path(spec.transcript).resolve()
        other = self.host.transcript_user(wanted)
        if other is not None:
            raise AdmissionError(DUPLICATE, f"transcript {wanted} is already in use by session {other!r}; "
                                 "two sessions must never append to one file")
        self._beats[node] = time.monotonic()  # its launch is its first stamp: the root wrote its row to launch it
        session = await self.host.launch(node, lambda: self._sync_with_writer(self._watch_tool_groups(node, build_session(
            spec, self.registries, requester=self._legion_request if self._request else None,
            on_event=lambda t, b: self._session_event(node, t, b),
            on_usage=lambda snap: self._usage(node, snap)))))
        if hasattr(session, "turn_gate") and (spec.tree_budget is not None or spec.fleet_budget is not None):
            await self._reader()
            if self.ledger is not None:  # reads the usage every session writes each turn
                session.turn_gate = self._budget_gate(spec)
        if getattr(session, "tool_ctx", None) is None and getattr(session, "tool_pgids", None):
            self._tool_group_added(node)  # a pi session's child group exists from its start on
        resumed = session.has_history
        running = session.continue_run() if resumed else bool(spec.prompt)
        if not resumed and spec.prompt:
            await session.prompt(spec.prompt)
        started: dict[str, Any] = {"nodeId": node, "resumed": resumed, "transcript": str(session.transcript_path)}
        if not running:  # resumed with nothing to continue: idle, its outcome is its transcript's last run's
            # (and how many runs it holds that ended, counted before any new input: a root that never saw the last
            # one settle records it from this)
            from legion.workers.outcome import run_ends

            started.update(idle=True, outcome=_outcome(session), ends=run_ends(session.transcript_path))
        self._quiet = self.quiet_when_settled and not running
        self._emit(SESSION_STARTED, started)
        self._started[node] = started
        return session, resumed

    async def _reader(self) -> None:
        """Open the budgets' reader once, on first need (`open_reader`)."""
        async with self._reader_lock:
            if self.ledger is None and self._open_reader is not None:
                self.ledger = self._opened_reader = await asyncio.to_thread(self._open_reader)

    def started_info(self, node: str) -> dict[str, Any]:
        """What `session_started` said of a launch that was just made (and forget it): idle, outcome, resumed."""
        return self._started.pop(node, {})

    def _budget_gate(self, spec: SessionSpec) -> Callable[[], str | None] | None:
        """Before each model call: the run's usage totals (every session's, from the ledger) against the tree-wide
        budget, then the project's spend against the fleet-wide one (`legion.workers.fleet_gate`). Overspend is
        bounded by one in-flight turn per live session."""
        tree, fleet = spec.tree_budget, spec.fleet_budget
        if tree is None and fleet is None:
            return None
        others = None
        if fleet is not None:
            if self._other_runs is None:
                self._other_runs = OtherRuns(self.ledger, spec.context.ledger_run or "")  # type: ignore[arg-type]
            others = self._other_runs
        totals = self._run_totals
        fleet_check = fleet_gate(fleet, totals, others) if fleet is not None and others is not None else None

        def gate() -> str | None:
            refusal = tree.refusal(totals()) if tree is not None else None
            return refusal or (fleet_check() if fleet_check is not None else None)

        return gate

    def _run_totals(self) -> dict[str, Any]:
        """The run's usage totals, this worker's own sessions with their newest snapshot (landed or still queued)."""
        ledger = self.ledger
        assert ledger is not None
        mine = self._latest_usage
        # one read of the others: two (all, then mine to subtract) could straddle a write of the writer thread
        # landing between them, and count that node's old row once and its new one minus once
        totals = dict(ledger.usage_totals(excluding=list(mine)))
        for row in mine.values():
            for key in ("tokens_in", "tokens_out", "cost_usd", "unknown_cost_tokens"):
                totals[key] = (totals[key] or 0) + row[key]
        return totals

    # ---- transcript durability ------------------------------------------------------------------

    def _sync_with_writer(self, made: Any) -> Any:
        """A native session's settle-time transcript syncs go to the ledger writer: one sync per group commit
        for every transcript that settled meanwhile, off the event loop (docs/architecture.md §5, "Durability")."""
        transcript = getattr(made, "transcript", None)
        if self.writer is not None and isinstance(transcript, Transcript):
            transcript.sync_through(self._sync_later)
        return made

    def _sync_later(self, path: Path) -> bool:
        """Queue `path`'s sync with the writer's next batch (coalesced per file); False when it is closed."""
        assert self.writer is not None
        try:
            self.writer.submit_latest(("sync", str(path)), _no_write, f"transcript {path.name} durable",
                                      durable=(path,))
        except Exception as exc:  # closed (the worker is stopping): the transcript fsyncs itself
            logger.debug("transcript {} synced in place: {!r}", path, exc)
            return False
        return True

    # ---- tool process groups -------------------------------------------------------------------

    def _watch_tool_groups(self, node: str, made: Any) -> Any:
        """Make the session's tool-group set announce new groups (native sessions; a pi session's one
        group is announced when it is launched)."""
        ctx = getattr(made, "tool_ctx", None)
        pgids = getattr(ctx, "pgids", None)
        if isinstance(pgids, set) and not isinstance(pgids, _AnnouncedGroups):
            ctx.pgids = _AnnouncedGroups(pgids, lambda: self._tool_group_added(node))  # type: ignore[union-attr]
        return made

    def tool_pgids(self) -> list[int]:
        """Every live tool process group of every hosted session (a pi session's is its pi child's)."""
        found: set[int] = set()
        for session in self.host.sessions().values():
            pgids = getattr(session, "tool_pgids", None)
            if isinstance(pgids, set | frozenset):
                found.update(g for g in pgids if isinstance(g, int))
        return sorted(found)

    def heartbeat_info(self) -> dict[str, Any] | None:
        """Extra application-heartbeat fields: the in-flight tool groups and how many sessions run. Every
        session in a run also moves its node's ledger `updated_at` (at most every few seconds). None (no beat)
        while the rpc worker's session is settled (`quiet_when_settled`)."""
        if self._quiet and all(getattr(s, "state", None) != "streaming" for s in self.host.sessions().values()):
            return None
        for node, session in self.host.sessions().items():
            if getattr(session, "state", None) == "streaming":
                self._heartbeat(node)
        pgids = self.tool_pgids()
        return {"toolPgids": pgids, "toolsInFlight": len(pgids), "sessions": len(self.host.sessions()),
                "lastActivityMs": self.last_activity_ms}

    def _tool_group_added(self, node: str) -> None:
        # sent directly, not through the event queue: it must reach the root before a crash can
        if self._send is None:
            return
        body = {"name": TOOL_GROUPS, "nodeId": node, "pgids": self.tool_pgids()}
        task: asyncio.Future[None] = asyncio.ensure_future(self._send("event", body))
        self._pending_sends.add(task)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Future[None]) -> None:
        self._pending_sends.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.dropped_events += 1

    async def _launch_in_background(self, spec: SessionSpec) -> None:
        try:
            await self.launch(spec)
        except AdmissionError as exc:
            self._emit(LAUNCH_FAILED, {"nodeId": spec.node_id, "code": exc.code, "error": str(exc)})
        except Exception as exc:  # a broken spec/transcript must not kill the worker
            logger.exception("launch of {} failed", spec.node_id)
            self._emit(LAUNCH_FAILED, {"nodeId": spec.node_id, "code": START_FAILED, "error": str(exc)})

    # ---- request handling ----------------------------------------------------------------------

    async def handle_request(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer one ``request`` body; never raises."""
        op = body.get("op")
        handler = _OPS.get(op) if isinstance(op, str) else None
        if handler is None:
            return {"ok": False, "code": UNKNOWN_OP,
                    "error": f"unknown op {op!r}; supported: {', '.join(sorted(_OPS))}"}
        try:
            return wire_safe(await handler(self, body))
        except NoSession as exc:  # the root revives the session from its transcript (it is not hosted here)
            return {"ok": False, "code": NO_SESSION, "error": str(exc)}
        except (SpecError, ValueError) as exc:
            return {"ok": False, "code": INVALID_PARAMS, "error": str(exc)}
        except AdmissionError as exc:
            return {"ok": False, "code": exc.code, "error": str(exc)}
        except Exception as exc:  # one bad request must not take the worker down
            logger.exception("request {} failed", op)
            return {"ok": False, "code": INTERNAL, "error": f"{type(exc).__name__}: {exc}"}

    def _session(self, body: dict[str, Any]) -> AgentSession:
        node = body.get("nodeId")
        sessions = self.host.sessions()
        if node is None and len(sessions) == 1:
            return next(iter(sessions.values()))
        if not isinstance(node, str):
            raise ValueError("nodeId is required (a string) when the worker hosts more than one session")
        session = sessions.get(node)
        if session is None:
            raise NoSession(f"no session {node!r} in this worker; hosted: {', '.join(sorted(sessions)) or '(none)'}")
        return session

    @staticmethod
    def _text(body: dict[str, Any]) -> str:
        text = body.get("text")
        if not isinstance(text, str):
            raise ValueError("text is required and must be a string")
        return text

    async def _op_launch(self, body: dict[str, Any]) -> dict[str, Any]:
        spec = SessionSpec.from_dict(body.get("spec"))
        can_start_now = self.host.active_count < self.host.limits.max_active and self.host.queued_count == 0
        if body.get("wait", True) and can_start_now:
            _, resumed = await self.launch(spec)
            started = self._started.pop(spec.node_id, {})
            return {"ok": True, "status": "started", "resumed": resumed, **idle_info(started)}
        if self.host.queued_count >= self.host.limits.max_queued and not can_start_now:
            await self.launch(spec)  # raises the QUEUE_FULL AdmissionError with its full message
        task = asyncio.get_running_loop().create_task(self._launch_in_background(spec))
        self._pending_launches.add(task)
        task.add_done_callback(self._pending_launches.discard)
        await asyncio.sleep(0)  # let it enqueue, so launch_queued precedes the reply
        return {"ok": True, "status": "queued"}

    async def _op_prompt(self, body: dict[str, Any]) -> dict[str, Any]:
        self._quiet = False  # new input: the root watches the worker again
        return {"ok": True, "disposition": await self._session(body).prompt(self._text(body))}

    async def _op_steer(self, body: dict[str, Any]) -> dict[str, Any]:
        self._quiet = False
        return {"ok": True, "disposition": await self._session(body).steer(self._text(body))}

    async def _op_follow_up(self, body: dict[str, Any]) -> dict[str, Any]:
        self._quiet = False
        session = self._session(body)
        busy = session.state != "idle"  # a busy session queues it for the end of its run; an idle one starts one
        await session.follow_up(self._text(body))
        return {"ok": True, "disposition": "queued" if busy else "accepted"}

    async def _op_withdraw(self, body: dict[str, Any]) -> dict[str, Any]:
        texts = body.get("texts")
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ValueError("texts is required and must be a list of strings")
        return {"ok": True, "withdrawn": self._session(body).withdraw(texts)}

    async def _op_abort(self, body: dict[str, Any]) -> dict[str, Any]:
        timeout_ms = body.get("timeoutMs")
        timeout = timeout_ms / 1000 if isinstance(timeout_ms, int | float) and not isinstance(timeout_ms, bool) else None
        outcome = await self._session(body).abort(clear_queued=body.get("clearQueued", True) is not False,
                                                  timeout=timeout)
        return {"ok": True, "outcome": outcome}

    async def _op_ui_respond(self, body: dict[str, Any]) -> dict[str, Any]:
        """Answer an open extension dialog of a pi session: `{requestId, response}`; `answered` False when it is
        no longer open (answered already, or pi resolved it at its timeout)."""
        session = self._session(body)
        request_id, response = body.get("requestId"), body.get("response")
        if not isinstance(request_id, str) or not isinstance(response, dict):
            raise ValueError("requestId (a string) and response (an object) are required")
        respond = getattr(session, "respond_ui", None)
        if respond is None:
            raise ValueError(f"session {session.context.node_id!r} has no extension dialogs to answer "
                             "(only a pi session asks them)")
        return {"ok": True, "answered": await respond(request_id, response)}

    async def _op_wait(self, body: dict[str, Any]) -> dict[str, Any]:
        timeout_ms = body.get("timeoutMs", 0)
        if not isinstance(timeout_ms, int | float) or isinstance(timeout_ms, bool) or timeout_ms < 0:
            raise ValueError("timeoutMs must be a non-negative number")
        r = await self._session(body).wait_settled(timeout_ms / 1000)
        return {"ok": True, "settled": r.settled, "stopReason": r.stop_reason, "error": r.error,
                "outcome": r.outcome}

    async def _op_stats(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("nodeId") is None and len(self.host.sessions()) != 1:
            return {"ok": True, "stats": {n: s.stats() for n, s in self.host.sessions().items()}}
        return {"ok": True, "stats": self._session(body).stats()}

    async def _op_retire(self, body: dict[str, Any]) -> dict[str, Any]:
        node = body.get("nodeId")
        if not isinstance(node, str):
            raise ValueError("nodeId is required (a string)")
        r = await self.host.retire(node)
        return {"ok": True, "found": r.found, "survivors": [p.pid for p in r.survivors], "wasQueued": r.was_queued}

    async def _op_list(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, "sessions": {n: s.state for n, s in self.host.sessions().items()},
                "active": self.host.active_count, "queued": self.host.queued_count}

    async def _op_admission(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"ok": True, **self.host.admission()}

    # ---- outbound ------------------------------------------------------------------------------

    async def _legion_request(self, tool: str, args: dict[str, Any], ctx: SessionContext) -> dict[str, Any]:
        assert self._request is not None
        timeout = _LEGION_TOOL_TIMEOUT_S
        if isinstance(args.get("timeoutMs"), int):
            timeout = max(timeout, args["timeoutMs"] / 1000 + 30)
        body = {"op": "legion.tool", "tool": tool, "args": args, "nodeId": ctx.node_id,
                "callId": current_tool_call.get()}
        await self._usage_landed(ctx.node_id)
        try:
            try:
                reply = await self._request("request", body, timeout)
            except ProtocolError as exc:
                if exc.reason != "unencodable":
                    raise
                self.repaired_frames += 1
                reply = await self._request("request", valid_unicode(body), timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return {"ok": False, "text": f"{tool}: the root supervisor did not answer ({type(exc).__name__}: {exc})"}
        return reply if isinstance(reply, dict) else {"ok": False, "text": f"{tool}: malformed reply from the root"}

    def _session_event(self, node: str, type_: str, body: dict[str, Any]) -> None:
        self.last_activity_ms = _now_ms()
        if type_ == TOOL_CALL and "args" in body:  # one name end to end; only the arguments are capped here
            args = wire_safe(body["args"])
            try:
                size = len(orjson.dumps(args, default=str))
            except orjson.JSONEncodeError:  # e.g. an integer beyond 64 bits: the transcript has it
                args, size = {"unencodable": repr(args)[:200]}, 0
            body = {**body, "args": args if size <= _MAX_ARGS_BYTES else {"truncated": size}}
        session = self.host.get(node) if type_ == AGENT_SETTLED else None
        if type_ == AGENT_SETTLED:
            self._quiet = self.quiet_when_settled
            if session is not None and self._carried(node, session):
                # its usage rides the settle, which is also its stamp (the root writes the node's status)
                self._emit(type_, {"nodeId": node, **body, "usage": {**self._latest_usage[node], "at": _now_ms()}})
                return
        self._emit(type_, {"nodeId": node, **body})
        self._heartbeat(node)  # after the emit: the beat is written once this event has left (see there)
        if session is not None:
            self._write_usage(node, session.stats())

    def _carried(self, node: str, session: AgentSession) -> bool:
        """An rpc worker that never opened its ledger writer hands the settle's usage (and the transcript's sync, and
        a held stamp) to its `agent_settled` event: the root records it with the round (`HeldWriter`)."""
        if not isinstance(self.writer, HeldWriter):
            return False
        if not self.writer.carry([("usage", node), ("beat", node), ("sync", str(session.transcript_path))]):
            return False
        self._note_usage(node, session.stats())
        return True

    @property
    def _writes_ledger(self) -> bool:
        return self.writer is not None or self.ledger is not None

    def _heartbeat(self, node: str) -> None:
        """The node's ledger `updated_at` moves while it works, at most every few seconds.

        docs/architecture.md §5."""
        if self.writer is None and not hasattr(self.ledger, "heartbeat"):
            return
        now = time.monotonic()
        if now - self._beats.get(node, -_HEARTBEAT_S) < _HEARTBEAT_S:
            return
        self._beats[node] = now
        if self.writer is not None:
            self._queue_write(("beat", node), f"heartbeat {node}", lambda led: led.heartbeat(node))
            return
        try:  # why later: an inline write must not hold back the event it came with (a first `turn_start`)
            asyncio.get_running_loop().call_soon(self._write_beat, node)
        except RuntimeError:  # no running loop (a direct caller): write now
            self._write_beat(node)

    def _write_beat(self, node: str) -> None:
        try:
            self.ledger.heartbeat(node)  # type: ignore[union-attr]  # (checked in `_heartbeat`)
        except Exception as exc:  # a node unknown to the ledger (tests): the next beat retries
            logger.debug("ledger heartbeat of {} not written: {!r}", node, exc)

    def _usage(self, node: str, snapshot: dict[str, Any]) -> None:
        self._write_usage(node, snapshot)

    def _write_usage(self, node: str, snap: dict[str, Any]) -> None:
        """Write a (cumulative) usage snapshot: every one, so the ledger always ends at the transcript's total."""
        if not self._writes_ledger:
            return
        row = self._note_usage(node, snap)
        if self.writer is not None:
            future = self._queue_write(("usage", node), f"usage {node}", lambda led: led.upsert_usage(*row))
            if future is not None:
                self._usage_writes[node] = future
                with contextlib.suppress(RuntimeError):  # no running loop (a direct caller): nothing to prune
                    loop = asyncio.get_running_loop()
                    future.add_done_callback(lambda f: _call_soon(loop, self._usage_landed_now, node, f))
            return
        try:
            self.ledger.upsert_usage(*row)  # type: ignore[union-attr]
        except Exception as exc:  # usage bookkeeping never breaks a session
            logger.warning("usage for {} not written to the ledger: {!r}", node, exc)

    def _note_usage(self, node: str, snap: dict[str, Any]) -> tuple[str, int, int, float, int]:
        """The snapshot as a usage row, kept as the node's newest (`_latest_usage`)."""
        row = (node, int(snap["input"]) + int(snap["cacheRead"]) + int(snap["cacheWrite"]), int(snap["output"]),
               float(snap["costUsd"]), int(snap.get("unknownCostTokens") or 0))
        self._latest_usage[node] = dict(zip(_USAGE_COLUMNS, row[1:], strict=True))
        return row

    def _usage_landed_now(self, node: str, future: Future[None]) -> None:
        """The node's newest usage is in the ledger: the tree gate reads it there again (so the per-call work of
        the gate grows with the writes in flight, not with every session this worker ever hosted)."""
        if self._usage_writes.get(node) is future and not future.cancelled() and future.exception() is None:
            del self._usage_writes[node]
            self._latest_usage.pop(node, None)

    def _queue_write(self, key: tuple[str, str], what: str, fn: Callable[[Ledger], None]) -> Future[None] | None:
        """Hand a write to the writer thread (never blocks); a newer one of the same key replaces it while queued."""
        assert self.writer is not None
        try:
            future = self.writer.submit_latest(key, fn, what)
        except Exception as exc:  # closed (the worker is stopping): the transcript keeps the usage
            logger.warning("ledger write {} not queued: {!r}", what, exc)
            return None
        future.add_done_callback(_log_failed_write)
        return future

    async def _usage_landed(self, node: str) -> None:
        """Wait (bounded) until the node's newest usage is in the ledger: the root reads it when it answers a
        legion tool call (the tree budget's `spent`). A stalled ledger delays the call, never fails it."""
        future = self._usage_writes.get(node)
        if future is None or future.done() or (self.writer is not None and self.writer.disk_full):
            return  # a full disk: only freed space ends the wait, and the root answers the call at once
        if self.writer is not None:
            self.writer.hurry()  # this call waits on it: the writer's batch stops gathering
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), _USAGE_BARRIER_S)

    def _process_event(self, type_: str, body: dict[str, Any]) -> None:
        self._emit(type_, body)

    def _emit(self, name: str, body: dict[str, Any]) -> None:
        if self._send is None:
            return
        try:
            self._events.put_nowait((name, body))
        except asyncio.QueueFull:
            self.dropped_events += 1

    async def _pump(self) -> None:
        assert self._send is not None
        while True:
            name, body = await self._events.get()
            try:
                try:
                    await self._send("event", {"name": name, **body})
                except ProtocolError as exc:
                    if exc.reason != "unencodable":
                        raise
                    self.repaired_frames += 1
                    await self._send("event", valid_unicode({"name": name, **body}))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the root may be briefly unreachable: count, keep going
                self.dropped_events += 1
                logger.debug("event {} not sent: {!r}", name, exc)
            finally:
                self._events.task_done()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    """From the writer thread: run `fn` on the worker's loop, unless that loop is already closed (stopping)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


def _no_write(_led: Ledger) -> None:
    """The op of a transcript sync: its file is synced with the batch (`durable`), it writes no row."""


def _log_failed_write(future: Future[None]) -> None:
    """A queued ledger write failed for good (e.g. a node the ledger does not know): log it (writer thread)."""
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None:
        logger.warning("a session's ledger write failed: {!r}", exc)


IDLE_INFO = ("idle", "outcome", "ends")  # what a launch that found nothing to continue says of the session


def idle_info(started: dict[str, Any]) -> dict[str, Any]:
    """The idle relaunch's facts of a `session_started` body, for a launch reply or a worker's ready."""
    return {k: started[k] for k in IDLE_INFO if k in started}


def _outcome(session: AgentSession) -> str:
    """The outcome of the session's last run, from its transcript."""
    own = getattr(session, "outcome", None)
    if callable(own):
        return str(own())
    from legion.workers.outcome import derive_outcome

    return derive_outcome(session.transcript_path)


class _AnnouncedGroups(set[int]):
    """A tool-group set that calls back when a new group is added (bash registers each one)."""

    def __init__(self, initial: set[int], on_add: Callable[[], None]) -> None:
        super().__init__(initial)
        self._on_add = on_add

    def add(self, pgid: int) -> None:
        fresh = pgid not in self
        super().add(pgid)
        if fresh:
            try:
                self._on_add()
            except Exception:  # announcing is best effort; the heartbeat reports the group anyway
                logger.exception("announcing tool group {} failed", pgid)


_OPS: dict[str, Callable[[SessionService, dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "session.launch": SessionService._op_launch, "session.prompt": SessionService._op_prompt,
    "session.steer": SessionService._op_steer, "session.follow_up": SessionService._op_follow_up,
    "session.withdraw": SessionService._op_withdraw, "session.abort": SessionService._op_abort, "session.wait": SessionService._op_wait,
    "session.stats": SessionService._op_stats, "session.retire": SessionService._op_retire,
    "session.list": SessionService._op_list, "session.admission": SessionService._op_admission,
    "session.ui_respond": SessionService._op_ui_respond,
}
