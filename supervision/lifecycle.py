"""Lifecycle facts: `nodes.status` transitions and node events in the ledger, mirrored on the monitor.

Only the root supervisor writes lifecycle (DESIGN §5). Mapping used by the supervision tree:

| supervisor fact                                | status    | ledger event                           |
|------------------------------------------------|-----------|----------------------------------------|
| node reserved / about to (re)start             | starting  | —                                      |
| child started and ready                        | running   | node_launched {pid, attempt, restart, after} |
| child exited, restart pending                  | starting  | — (the relaunch records `after`)       |
| child exited normally, not restarted           | settled   | node_settled {reason: "normal"}        |
| child exited with shutdown, not restarted      | retired   | node_retired {reason}                  |
| child exited abnormally, not restarted         | failed    | node_failed {reason, detail}           |
| supervisor stopped a child (retire, pause, …)  | retired   | node_retired {reason: cause}           |
| that stop could not be verified (RETIRE_FAILED)| failed    | node_failed {reason: "retire_failed"}  |
| a start failed for good                        | failed    | node_failed {reason: "start_failed"}   |

`retired` never touches `phase` (a session-shutdown retire is a pause, SEED-SPEC §2.10). A ledger
error never escapes: it is logged and published as a `lifecycle_error` monitor event.

Monitor events (body always carries `node_id` where one applies): `node_status` (starting),
`node_launched`, `node_settled`, `node_failed`, `node_retired` (each after its ledger write, with
`status` and the event data), `child_exited` {supervisor, reason, restarting},
`child_start_failed`, `supervisor_exited` {supervisor, reason, escalated}, `lifecycle_error`; the
root adds `node_problem` {what: hung | retire_failed | cleanup_failed, detail} and `worker_event`.
The snapshot state is `{"root": id, "nodes": {node_id: {"status", "parent_id", "role"}}}`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loguru import logger

from legion.ledger.ledger import Ledger
from legion.procs import RETIRE_FAILED
from legion.supervision.child_spec import ChildHandle, ExitKind, ExitReason
from legion.supervision.supervisor import RESTART_INTENSITY, Supervisor, SupervisorObserver

Publish = Callable[[str, dict[str, Any]], object]

SESSION_SHUTDOWN = "session-shutdown"
START_FAILED = "start_failed"


class Lifecycle:
    """Writes one node's lifecycle facts atomically (status + event in one transaction)."""

    def __init__(self, ledger: Ledger, publish: Publish | None = None, *, run_id: str | None = None) -> None:
        self.ledger = ledger
        self._publish = publish
        self.run_id = run_id
        self.errors = 0
        self.tree: dict[str, dict[str, Any]] = {}  # node id -> last known status (monitor snapshots)

    def publish(self, type: str, body: dict[str, Any]) -> None:
        if self._publish is None:
            return
        try:
            self._publish(type, body)
        except Exception as exc:
            logger.error("monitor publish of {} failed: {!r}", type, exc)

    def ensure_root(self, root_id: str = "root") -> None:
        """The run's root node (depth 0) exists and is running."""
        self._guard(root_id, "ensure_root", lambda: self._ensure_root(root_id))

    def _ensure_root(self, root_id: str) -> None:
        self.tree[root_id] = {"status": "running", "parent_id": None}
        if self.ledger.get_node(root_id) is None:
            self.ledger.insert_node(id=root_id, name="root", role="root", depth=0, status="running",
                                    run_id=self.run_id)
        else:
            self.ledger.set_status(root_id, "running")

    def reserve(self, node_id: str, *, parent_id: str, role: str, name: str | None = None,
                team: str | None = None) -> None:
        """Insert the node as `starting` (or move an existing one back to `starting`).

        Unlike the other facts this one raises (the ledger's error, e.g. a name that is not a slug):
        it comes before anything is started, and a node the ledger does not know must not run.
        """
        self._reserve(node_id, parent_id, role, name, team)
        self.tree[node_id] = {"status": "starting", "parent_id": parent_id, "role": role}
        self.publish("node_status", {"node_id": node_id, "status": "starting", "parent_id": parent_id})

    def _reserve(self, node_id: str, parent_id: str, role: str, name: str | None, team: str | None) -> None:
        if self.ledger.get_node(node_id) is not None:
            self.ledger.set_status(node_id, "starting")
            return
        parent = self.ledger.get_node(parent_id)
        depth = int(parent["depth"]) + 1 if parent is not None else 1
        self.ledger.insert_node(id=node_id, name=name or node_id, role=role, depth=depth, parent_id=parent_id,
                                status="starting", run_id=self.run_id, team=team)

    def starting(self, node_id: str, *, after: ExitReason | None = None) -> None:
        self._write(node_id, "starting", None, {"after": str(after)} if after else {})

    def launched(self, node_id: str, *, pid: int | None, attempt: int, restart: bool | None = None,
                 after: str | None = None) -> None:
        data: dict[str, Any] = {"pid": pid, "attempt": attempt, "restart": attempt > 1 if restart is None else restart}
        if after:
            data["after"] = after
        self._write(node_id, "running", "node_launched", data)

    def resumed(self, node_id: str, **detail: Any) -> None:
        """A settled node was given new input and runs again (``node_resumed``)."""
        self._write(node_id, "running", "node_resumed", detail)

    def settled(self, node_id: str, reason: str = "normal") -> None:
        self._write(node_id, "settled", "node_settled", {"reason": reason})

    def failed(self, node_id: str, reason: str, **detail: Any) -> None:
        self._write(node_id, "failed", "node_failed", {"reason": reason, **detail})

    def retired(self, node_id: str, reason: str, **detail: Any) -> None:
        self._write(node_id, "retired", "node_retired", {"reason": reason, **detail})

    def _write(self, node_id: str, status: str, event: str | None, data: dict[str, Any]) -> None:
        def write() -> None:
            with self.ledger.transaction():
                self.ledger.set_status(node_id, status)
                if event is not None:
                    self.ledger.append_event(node_id, event, data)

        ok = self._guard(node_id, event or status, write)
        if ok:
            self.tree.setdefault(node_id, {})["status"] = status
            self.publish(event or "node_status", {"node_id": node_id, "status": status, **data})

    def _guard(self, node_id: str, what: str, fn: Callable[[], None]) -> bool:
        try:
            fn()
            return True
        except Exception as exc:  # LedgerError, a closed connection, a full disk: never the supervisor's death
            self.errors += 1
            logger.error("lifecycle {} for node {} not recorded: {!r}", what, node_id, exc)
            self.publish("lifecycle_error", {"node_id": node_id, "what": what, "error": repr(exc)[:500]})
            return False


def _exit_detail(reason: ExitReason) -> str:
    return reason.detail or reason.kind.value


class LifecycleObserver(SupervisorObserver):
    """Turns supervisor callbacks into lifecycle facts; each child id is its node id.

    `causes` holds the retire cause a caller announced before stopping a child (retire, pause);
    `attempts` counts starts per node (node_launched.attempt).
    """

    def __init__(self, lifecycle: Lifecycle) -> None:
        self.lifecycle = lifecycle
        self.causes: dict[str, str] = {}
        self.attempts: dict[str, int] = {}
        self._after: dict[str, str] = {}
        self.pids: dict[str, int | None] = {}

    def child_started(self, sup: Supervisor, child_id: str, handle: ChildHandle, *, restart: bool) -> None:
        attempt = self.attempts.get(child_id, 0) + 1
        self.attempts[child_id] = attempt
        pid = getattr(handle, "pid", None)
        self.pids[child_id] = pid if isinstance(pid, int) else None
        self.lifecycle.launched(child_id, pid=self.pids[child_id], attempt=attempt, restart=restart,
                                after=self._after.pop(child_id, None))

    def child_exited(self, sup: Supervisor, child_id: str, reason: ExitReason, *, restarting: bool) -> None:
        self.lifecycle.publish("child_exited", {"node_id": child_id, "supervisor": sup.id, "reason": str(reason),
                                                "restarting": restarting})
        if restarting:
            self._after[child_id] = str(reason)
            self.lifecycle.starting(child_id, after=reason)
        elif reason.kind is ExitKind.NORMAL:
            self.lifecycle.settled(child_id, _exit_detail(reason))
        elif reason.kind is ExitKind.SHUTDOWN:
            self.lifecycle.retired(child_id, _exit_detail(reason))
        else:
            self.lifecycle.failed(child_id, _exit_detail(reason), supervisor=sup.id)

    def child_terminated(self, sup: Supervisor, child_id: str, error: BaseException | None, *, why: str) -> None:
        cause = self.causes.pop(child_id, None) or why
        if error is not None:
            survivors = getattr(error, "survivors", None)
            self.lifecycle.failed(child_id, RETIRE_FAILED, cause=cause, detail=repr(error)[:500],
                                  survivors=[getattr(p, "pid", p) for p in survivors or []])
        elif why == "strategy":
            self.lifecycle.starting(child_id)  # a bystander: restarted right after
        else:
            self.lifecycle.retired(child_id, cause)

    def child_start_failed(self, sup: Supervisor, child_id: str, error: BaseException) -> None:
        self.lifecycle.publish("child_start_failed", {"node_id": child_id, "supervisor": sup.id,
                                                      "error": repr(error)[:500]})

    def supervisor_exited(self, sup: Supervisor, reason: ExitReason) -> None:
        self.lifecycle.publish("supervisor_exited", {"supervisor": sup.id, "reason": str(reason),
                                                     "escalated": reason.detail == RESTART_INTENSITY})
