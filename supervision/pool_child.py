"""In-pool sessions as supervised nodes: the root side of the `inprocess` pool worker.

docs/architecture.md §2–§3.

The pool worker (`legion.workers.session_worker:pool_main`) is an ordinary `RpcChild`, `permanent` by
default, under the root or a team. Its sessions are asyncio tasks inside it, launched with the
`session.launch` op; each is still its own ledger node with its own restart type (`transient` by
default). `PoolSessions` is the root's book of one pool's sessions: their specs, states and lifecycle
facts.

| fact                                                  | session node                                  |
|-------------------------------------------------------|-----------------------------------------------|
| launch requested                                      | starting (reserved by the root)               |
| `session.launch` answered `started` / `session_started` | running, node_launched {pid, attempt, restart} |
| `agent_settled` event (not while the pool is stopped) | settled, node_settled (not revived while settled) |
| a revive's relaunch (`launch(resume=True)`) started  | running, node_resumed {relaunched}; idle at once: its status restored, no event |
| new input to a settled session (`session_request`)    | running again, node_resumed {reopened}, live again (settled again, node_settled {reason: input_not_taken}, when it did not start a run) |
| `launch_failed` event / launch refused                | failed, node_failed {reason: start_failed}    |
| retired (`session.retire` op)                         | retired, node_retired {reason: cause}         |
| pool exited, pool restarting                          | starting (transient/permanent) — relaunched into the new pool incarnation, resuming from its transcript; temporary → failed {reason: pool_exited} |
| pool past its supervisor's restart intensity          | failed {reason: restart_intensity, pool, detail} |
| pool exited for good otherwise                        | failed {reason: pool_exited, detail}          |
| pool stopped (retire, pause)                          | retired {reason: cause}                       |
| pool stop not verified (RETIRE_FAILED)                | failed {reason: RETIRE_FAILED, pool, cause}   |

Only sessions that were live (starting or running) when the pool died are relaunched; a settled,
retired or failed session keeps its status and is parked: new input for it (a notice, a mail, a steer)
revives it from its transcript (`Orchestrator.revive`), and a pool that answers NO_SESSION for a session
the root still believed hosted gets it parked and revived the same way, never asked again in a loop. A relaunch sends the original spec: the worker finds the
transcript non-empty and resumes it (marked restart note, the first prompt not re-sent). The pool's
tool process groups are swept by its `RpcChild` before the supervisor restarts it, so a relaunched
session never races its previous incarnation's tools.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from loguru import logger

from legion.bus.protocol import AGENT_SETTLED, LAUNCH_FAILED, SESSION_STARTED
from legion.codes import ERROR, NO_REPLY
from legion.ledger.constants import LIVE_STATUSES
from legion.supervision.child_spec import MAX_DETAIL, ExitReason, RestartType, should_restart
from legion.supervision.lifecycle import RETIRE_FAILED, START_FAILED, Lifecycle, idle_relaunch
from legion.supervision.registry import NodeRecord, NodeState, Registry
from legion.supervision.supervisor import RESTART_INTENSITY, WorkerExited

POOL_ENTRY = "legion.workers.session_worker:pool_main"
SESSION_ENTRY = "legion.workers.session_worker:main"
POOL_EXITED = "pool_exited"
RELAUNCHING = "relaunching"  # launch status when the pool died under the launch and restarts
LAUNCH_TIMEOUT = 30.0  # a launch with a free slot answers within the worker's 15 s start timeout
RETIRE_TIMEOUT = 15.0  # the worker's dispose (5 s) plus the tool-group sweep
RELAUNCH_CONCURRENCY = 8  # session relaunches in flight at once into a restarted pool

PoolRequest = Callable[[dict[str, Any], float], Awaitable[dict[str, Any]]]


class SessionLaunchFailed(RuntimeError):
    """The pool refused or failed a session launch; `code` is the worker's code (QUEUE_FULL, …)."""

    def __init__(self, node_id: str, code: str, message: str) -> None:
        super().__init__(f"session {node_id!r} not launched ({code}): {message}")
        self.node_id = node_id
        self.code = code


class SessionRetireFailed(RuntimeError):
    """An in-pool session retire could not be verified (the pool did not answer, or tools survived)."""


class PoolSessions:
    """The sessions of one pool node; every method writes its lifecycle facts and never raises on events.

    Each session is a `NodeRecord` (kind "session", `host` = this pool) in the root's registry: the one
    record of that node."""

    def __init__(self, pool_id: str, lifecycle: Lifecycle, request: PoolRequest,
                 pool_pid: Callable[[], int | None], pool_stopping: Callable[[], bool],
                 registry: Registry | None = None) -> None:
        self.pool_id = pool_id
        self.lifecycle = lifecycle
        self._request = request
        self._pool_pid = pool_pid
        self._pool_stopping = pool_stopping
        self.registry = registry if registry is not None else Registry()

    @property
    def sessions(self) -> dict[str, NodeRecord]:
        """This pool's sessions by node id (a view of the registry)."""
        return {r.id: r for r in self.registry.hosted_by(self.pool_id)}

    def session(self, node_id: str) -> NodeRecord | None:
        """One of this pool's sessions, found by id (not by a pass over every record: a settle parks its node)."""
        rec = self.registry.get(node_id)
        return rec if rec is not None and rec.kind == "session" and rec.host == self.pool_id else None

    def live(self) -> list[NodeRecord]:
        return [s for s in self.registry.hosted_by(self.pool_id) if s.state in LIVE_STATUSES]

    def state(self, node_id: str) -> NodeState | None:
        s = self.registry.get(node_id)
        return s.state if s is not None and s.kind == "session" and s.host == self.pool_id else None

    # ----- launch ------------------------------------------------------------------------------
    async def launch(self, node_id: str, spec: dict[str, Any], restart: RestartType, *, resume: bool = False) -> str:
        """First launch of a reserved (starting) node; returns started | queued (| relaunching when the pool
        died under the launch and the session follows it into the restarted pool) or raises SessionLaunchFailed.
        `resume`: a revive for new input, recorded as a resume (see the module docstring)."""
        session = self.registry.record(node_id, "session")  # launched again: it resumes its transcript
        session.kind, session.host, session.session_spec, session.restart = "session", self.pool_id, dict(spec), restart
        session.state, session.restart_pending, session.after, session.handle = "starting", False, None, None
        session.parked, session.resuming = False, resume
        return await self._launch(session)

    async def _launch(self, session: NodeRecord) -> str:
        session.attempt += 1
        attempt = session.attempt
        try:
            reply = await self._request({"op": "session.launch", "spec": session.session_spec, "wait": True},
                                        LAUNCH_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if (session.attempt != attempt or session.restart_pending or session.state != "starting"
                    or isinstance(exc, WorkerExited)):
                # the pool died under the launch: its exit (relaunch, fail) decides what happens next, whether
                # that exit was processed before this reply or comes after it
                logger.warning("launch of {} into pool {} got no answer: {!r}", session.id, self.pool_id, exc)
                return RELAUNCHING if session.state in LIVE_STATUSES else session.state
            self._fail(session, START_FAILED, code=NO_REPLY, detail=repr(exc)[:MAX_DETAIL])
            raise SessionLaunchFailed(session.id, NO_REPLY, f"pool {self.pool_id!r} did not answer: "
                                      f"{exc}") from exc
        if session.state == "retired" and reply.get("ok"):
            await self._dispose_retired(session)  # retired while its (re)launch was in flight
            return "retired"
        if session.attempt != attempt or session.state != "starting":
            return str(reply.get("status", "superseded"))  # settled meanwhile, or relaunched again
        if not reply.get("ok"):
            code = str(reply.get("code", ERROR))
            error = str(reply.get("error", reply))[:MAX_DETAIL]
            self._fail(session, START_FAILED, code=code, detail=error)
            raise SessionLaunchFailed(session.id, code, error)
        status = str(reply.get("status"))
        if status == "started":
            self._started(session, reply)
        return status

    async def _dispose_retired(self, session: NodeRecord) -> None:
        try:
            await self._request({"op": "session.retire", "nodeId": session.id}, RETIRE_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the pool is gone (nothing left to dispose) or will sweep it when it stops
            logger.warning("disposing retired session {} in pool {} failed: {!r}", session.id, self.pool_id, exc)

    async def relaunch_live(self) -> None:
        """Relaunch into the new pool incarnation every session whose previous incarnation died with the pool."""
        pending = [s for s in self.sessions.values() if s.state == "starting" and s.restart_pending]
        if not pending:
            return
        # a few at a time: the new pool rebuilds each session from its transcript on its event loop, and a storm of
        # them at once could starve its heartbeat (a pool declared hung is one more restart)
        gate = asyncio.Semaphore(RELAUNCH_CONCURRENCY)
        incarnation = self._pool_pid()

        async def relaunch(session: NodeRecord) -> str:
            async with gate:
                if self._pool_pid() != incarnation or session.state != "starting" or not session.restart_pending:
                    return "superseded"  # the pool died again meanwhile (its next incarnation relaunches it)
                return await self._launch(session)

        results = await asyncio.gather(*(relaunch(s) for s in pending), return_exceptions=True)
        for session, result in zip(pending, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, SessionLaunchFailed):
                logger.error("relaunch of {} failed: {!r}", session.id, result)

    # ----- events from the pool worker ---------------------------------------------------------
    def on_event(self, name: str, body: dict[str, Any]) -> None:
        """A session event from the pool: session_started, agent_settled, launch_failed."""
        node = body.get("nodeId")
        session = self.registry.get(node) if isinstance(node, str) else None
        if session is None or session.kind != "session" or session.host != self.pool_id:
            return
        if name == SESSION_STARTED and session.state == "starting":
            self._started(session, body)
        elif name == AGENT_SETTLED and session.state in LIVE_STATUSES and not self._pool_stopping():
            # (a pool being stopped aborts its sessions' turns: that is the retire, not a settle)
            if session.state == "starting":
                self._running(session)  # its settle overtook the launch reply: it did run
            session.state = "settled"  # idle in the pool, whatever the outcome; the status follows the outcome
            outcome = body.get("outcome")
            self.lifecycle.settled_outcome(session.id, outcome if isinstance(outcome, str) else "unknown")
        elif name == LAUNCH_FAILED and session.state == "starting" and not self._pool_stopping():
            # (a pool being stopped fails its queued launches with CLOSED: the stop decides their fate)
            self._fail(session, START_FAILED, code=str(body.get("code", ERROR)),
                       detail=str(body.get("error", ""))[:MAX_DETAIL])

    def _started(self, session: NodeRecord, body: dict[str, Any]) -> None:
        """The pool started the session: running, or (a relaunch with nothing to continue) idle at once."""
        if session.resuming and body.get("idle"):
            session.resuming, session.restart_pending, session.after = False, False, None
            session.state, session.pid = "settled", self._pool_pid()
            outcome, detail = idle_relaunch(body)
            self.lifecycle.restored(session.id, outcome, **detail)
            return
        self._running(session)
        self._idle_after_resume(session, body)

    def _idle_after_resume(self, session: NodeRecord, body: dict[str, Any]) -> None:
        """A relaunch that found nothing to continue (its transcript's last run had ended) is idle at once."""
        if body.get("idle") and session.state == "running":
            session.state = "settled"
            outcome, detail = idle_relaunch(body)
            self.lifecycle.settled_outcome(session.id, outcome, **detail)

    def reopening(self, node_id: str) -> bool:
        """New input (prompt, steer, follow-up) is about to go to a settled session: it is live again from
        now on (a pool crash revives it), its node `running` with `node_resumed` — before the request is
        sent, because the settle of the run it starts may overtake the reply. Returns whether it reopened."""
        session = self.session(node_id)
        if session is None or session.state != "settled" or session.parked:
            return False
        session.state = "running"
        self.lifecycle.resumed(node_id, reopened=True)
        return True

    def reopen_not_taken(self, node_id: str) -> None:
        """The input did not start a run (refused, intercepted, unanswered): the session is settled again."""
        session = self.session(node_id)
        if session is None or session.state != "running":
            return
        session.state = "settled"
        self.lifecycle.settled(node_id, "input_not_taken")

    def not_hosted(self, node_id: str) -> None:
        """The pool answered that it does not host this session (NO_SESSION): whatever the root believed, it is
        not there, so it is parked and the next input revives it from its transcript. A session the root
        believed live is not touched here: its pool's restart relaunches it."""
        session = self.session(node_id)
        if session is not None and session.state == "settled" and not session.parked:
            logger.warning("session {} is not hosted in pool {}: parked, revived by its next input", node_id,
                           self.pool_id)
            session.parked = True

    # ----- retire ------------------------------------------------------------------------------
    async def retire(self, node_id: str, cause: str) -> None:
        """Dispose one session inside the pool (its tool groups swept); the pool and its other sessions stay."""
        session = self.session(node_id)
        if session is None:
            raise KeyError(node_id)
        previous = session.state
        session.state = "retired"  # from now on no event or relaunch revives it
        try:
            reply = await self._request({"op": "session.retire", "nodeId": node_id}, RETIRE_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self._pool_pid() is None:  # no pool process: nothing of the session can be alive in it
                self.lifecycle.retired(node_id, cause, previous=previous)
                return
            self.lifecycle.failed(node_id, RETIRE_FAILED, cause=cause, detail=repr(exc)[:MAX_DETAIL])
            raise SessionRetireFailed(f"session {node_id!r}: pool {self.pool_id!r} did not confirm the retire: "
                                      f"{exc}") from exc
        survivors = reply.get("survivors") or []
        if not reply.get("ok") or survivors:
            detail = str(reply.get("error", ""))[:MAX_DETAIL]
            self.lifecycle.failed(node_id, RETIRE_FAILED, cause=cause, survivors=survivors, detail=detail)
            raise SessionRetireFailed(f"session {node_id!r}: retire not verified (survivors {survivors}) {detail}")
        self.lifecycle.retired(node_id, cause)

    async def park(self, node_id: str) -> bool:
        """Dispose a settled session to free its pool slot, keeping its status (settled, failed…): it is not
        retired, only not hosted; a relaunch resumes it from its transcript. False when it was not parked."""
        session = self.session(node_id)
        if session is None or session.state != "settled" or session.parked:
            return False
        session.parked = True  # from now on new input goes through a relaunch
        try:
            reply = await self._request({"op": "session.retire", "nodeId": node_id}, RETIRE_TIMEOUT)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the pool is gone or busy: the session stays where it is
            logger.warning("parking {} in pool {} failed: {!r}", node_id, self.pool_id, exc)
            session.parked = self._pool_pid() is None
            return False
        if not reply.get("ok"):
            session.parked = False
            return False
        return True

    # ----- the pool's own fate -----------------------------------------------------------------
    def pool_exited(self, reason: ExitReason, *, restarting: bool, escalated: bool) -> None:
        """The pool process ended (crash, kill, hang); decide each live session's fate."""
        self._unhost_settled()
        for session in self.live():
            if restarting:
                self._await_relaunch(session, reason)
            elif escalated:
                self._fail(session, RESTART_INTENSITY, pool=self.pool_id, detail=str(reason))
            else:
                self._fail(session, POOL_EXITED, pool=self.pool_id, detail=str(reason))

    def _unhost_settled(self) -> None:
        """The pool process is gone, and with it every settled session it hosted: each is parked (its status
        kept), so that new input for it revives it from its transcript instead of asking a pool that does not
        host it (README "How it works", Supervision: a settled session's process is a cache)."""
        for session in self.registry.hosted_by(self.pool_id):
            if session.state == "settled" and not session.parked:
                session.parked = True

    def pool_stopped(self, cause: str, *, why: str, error: BaseException | None = None) -> None:
        """The pool's supervisor stopped it: a bystander restart, an escalation, or a retire/pause."""
        if error is None:  # (an unverified stop may have left the process, and its sessions, alive)
            self._unhost_settled()
        for session in self.live():
            if error is not None:  # the pool's retire was not verified: neither is its sessions'
                self._fail(session, RETIRE_FAILED, pool=self.pool_id, cause=cause, detail=repr(error)[:MAX_DETAIL])
            elif why == "strategy":
                self._await_relaunch(session, ExitReason.shutdown(why))
            elif why == RESTART_INTENSITY:
                self._fail(session, RESTART_INTENSITY, pool=self.pool_id, detail=cause)
            else:
                session.state = "retired"
                self.lifecycle.retired(session.id, cause)

    def _await_relaunch(self, session: NodeRecord, reason: ExitReason) -> None:
        # from the session's side its host vanished under it: always an abnormal exit
        if not should_restart(session.restart, ExitReason.abnormal(str(reason))):
            self._fail(session, POOL_EXITED, pool=self.pool_id, detail=str(reason))
            return
        session.state = "starting"
        session.restart_pending = True
        session.after = f"pool {self.pool_id}: {reason.detail or reason}"
        self.lifecycle.starting(session.id, after=ExitReason.abnormal(session.after))

    # ----- facts -------------------------------------------------------------------------------
    def _running(self, session: NodeRecord) -> None:
        session.state = "running"
        restart = session.restart_pending
        session.pid = self._pool_pid()
        if session.resuming:  # a revive: its relaunch continues a cut run, or its settle overtook the reply
            session.resuming = False
            self.lifecycle.resumed(session.id, relaunched=True, pid=session.pid, attempt=session.attempt)
        else:
            self.lifecycle.launched(session.id, pid=session.pid, attempt=session.attempt, restart=restart,
                                    after=session.after if restart else None)
        session.restart_pending = False
        session.after = None

    def _fail(self, session: NodeRecord, reason: str, **detail: Any) -> None:
        session.state = "failed"
        session.restart_pending = False
        self.lifecycle.failed(session.id, reason, **detail)
