"""Lifecycle facts: `nodes.status` transitions and node events in the ledger, mirrored on the monitor.

Only the root supervisor writes lifecycle (docs/architecture.md §5). Mapping used by the supervision tree:

| supervisor fact                                | status    | ledger event                           |
|------------------------------------------------|-----------|----------------------------------------|
| node reserved / about to (re)start             | starting  | —                                      |
| child started and ready                        | running   | node_launched {pid, attempt, restart, after} |
| child exited, restart pending                  | starting  | — (the relaunch records `after`)       |
| child exited normally, not restarted           | settled   | node_settled {reason: "normal"}        |
| child exited with shutdown, not restarted      | retired   | node_retired {reason}                  |
| child exited abnormally, not restarted         | failed    | node_failed {reason, detail}           |
| supervisor stopped a child (retire, pause, …)  | retired   | node_retired {reason: cause}           |
| that stop could not be verified (RETIRE_FAILED)| failed    | node_failed {reason: "RETIRE_FAILED"}  |
| a start failed for good                        | failed    | node_failed {reason: "start_failed"}   |
| a revive (new input) relaunched it, running    | running   | node_resumed {relaunched, pid, attempt} |
| a revive relaunched it idle (input follows)    | its outcome's | — (`restored`: the input's run writes node_resumed) |
| its run waits on an extension's dialog         | blocked   | node_blocked {request, policy}         |
| that dialog was answered or expired            | running   | — (`unblocked`)                        |

`retired` never touches `phase` (a session-shutdown retire is a pause, docs/spec-conformance.md §2.10). A ledger
error never escapes: it is logged and published as a `lifecycle_error` monitor event.

Monitor events (body always carries `node_id` where one applies): `node_status` (starting),
`node_launched`, `node_settled`, `node_failed`, `node_retired` (each after its ledger write, with
`status` and the event data), `child_exited` {supervisor, reason, restarting},
`child_start_failed`, `supervisor_exited` {supervisor, reason, escalated}, `lifecycle_error`; the
root adds `node_problem` {what: hung | retire_failed | cleanup_failed, detail} and every session event under its own
name (`turn_start`, `tool_call`, `agent_settled`, …) with `node_id` = the session's node and `worker` = its host.
The snapshot state is `{"root": id, "nodes": {node_id: {"status", "parent_id", "role"}}}`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from loguru import logger

from legion.bus.protocol import CHILD_EXITED, LIFECYCLE_ERROR, NODE_PAUSED, NODE_STATUS, SUPERVISOR_EXITED
from legion.ledger.constants import (
    NODE_BLOCKED,
    NODE_FAILED,
    NODE_LAUNCHED,
    NODE_RESUMED,
    NODE_RETIRED,
    NODE_SETTLED,
)
from legion.ledger.ledger import Ledger
from legion.ledger.nodes import validate_slug
from legion.ledger.writer import LedgerWriter
from legion.procs import RETIRE_FAILED
from legion.supervision.child_spec import ChildHandle, ExitKind, ExitReason
from legion.supervision.registry import Registry
from legion.supervision.supervisor import RESTART_INTENSITY, Supervisor, SupervisorObserver

Publish = Callable[[str, dict[str, Any]], object]
Listener = Callable[[str, str, "str | None", dict[str, Any]], None]  # (node id, status, event, data)

SESSION_SHUTDOWN = "session-shutdown"
BARRIER_POLL_S = 0.5  # how often a waiter on the ledger looks whether the disk is full (then it stops waiting)
START_FAILED = "start_failed"
# docs/spec-conformance.md §2.1: the execution outcome of a settled run decides the node's status.
OUTCOME_STATUS = {"success": "settled", "failed": "failed", "truncated": "failed", "aborted": "retired",
                  "unknown": "retired"}
_STATUS_EVENT = {"settled": NODE_SETTLED, "failed": NODE_FAILED, "retired": NODE_RETIRED}


class Lifecycle:
    """Writes one node's lifecycle facts atomically (status + event in one transaction)."""

    def __init__(self, ledger: Ledger, publish: Publish | None = None, *, run_id: str | None = None,
                 writer: LedgerWriter | None = None) -> None:
        """With a `writer` (the root), every fact is committed by the ledger's writer thread and published once
        it has landed (in order); the event loop never waits on SQLite. Without one, facts are written inline."""
        self.ledger = ledger
        self.writer = writer
        self._loop: asyncio.AbstractEventLoop | None = None
        self._publish = publish
        self.run_id = run_id
        self.errors = 0
        self.tree: dict[str, dict[str, Any]] = {}  # node id -> last known status (monitor snapshots)
        self.retire_failures: list[str] = []  # nodes whose stop could not be verified (RETIRE_FAILED)
        self.listeners: list[Listener] = []  # told of every status written (the orchestrator's mirror)
        # infrastructure (pools, team supervisors of an agent tree): facts go to the monitor, not to `nodes`
        self.infra: set[str] = set()
        # facts handed to the writer and not yet landed (their `landed` not yet run), by number; `drained` waits on
        # those numbered up to its own call's, not on a no-op write of its own
        self._submitted = 0
        self._unlanded: set[int] = set()
        self._drains: list[tuple[int, asyncio.Future[None]]] = []

    def publish(self, type: str, body: dict[str, Any]) -> None:
        if self._publish is None:
            return
        try:
            self._publish(type, body)
        except Exception as exc:
            logger.error("monitor publish of {} failed: {!r}", type, exc)

    def ensure_root(self, root_id: str = "root") -> None:
        """The run's root node (depth 0) exists and is running."""
        self.tree[root_id] = {"status": "running", "parent_id": None}
        self._commit(root_id, "ensure_root", lambda led: self._ensure_root(led, root_id), lambda: None)

    def _ensure_root(self, led: Ledger, root_id: str) -> None:
        if led.get_node(root_id) is None:
            led.insert_node(id=root_id, name="root", role="root", depth=0, status="running", run_id=self.run_id)
        else:
            led.set_status(root_id, "running")

    async def drained(self) -> None:
        """Wait until every fact submitted so far has landed and been published (instant without a writer).

        A cancelled caller still waits for them before the cancellation goes on: whoever cancelled a launch reads
        its final facts right after. On a full disk it stops waiting: only freed space lands them, and the run is
        pausing."""
        if self.writer is None or not self._unlanded:
            return
        upto = self._submitted
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drains.append((upto, done))
        try:
            await self._until_landed(done)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await self._until_landed(done)
            raise

    async def _until_landed(self, done: asyncio.Future[None]) -> None:
        assert self.writer is not None
        while not done.done():
            if self.writer.disk_full is not None:
                return
            await asyncio.wait({done}, timeout=BARRIER_POLL_S)

    def _settle_drains(self) -> None:
        """Release the `drained` callers whose facts have all landed."""
        low = min(self._unlanded, default=self._submitted + 1)
        still: list[tuple[int, asyncio.Future[None]]] = []
        for upto, done in self._drains:
            if upto < low:
                if not done.done():
                    done.set_result(None)
            else:
                still.append((upto, done))
        self._drains = still

    def reserve(self, node_id: str, *, parent_id: str, role: str, name: str | None = None,
                team: str | None = None, recorded: bool = False) -> None:
        """Insert the node as `starting` (or move an existing one back to `starting`); `recorded`: its launcher
        has written that row already (the orchestrator's reservation), so only the monitor and listeners hear it.

        Unlike the other facts this one raises (the ledger's error, e.g. a name that is not a slug):
        it comes before anything is started, and a node the ledger does not know must not run.
        """
        if node_id not in self.infra:
            validate_slug(name or node_id)  # refused here, before anything is submitted or started
            # (recorded: the row exists, and a write here would only read it and set the same status)
            if not recorded:
                if self.writer is None:
                    self._reserve(self.ledger, node_id, parent_id, role, name, team)
                else:
                    self._commit(node_id, "reserve",
                                 lambda led: self._reserve(led, node_id, parent_id, role, name, team), lambda: None)
        self.tree[node_id] = {"status": "starting", "parent_id": parent_id, "role": role}
        self.publish(NODE_STATUS, {"node_id": node_id, "status": "starting", "parent_id": parent_id})
        self._tell(node_id, "starting", None, {})

    def _reserve(self, led: Ledger, node_id: str, parent_id: str, role: str, name: str | None,
                 team: str | None) -> None:
        if led.get_node(node_id) is not None:
            led.set_status(node_id, "starting")
            return
        parent = led.get_node(parent_id)
        depth = int(parent["depth"]) + 1 if parent is not None else 1
        led.insert_node(id=node_id, name=name or node_id, role=role, depth=depth, parent_id=parent_id,
                        status="starting", run_id=self.run_id, team=team)

    def starting(self, node_id: str, *, after: ExitReason | None = None) -> None:
        self._write(node_id, "starting", None, {"after": str(after)} if after else {})

    def launched(self, node_id: str, *, pid: int | None, attempt: int, restart: bool | None = None,
                 after: str | None = None) -> None:
        data: dict[str, Any] = {"pid": pid, "attempt": attempt, "restart": attempt > 1 if restart is None else restart}
        if after:
            data["after"] = after
        self._write(node_id, "running", NODE_LAUNCHED, data)

    def resumed(self, node_id: str, **detail: Any) -> None:
        """A settled node was given new input and runs again (``node_resumed``)."""
        self._write(node_id, "running", NODE_RESUMED, detail)

    def blocked(self, node_id: str, *, status: str = "blocked", **detail: Any) -> None:
        """The node's run waits on an answer to an extension's dialog (``node_blocked`` carries the request); a
        card policy that answers it at once keeps it `running` (docs/spec-conformance.md §2.1)."""
        self._write(node_id, status, NODE_BLOCKED, detail)

    def unblocked(self, node_id: str, **detail: Any) -> None:
        """The dialog it waited on was answered or expired: its run goes on (no event: `node_blocked` said it)."""
        self._write(node_id, "running", None, detail)

    def restored(self, node_id: str, outcome: str, **detail: Any) -> None:
        """A revive relaunched the node idle, its status back to its last outcome's: no event (the input that
        follows writes `node_resumed`, docs/spec-conformance.md §2.2)."""
        self._write(node_id, OUTCOME_STATUS.get(outcome, "retired"), None, {"outcome": outcome, **detail})

    def settled(self, node_id: str, reason: str = "normal") -> None:
        self._write(node_id, "settled", NODE_SETTLED, {"reason": reason})

    def settled_outcome(self, node_id: str, outcome: str, **detail: Any) -> None:
        """A run ended: success → settled, failed|truncated → failed, aborted|unknown → retired (§2.1)."""
        status = OUTCOME_STATUS.get(outcome, "retired")
        reason = "normal" if status == "settled" else outcome
        self._write(node_id, status, _STATUS_EVENT[status], {"reason": reason, "outcome": outcome, **detail})

    def failed(self, node_id: str, reason: str, **detail: Any) -> None:
        if reason == RETIRE_FAILED:
            self.retire_failures.append(node_id)
        self._write(node_id, "failed", NODE_FAILED, {"reason": reason, **detail})

    def retired(self, node_id: str, reason: str, **detail: Any) -> None:
        self._write(node_id, "retired", NODE_RETIRED, {"reason": reason, **detail})

    def root_exited(self, root_id: str, reason: ExitReason, escalated_by: tuple[str, object] | None) -> None:
        """A root that is a node records its own end: failed by an escalation (the child that exceeded the restart
        intensity), else retired with the stop's cause."""
        if reason.detail == RESTART_INTENSITY:
            self.failed(root_id, RESTART_INTENSITY, child=escalated_by[0] if escalated_by else None,
                        detail=str(escalated_by[1]) if escalated_by else None)
        else:
            self.retired(root_id, reason.detail or SESSION_SHUTDOWN)

    def _write(self, node_id: str, status: str, event: str | None, data: dict[str, Any]) -> None:
        if node_id in self.infra:
            self.tree.setdefault(node_id, {})["status"] = status
            self.publish(event or NODE_STATUS, {"node_id": node_id, "status": status, "infra": True, **data})
            return

        def write(led: Ledger) -> None:
            with led.transaction():
                led.set_status(node_id, status)
                if event is not None:
                    led.append_event(node_id, event, data)

        def landed() -> None:
            self.tree.setdefault(node_id, {})["status"] = status
            self.publish(event or NODE_STATUS, {"node_id": node_id, "status": status, **data})
            self._tell(node_id, status, event, data)

        self._commit(node_id, event or status, write, landed)

    def _commit(self, node_id: str, what: str, write: Callable[[Ledger], None], landed: Callable[[], None]) -> None:
        """Write inline (no writer) or through the writer thread; `landed` runs on the loop once it has."""
        if self.writer is None:
            if self._guard(node_id, what, lambda: write(self.ledger)):
                landed()
            return
        loop = self._loop or asyncio.get_running_loop()
        self._loop = loop
        self._submitted += 1
        number = self._submitted
        self._unlanded.add(number)

        def done(fut: Future[None]) -> None:  # on the loop, with the rest of the writer's batch
            try:
                exc = fut.exception() if not fut.cancelled() else None
                (self._landed if exc is None else self._not_landed)(node_id, what, landed, exc)
            finally:
                self._unlanded.discard(number)
                if self._drains:
                    self._settle_drains()

        try:
            self.writer.submit_then(write, done, what=f"{what} {node_id}", loop=loop)
        except BaseException:  # not queued (a closed writer): nothing will land
            self._unlanded.discard(number)
            raise

    def _landed(self, node_id: str, what: str, landed: Callable[[], None], exc: BaseException | None) -> None:
        landed()

    def _not_landed(self, node_id: str, what: str, landed: Callable[[], None], exc: BaseException | None) -> None:
        self.errors += 1
        logger.error("lifecycle {} for node {} not recorded: {!r}", what, node_id, exc)
        self.publish(LIFECYCLE_ERROR, {"node_id": node_id, "what": what, "error": repr(exc)[:500]})

    def _tell(self, node_id: str, status: str, event: str | None, data: dict[str, Any]) -> None:
        for listener in list(self.listeners):
            try:
                listener(node_id, status, event, data)
            except Exception as exc:  # a listener never breaks the lifecycle
                logger.error("lifecycle listener failed for {} → {}: {!r}", node_id, status, exc)

    def _guard(self, node_id: str, what: str, fn: Callable[[], None]) -> bool:
        try:
            fn()
            return True
        except Exception as exc:  # LedgerError, a closed connection, a full disk: never the supervisor's death
            self.errors += 1
            logger.error("lifecycle {} for node {} not recorded: {!r}", what, node_id, exc)
            self.publish(LIFECYCLE_ERROR, {"node_id": node_id, "what": what, "error": repr(exc)[:500]})
            return False


def idle_relaunch(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The outcome and status detail of a relaunch its worker found idle (the `outcome` and `ends` it reported)."""
    outcome, ends = body.get("outcome"), body.get("ends")
    detail: dict[str, Any] = {"resumed": True}
    if isinstance(ends, int) and not isinstance(ends, bool):
        detail["ends"] = ends
    return (outcome if isinstance(outcome, str) else "unknown"), detail


def _exit_detail(reason: ExitReason) -> str:
    return reason.detail or reason.kind.value


class LifecycleObserver(SupervisorObserver):
    """Turns supervisor callbacks into lifecycle facts; each child id is its node id.

    What it counts per node (attempt, pid, why its previous incarnation ended) lives in the node's record
    in `registry` (the root's, or one of its own); the cause of a stop arrives as an argument.
    """

    def __init__(self, lifecycle: Lifecycle, registry: Registry | None = None) -> None:
        self.lifecycle = lifecycle
        self.registry = registry if registry is not None else Registry()

    def child_started(self, sup: Supervisor, child_id: str, handle: ChildHandle, *, restart: bool) -> None:
        rec = self.registry.record(child_id)
        rec.attempt += 1
        pid = getattr(handle, "pid", None)
        rec.pid = pid if isinstance(pid, int) else None
        rec.state = "running"
        after, rec.after = rec.after, None
        self.lifecycle.launched(child_id, pid=rec.pid, attempt=rec.attempt, restart=restart, after=after)

    def child_exited(self, sup: Supervisor, child_id: str, reason: ExitReason, *, restarting: bool) -> None:
        self.lifecycle.publish(CHILD_EXITED, {"node_id": child_id, "supervisor": sup.id, "reason": str(reason),
                                                "restarting": restarting})
        rec = self.registry.record(child_id)
        if restarting:
            rec.after, rec.state = str(reason), "starting"
            self.lifecycle.starting(child_id, after=reason)
        elif reason.kind is ExitKind.NORMAL:
            rec.state = "settled"
            self.lifecycle.settled(child_id, _exit_detail(reason))
        elif reason.kind is ExitKind.SHUTDOWN:
            rec.state = "retired"
            self.lifecycle.retired(child_id, _exit_detail(reason))
        else:
            rec.state = "failed"
            self.lifecycle.failed(child_id, _exit_detail(reason), supervisor=sup.id)

    def settled_child_exited(self, sup: Supervisor, child_id: str, reason: ExitReason) -> None:
        """The process of a settled node ended: nothing recorded changes (its status, outcome and attempt stand);
        it is parked, and new input for it relaunches it from its transcript."""
        rec = self.registry.record(child_id)
        rec.pid, rec.parked = None, True
        self.lifecycle.publish(CHILD_EXITED, {"node_id": child_id, "supervisor": sup.id, "reason": str(reason),
                                                "restarting": False, "settled": True})

    def child_terminated(self, sup: Supervisor, child_id: str, error: BaseException | None, *, why: str,
                         cause: str | None = None) -> None:
        rec = self.registry.record(child_id)
        cause = cause or why
        if error is not None:
            survivors = getattr(error, "survivors", None)
            rec.state = "failed"
            self.lifecycle.failed(child_id, RETIRE_FAILED, cause=cause, detail=repr(error)[:500],
                                  survivors=[getattr(p, "pid", p) for p in survivors or []])
        elif why == "strategy":
            rec.state = "starting"
            self.lifecycle.starting(child_id)  # a bystander: restarted right after
        elif cause == SESSION_SHUTDOWN and self.lifecycle.tree.get(child_id, {}).get("status") in ("settled", "failed"):
            # a pause stops the worker of a session whose run had already ended: its outcome stands (as for
            # the settled sessions of a pool, which a pause leaves settled)
            self.lifecycle.publish(NODE_PAUSED, {"node_id": child_id, "status": self.lifecycle.tree[child_id]["status"]})
        else:
            rec.state = "retired"
            self.lifecycle.retired(child_id, cause)

    def child_start_failed(self, sup: Supervisor, child_id: str, error: BaseException) -> None:
        self.lifecycle.publish("child_start_failed", {"node_id": child_id, "supervisor": sup.id,
                                                      "error": repr(error)[:500]})

    def supervisor_exited(self, sup: Supervisor, reason: ExitReason) -> None:
        self.lifecycle.publish(SUPERVISOR_EXITED, {"supervisor": sup.id, "reason": str(reason),
                                                     "escalated": reason.detail == RESTART_INTENSITY})
