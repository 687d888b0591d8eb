"""What the root does to its nodes: launch workers, teams, pools and sessions; retire them; talk to sessions.

`Nodes` is a component that `RootSupervisor` (root.py) constructs and owns as `root.nodes`, which callers use
directly, and the `Host` the orchestration layer holds (orchestration/host.py: the subscriptions to the nodes'
tool calls, session events and statuses are here too). It is given what it needs explicitly: the
node registry, the root as the `RpcHost` of the workers it starts (`rpc_child_spec`), the run's fixed
settings (root id, `root_node`, ledger path, the teams' backoff), and the root as a `RootState`: what the
root opens in `start()` (lifecycle, observer, control server, top supervisor) and whether it is stopping,
read at each use because they change over the root's life. Every fact about a node is in its `NodeRecord`
in the registry; the retire cause travels to the supervisor as an argument (`terminate_child(cause=)`),
never through a side table. `RootObserver` observes the root's supervisors (the top one and every team):
the lifecycle facts plus what `Nodes` keeps in the registry (team member specs, pools' sessions).

- `launch(node, parent=None)` starts an rpc worker under the root or a team; `launch_team(team_id, ...)` a
  team (a nested supervisor whose members restart with it); `retire(node_id, cause)` stops one child
  through the ladder (`RetireFailed` if anything survived: the ledger then says `node_failed{reason:
  "RETIRE_FAILED"}`, never `node_retired`); an in-pool session is disposed inside its pool instead.
- `launch_pool(pool_id, ...)` runs a pool worker (`session_worker:pool_main`, `permanent` by default);
  `launch_session(spec, pool=...)` launches an inprocess session into it (its own node, `transient` by
  default). When the pool dies the supervisor restarts it per its child spec and every session that was
  live in it is relaunched and resumes from its transcript (settled or retired sessions are not revived).
- `session_request(node_id, op, ...)` sends any `session.*` op to the worker hosting the node (a pool, or an
  rpc session worker from `launch_rpc_session(spec)`).
- `park_idle(child)`: a settled rpc worker past its idle grace gives its process back (`RpcChild.park`); input that
  meets it meanwhile waits until it is gone and is answered NO_SESSION, so the caller revives the node.
- Public calls return once the facts they caused have landed in the ledger (`lifecycle.drained()`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from legion.bus.protocol import wire_safe
from legion.ledger.nodes import validate_slug
from legion.ledger.writer import background_task
from legion.supervision.child_spec import (
    MAX_DETAIL,
    ChildHandle,
    ChildSpec,
    ChildSpecError,
    ExitReason,
    RestartType,
    RetireTimeouts,
    ShutdownMode,
)
from legion.supervision.lifecycle import START_FAILED, Lifecycle, LifecycleObserver, Listener, idle_relaunch
from legion.supervision.pool_child import POOL_ENTRY, SESSION_ENTRY, PoolSessions
from legion.supervision.registry import NodeRecord, NodeState, Registry
from legion.supervision.rpc_child import RpcChild, RpcHost, RpcNode, rpc_child_spec
from legion.supervision.supervisor import (
    AutoShutdown,
    Backoff,
    ChildAlreadyPresent,
    ChildNotFound,
    StartFailed,
    Strategy,
    Supervisor,
    SupervisorError,
    SupervisorNotRunning,
    WorkerExited,
    supervisor_spec,
)
from legion.workers.session_service import NO_SESSION
from legion.workers.session_spec import SessionSpec

if TYPE_CHECKING:
    from legion.bus.control import ControlServer

_NEW_INPUT_OPS = frozenset({"session.prompt", "session.steer", "session.follow_up"})
POOL_RESTART_WAIT = 30.0  # seconds a session launch waits for a restarting pool


ToolHandler = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any]]]  # (node id, tool, args) -> reply
SessionEventHook = Callable[[str, str, dict[str, Any]], None]  # (worker id, event name, body)


class RootState(Protocol):
    """What `Nodes` reads of its root: the resources the root opens in `start()` (None until then), whether
    it is stopping, and its monitor. Read at each use, never kept: they change over the root's life."""

    def publish(self, type: str, body: dict[str, Any]) -> None: ...

    @property
    def lifecycle(self) -> Lifecycle | None: ...

    @property
    def observer(self) -> LifecycleObserver | None: ...

    @property
    def control(self) -> ControlServer | None: ...

    @property
    def supervisor(self) -> Supervisor | None: ...

    @property
    def stopping(self) -> bool: ...


class Nodes:
    """Launching, retiring and addressing nodes: the component a `RootSupervisor` owns (see the module docstring)."""

    def __init__(self, registry: Registry, *, root: RootState, host: RpcHost, root_id: str, root_node: bool,
                 ledger_path: str | Path, backoff: Backoff | None, ledger_run: str | None = None) -> None:
        self.registry = registry
        self._root = root
        self._host = host  # what the workers it starts need of the root (spawner, hang detector, registration)
        self._root_id = root_id
        self._root_node = root_node  # False: an agent tree's run, where pools are infrastructure
        self._ledger_path = ledger_path
        self._ledger_run = ledger_run  # the run id that scopes a shared (PostgreSQL) ledger; None for a file
        self._backoff = backoff  # the teams' restart backoff (the top supervisor's)
        self._tasks: set[asyncio.Task[None]] = set()  # in the background (pools' relaunches): cancelled at close
        self.tool_handler: ToolHandler | None = None  # legion tool calls (`legion.tool` requests): `serve_tools`
        self.session_listeners: list[SessionEventHook] = []  # session events, before the pool's bookkeeping
        self._parking: dict[str, asyncio.Event] = {}  # rpc workers giving their process back: set once it is gone

    # ----- the orchestration layer's registrations (its `Host`, orchestration/host.py) ----------------
    def serve_tools(self, handler: ToolHandler) -> None:
        """Route the workers' legion tool calls (`legion.tool` requests) to `handler`: one handler per root."""
        if self.tool_handler is not None and self.tool_handler != handler:
            raise RuntimeError(f"the legion tools of {self._root_id} are already served by {self.tool_handler!r}")
        self.tool_handler = handler

    def subscribe_sessions(self, listener: SessionEventHook) -> None:
        """Call `listener(worker id, event name, body)` for every session event, in subscription order, before
        the pool's own bookkeeping (quick, never raising)."""
        self.session_listeners.append(listener)

    def subscribe_status(self, listener: Listener) -> None:
        """Call `listener(node id, status, event, data)` after every status the root writes (quick, never raising)."""
        self._lifecycle().listeners.append(listener)

    def publish(self, type: str, body: dict[str, Any]) -> None:
        """One event on the run's monitor stream (the root's; never raises)."""
        self._root.publish(type, body)

    # ----- rpc workers and teams ----------------------------------------------------------------
    async def launch(self, node: RpcNode, *, parent: str | None = None) -> RpcChild:
        """Start an rpc worker under the root (parent=None) or a running team; ready when it returns."""
        sup = self._supervisor_for(parent)
        lifecycle = self._lifecycle()
        self._check_launchable(sup, node.node_id)
        validate_slug(node.name or node.node_id)
        rec = self.registry.record(node.node_id)
        rec.launching = True
        handle: ChildHandle | None = None
        try:
            lifecycle.reserve(node.node_id, parent_id=parent or self._root_id, role=node.role, team=parent,
                              name=node.name)
            spec = rpc_child_spec(node, self._host)
            await self._forget_stopped(sup, node.node_id)
            try:
                handle = await sup.start_child(spec)
            except StartFailed as exc:
                lifecycle.failed(node.node_id, START_FAILED, detail=repr(exc.cause)[:MAX_DETAIL])
                raise
            except SupervisorError as exc:  # lost a race with stop()
                lifecycle.failed(node.node_id, START_FAILED, detail=str(exc)[:MAX_DETAIL])
                raise
            except asyncio.CancelledError:
                lifecycle.failed(node.node_id, START_FAILED, detail="launch cancelled")
                raise
        finally:
            rec.launching = False
            await self._launch_landed(node.node_id, started=handle is not None)
        if rec.kind not in ("pool", "team"):
            rec.kind = "worker"
        rec.parent, rec.spec, rec.parked = parent, spec, False
        if parent is not None:
            self._remember_member(parent, spec)
        assert isinstance(handle, RpcChild)
        return handle

    async def launch_team(
        self,
        team_id: str,
        *,
        members: Sequence[RpcNode] = (),
        parent: str | None = None,
        strategy: Strategy = "one_for_one",
        max_restarts: int = 3,
        restart_period: float = 60.0,
        restart: RestartType = "temporary",
        auto_shutdown: AutoShutdown = "never",
    ) -> Supervisor:
        """Start a team: a nested supervisor whose members restart with it (its specs are kept).

        With auto_shutdown (OTP), a `significant` member ending by itself (e.g. the team's lead
        settling) ends the team: its other members are retired with reason "auto_shutdown".
        """
        sup = self._supervisor_for(parent)
        if auto_shutdown == "never" and any(m.significant for m in members):
            raise ChildSpecError(f"team {team_id!r} has significant members; pass auto_shutdown="
                                 "'any_significant' or 'all_significant' (OTP rejects them otherwise)")
        ids = [team_id, *(m.node_id for m in members)]
        if len(set(ids)) != len(ids):
            raise ChildAlreadyPresent(f"team {team_id!r}: ids must be unique, got {ids}")
        for node_id in ids:
            self._check_launchable(sup, node_id)
        for name in [team_id, *(m.name or m.node_id for m in members)]:
            validate_slug(name)  # all names checked before the first row is written
        records = [self.registry.record(i) for i in ids]
        for rec in records:
            rec.launching = True
        team: Supervisor | None = None
        try:
            team = await self._launch_team(sup, team_id, members, parent, strategy, max_restarts, restart_period,
                                           restart, auto_shutdown)
            return team
        finally:
            for rec in records:
                rec.launching = False
            await self._launch_landed(team_id, started=team is not None)

    async def _launch_landed(self, node_id: str, *, started: bool) -> None:
        """The barrier a launch ends with (its caller sees the facts of its launch in the ledger). A cancel that
        arrives here, after the start succeeded, would leave a live node whose caller never gets it: that node
        is retired before the cancellation goes on."""
        try:
            await self._lifecycle().drained()
        except asyncio.CancelledError:
            if started:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.retire(node_id, cause="launch cancelled"))
            raise

    async def _launch_team(self, sup: Supervisor, team_id: str, members: Sequence[RpcNode], parent: str | None,
                           strategy: Strategy, max_restarts: int, restart_period: float,
                           restart: RestartType, auto_shutdown: AutoShutdown) -> Supervisor:
        lifecycle = self._lifecycle()
        lifecycle.reserve(team_id, parent_id=parent or self._root_id, role="team", team=team_id)
        team_rec = self.registry.record(team_id, "team")
        team_rec.kind = "team"
        for member in members:
            lifecycle.reserve(member.node_id, parent_id=team_id, role=member.role, team=team_id, name=member.name)
            self.registry.record(member.node_id).parent = team_id
        team_rec.members = [rpc_child_spec(m, self._host) for m in members]

        def make() -> Supervisor:
            team = Supervisor(
                team_id, strategy=strategy, max_restarts=max_restarts, restart_period=restart_period,
                children=list(team_rec.members), backoff=self._backoff, observer=self._root.observer,
                keep_stopped_specs=False, auto_shutdown=auto_shutdown,
            )  # fmt: skip
            team_rec.team = team
            return team

        await self._forget_stopped(sup, team_id)
        try:
            await sup.start_child(supervisor_spec(team_id, make, restart=restart))
        except StartFailed as exc:
            lifecycle.failed(team_id, START_FAILED, detail=repr(exc.cause)[:MAX_DETAIL])
            for member in members:  # the failing member and those never started
                if lifecycle.tree.get(member.node_id, {}).get("status") == "starting":
                    lifecycle.failed(member.node_id, START_FAILED, detail=f"team {team_id!r} failed to start")
            raise
        except SupervisorError as exc:
            lifecycle.failed(team_id, START_FAILED, detail=str(exc)[:MAX_DETAIL])
            raise
        team_rec.parent = parent
        assert team_rec.team is not None
        return team_rec.team

    async def retire(self, node_id: str, *, cause: str = "retire", force: bool = False) -> None:
        """Retire one child (worker or team) with the ladder; raises RetireFailed if something survived.

        An in-pool session is disposed inside its pool instead (its tool groups swept; the pool and
        its other sessions untouched); that raises SessionRetireFailed when it cannot be verified.
        """
        try:
            await self._retire(node_id, cause, force)
        finally:
            await self._lifecycle().drained()

    async def _retire(self, node_id: str, cause: str, force: bool) -> None:
        rec = self.registry.get(node_id)
        if rec is not None and rec.kind == "session" and rec.host is not None:
            await self._pool_book(rec.host).retire(node_id, cause)
            return
        parent = rec.parent if rec is not None else None
        sup = self._supervisor_for(parent)
        await sup.terminate_child(node_id, brutal=force, cause=cause)
        if parent is not None:
            self._forget_member(parent, node_id)

    def worker(self, node_id: str) -> RpcChild | None:
        """The live incarnation of a worker (None between exit and restart)."""
        return self.registry.handle(node_id)

    def host_of(self, node_id: str) -> RpcChild | None:
        """The live worker process of `node_id` (an rpc node, or a pool), None between exit and restart."""
        return self.registry.handle(node_id)

    def team(self, team_id: str) -> Supervisor | None:
        rec = self.registry.get(team_id)
        return rec.team if rec is not None else None

    # ----- worker-hosted sessions ---------------------------------------------------------------
    async def launch_pool(
        self,
        pool_id: str = "pool",
        *,
        parent: str | None = None,
        inprocess: dict[str, Any] | None = None,
        restart: RestartType = "permanent",
        shutdown: ShutdownMode | None = None,
        start_timeout: float = 15.0,
        log_path: str | None = None,
    ) -> RpcChild:
        """Start a pool worker (inprocess sessions) as a child of the root or a team; ready when it returns."""
        args: dict[str, Any] = {"ledgerPath": str(self._ledger_path)}
        if self._ledger_run is not None:
            args["ledgerRun"] = self._ledger_run
        if inprocess is not None:
            args["inprocess"] = dict(inprocess)
        node = RpcNode(node_id=pool_id, entry=POOL_ENTRY, args=args, restart=restart,
                       shutdown=shutdown if shutdown is not None else RetireTimeouts(), role="pool",
                       start_timeout=start_timeout, log_path=log_path)
        lifecycle = self._lifecycle()
        if not self._root_node:
            lifecycle.infra.add(pool_id)
        rec = self.registry.record(pool_id, "pool")
        previous = rec.sessions
        if previous is not None and (previous.live() or rec.handle is not None):
            raise ChildAlreadyPresent(f"pool {pool_id!r} is already running")
        rec.kind = "pool"
        # a pool launched again under an old id keeps the book of its (settled, retired) sessions
        rec.sessions = previous or PoolSessions(
            pool_id, lifecycle, lambda body, timeout: self._pool_request(pool_id, body, timeout),
            lambda: self._worker_pid(pool_id), lambda: self._worker_stopping(pool_id), self.registry)
        try:
            return await self.launch(node, parent=parent)
        except BaseException:
            if previous is None:
                rec.sessions = None
            raise

    async def launch_session(
        self,
        spec: dict[str, Any],
        *,
        pool: str = "pool",
        restart: RestartType = "transient",
        role: str | None = None,
        name: str | None = None,
        parent_id: str | None = None,
        resume: bool = False,
        reserved: bool = False,
    ) -> str:
        """Launch an inprocess session (a SessionSpec dict) into a running pool; returns started | queued.

        The node is recorded `starting` first (`reserved`: its caller wrote that row already); `running` once the
        pool started it (a queued launch turns `running` when the pool admits it). Raises SessionLaunchFailed when
        the pool refuses. `resume`: a revive of the node for new input, recorded as a resume (`PoolSessions.launch`).
        """
        SessionSpec.from_dict(spec, process_env=False)  # a bad spec is refused (SpecError names the key) before any ledger row
        node_id = str(spec["nodeId"])
        pool_rec = await self._running_pool(pool)
        assert pool_rec.sessions is not None
        if self._root.stopping:
            raise SupervisorNotRunning(f"the root is stopping; cannot launch {node_id!r}")
        if (self._root_node and node_id == self._root_id) or self.registry.busy(node_id):
            raise ChildAlreadyPresent(f"node {node_id!r} is already running; retire it first or pick another id")
        validate_slug(name or node_id)
        lifecycle = self._lifecycle()
        spec_team = spec.get("team")
        lifecycle.reserve(node_id, parent_id=parent_id or pool, role=role or str(spec.get("role") or "session"),
                          team=spec_team if isinstance(spec_team, str) else None, name=name, recorded=reserved)
        self.registry.record(node_id, "session").parent = parent_id
        try:
            return await pool_rec.sessions.launch(node_id, spec, restart, resume=resume)
        finally:
            await lifecycle.drained()

    async def _running_pool(self, pool: str) -> NodeRecord:
        """The pool's record once it runs: a launch that comes while the pool restarts (it was killed) waits for the
        new incarnation (at most POOL_RESTART_WAIT), instead of failing a node that never ran."""
        deadline = asyncio.get_running_loop().time() + POOL_RESTART_WAIT
        while True:
            rec = self.registry.get(pool)
            if rec is not None and rec.sessions is not None and rec.handle is not None:
                return rec
            if (rec is None or rec.sessions is None or self._root.stopping or not self._restarting(rec)
                    or asyncio.get_running_loop().time() > deadline):
                raise ChildNotFound(f"no running pool {pool!r}; launch_pool({pool!r}) first (or wait for its restart)")
            await asyncio.sleep(0.05)

    def _restarting(self, rec: NodeRecord) -> bool:
        """Its supervisor is about to restart it (its exit is being handled, or its restart waits or runs)."""
        try:
            sup = self._supervisor_for(rec.parent)
        except (ChildNotFound, RuntimeError):
            return False
        info = sup.child_info(rec.id)
        return sup.state == "running" and info is not None and (info.running or info.restarting)

    async def session_request(self, node_id: str, op: str, *, timeout: float = 30.0, **body: Any) -> dict[str, Any]:
        """Send a `session.*` op about one node to the worker hosting it (its pool, or its rpc worker)."""
        rec = self.registry.get(node_id)
        if rec is not None and rec.kind == "session" and rec.host is not None:
            pool = self._pool_book(rec.host)
            reopened = op in _NEW_INPUT_OPS and pool.reopening(node_id)  # before: the settle may overtake the reply
            try:
                reply = await self._pool_request(rec.host, {"op": op, "nodeId": node_id, **body}, timeout)
            except BaseException:
                if reopened:
                    pool.reopen_not_taken(node_id)
                raise
            if reopened and (not reply.get("ok") or reply.get("disposition") == "intercepted"):
                pool.reopen_not_taken(node_id)
            if reply.get("code") == NO_SESSION:
                pool.not_hosted(node_id)  # revived from its transcript by the next input, never asked again
            if reopened:
                await self._lifecycle().drained()  # the caller sees the facts its input caused
            return reply
        child = self.registry.handle(node_id)
        if child is None:
            raise ChildNotFound(f"no running session {node_id!r}")
        if child.parking:
            return await self._parked_reply(node_id, timeout)
        reopened = op in _NEW_INPUT_OPS and child.settled
        if reopened:  # from now on its process holds unfinished work (before: the settle may overtake the reply)
            child.settled = False
            self._lifecycle().resumed(node_id, reopened=True)
        try:
            reply = await self._pool_request(node_id, {"op": op, **body}, timeout)
        except BaseException:
            if reopened:
                self._rpc_not_taken(child)  # the input never reached it
            raise
        if reopened and (not reply.get("ok") or reply.get("disposition") == "intercepted"):
            self._rpc_not_taken(child)  # the input did not start a run
        if reopened:
            await self._lifecycle().drained()
        return reply

    def _rpc_not_taken(self, child: RpcChild) -> None:
        if not child.settled and self.registry.handle(child.id) is child:
            child.settled = True
            self._lifecycle().settled(child.id, "input_not_taken")

    async def launch_rpc_session(
        self,
        spec: dict[str, Any],
        *,
        parent: str | None = None,
        restart: RestartType = "transient",
        shutdown: ShutdownMode | None = None,
        role: str | None = None,
        name: str | None = None,
        log_path: str | None = None,
        resume: bool = False,
    ) -> RpcChild:
        """Start an rpc session worker (one session, its own process) under the root or a team.

        A crash restarts it (per `restart`) and the session resumes from its transcript. `resume`: a revive for
        new input, recorded as a resume (`RootObserver.child_started`).
        """
        SessionSpec.from_dict(spec, process_env=False)  # a bad spec is refused (SpecError names the key) before any ledger row
        spec = wire_safe(dict(spec))  # it travels as JSON to the fork server at every (re)start
        node = RpcNode(node_id=str(spec["nodeId"]), entry=SESSION_ENTRY, args=spec, restart=restart,
                       shutdown=shutdown if shutdown is not None else RetireTimeouts(),
                       role=role or str(spec.get("role") or "session"), name=name, log_path=log_path)
        rec = self.registry.get(node.node_id)
        if rec is not None and rec.kind == "session" and not rec.live:
            rec.kind, rec.host = "worker", None  # it moves out of its pool to its own worker
        self.registry.record(node.node_id).resuming = resume
        return await self.launch(node, parent=parent)

    # ----- settled rpc workers give their process back ------------------------------------------------
    def park_idle(self, child: RpcChild) -> None:
        """A settled rpc worker stayed idle for its grace: its process exits (a settled exit, so no restart and no
        status change; `RootObserver.settled_child_exited` parks the node) and new input relaunches it from its
        transcript, as a parked in-pool session is revived."""
        if self._root.stopping or self.registry.handle(child.id) is not child or self.pool(child.id) is not None:
            return
        self._parking[child.id] = asyncio.Event()
        self._background(child.park(), f"park:{child.id}")

    def _parked(self, node_id: str) -> None:
        """The supervisor is done with the exit of a worker that was giving its process back."""
        event = self._parking.pop(node_id, None)
        if event is not None:
            event.set()

    async def _parked_reply(self, node_id: str, timeout: float) -> dict[str, Any]:
        """Input that meets a worker giving its process back waits until it is gone, and is answered as one for a
        session its host does not hold: NO_SESSION, so the caller relaunches the node (`Orchestrator.revive`)."""
        event = self._parking.get(node_id)
        if event is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
        return {"ok": False, "code": NO_SESSION,
                "error": f"{node_id!r} settled and gave its worker process back; new input relaunches it from its "
                         "transcript"}

    async def park(self, node_id: str) -> bool:
        """Free the pool slot of a settled in-pool session without changing its status (see PoolSessions.park)."""
        rec = self.registry.get(node_id)
        if rec is None or rec.kind != "session" or rec.host is None:
            return False
        return await self._pool_book(rec.host).park(node_id)

    def hosted(self, node_id: str) -> bool:
        """The node's session lives in a worker now (a pool slot or its own process) and can take input."""
        rec = self.registry.get(node_id)
        if rec is None:
            return False
        if rec.kind == "session":
            return rec.host is not None and not rec.parked and rec.state in ("starting", "running", "settled")
        return rec.handle is not None

    def parked(self, node_id: str) -> bool:
        """The node settled and was put away (`park`, or its worker idled out): nothing of its run was cut."""
        rec = self.registry.get(node_id)
        return rec is not None and rec.parked

    # ----- statuses the orchestration layer decides (its results loop, its orphan scan, its teams) --------
    def settled_outcome(self, node_id: str, outcome: str) -> None:
        """Record the outcome of a node's run (`Lifecycle.settled_outcome`); nothing before `start`."""
        if (lifecycle := self._root.lifecycle) is not None:
            lifecycle.settled_outcome(node_id, outcome)

    def mark_blocked(self, node_id: str, *, waiting: bool, **request: Any) -> None:
        """Record the node's run waiting on an extension's dialog (`Lifecycle.blocked`): `blocked` while `waiting`,
        else (a policy answered it) still `running`; nothing before `start`."""
        if (lifecycle := self._root.lifecycle) is not None:
            lifecycle.blocked(node_id, status="blocked" if waiting else "running", **request)

    def mark_unblocked(self, node_id: str, **detail: Any) -> None:
        """The dialog was answered or expired: `running` again (`Lifecycle.unblocked`); nothing before `start`."""
        if (lifecycle := self._root.lifecycle) is not None:
            lifecycle.unblocked(node_id, **detail)

    def mark_failed(self, node_id: str, reason: str) -> None:
        """Record a node failed for an orchestration reason (`Lifecycle.failed`); nothing before `start`."""
        if (lifecycle := self._root.lifecycle) is not None:
            lifecycle.failed(node_id, reason)

    def session_state(self, node_id: str) -> NodeState | None:
        """What the root knows of an in-pool session (starting, running, settled, retired, failed)."""
        rec = self.registry.get(node_id)
        return rec.state if rec is not None and rec.kind == "session" and rec.host is not None else None

    def pool(self, pool_id: str) -> PoolSessions | None:
        rec = self.registry.get(pool_id)
        return rec.sessions if rec is not None else None

    async def _pool_request(self, worker_id: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        control = self._root.control
        if control is None:
            raise RuntimeError("RootSupervisor.start() was not called")
        child = self.registry.handle(worker_id)
        if child is None:
            raise ChildNotFound(f"worker {worker_id!r} is not running")
        # a worker that dies never answers: fail at its exit instead of at the timeout
        body = wire_safe(body)
        asking = asyncio.ensure_future(control.request(worker_id, "request", body, timeout))
        gone = asyncio.ensure_future(child.wait_exit())
        try:
            await asyncio.wait({asking, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not asking.done():
                asking.cancel()
        if not asking.done() or asking.cancelled():
            raise WorkerExited(f"worker {worker_id!r} exited before it answered {body.get('op')!r}")
        return dict(asking.result().body)

    def _pool_book(self, pool_id: str) -> PoolSessions:
        book = self.pool(pool_id)
        if book is None:
            raise ChildNotFound(f"no pool {pool_id!r}")
        return book

    def _worker_pid(self, worker_id: str) -> int | None:
        child = self.registry.handle(worker_id)
        return child.pid if child is not None else None

    def _worker_stopping(self, worker_id: str) -> bool:
        child = self.registry.handle(worker_id)
        return self._root.stopping or child is None or child.stopping

    def cancel_background(self) -> None:
        """Cancel the tasks it started in the background (pools' relaunches): the root is closing."""
        for task in list(self._tasks):
            task.cancel()

    def _background(self, coro: Any, name: str) -> None:
        task: asyncio.Task[None] = background_task(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----- helpers -----------------------------------------------------------------------------
    def _lifecycle(self) -> Lifecycle:
        lifecycle = self._root.lifecycle
        if lifecycle is None:
            raise RuntimeError("RootSupervisor.start() was not called")
        return lifecycle

    def _require_started(self) -> Supervisor:
        sup = self._root.supervisor
        if sup is None:
            raise RuntimeError("RootSupervisor.start() was not called")
        return sup

    def _supervisor_for(self, parent: str | None) -> Supervisor:
        if parent is None:
            return self._require_started()
        team = self.team(parent)
        if team is None or team.state != "running":
            raise ChildNotFound(f"no running team {parent!r}; launch_team({parent!r}) first")
        return team

    def _check_launchable(self, sup: Supervisor, node_id: str) -> None:
        """Refuse before touching the ledger: a stopping root, or an id that is live anywhere in the tree."""
        if self._root.stopping or sup.state != "running":
            raise SupervisorNotRunning(f"supervisor {sup.id!r} is {sup.state}; cannot launch {node_id!r}")
        rec = self.registry.get(node_id)
        if (self._root_node and node_id == self._root_id) or (rec is not None and (
                rec.launching or rec.handle is not None
                or (rec.kind == "team" and rec.team is not None and rec.team.state == "running"))):
            raise ChildAlreadyPresent(f"node {node_id!r} is already running; retire it first or pick another id")
        info = sup.child_info(node_id)
        if info is not None and (info.running or info.restarting):
            raise ChildAlreadyPresent(f"node {node_id!r} is already running under {sup.id!r}")

    async def _forget_stopped(self, sup: Supervisor, child_id: str) -> None:
        """A relaunch replaces a stopped child's old spec (a running one is refused by start_child)."""
        info = sup.child_info(child_id)
        if info is not None and not info.running and not info.restarting:
            await sup.delete_child(child_id)

    def _forget_member(self, team_id: str, node_id: str) -> None:
        """A member that stopped for good (settled, failed, retired) does not come back with its team."""
        rec = self.registry.get(team_id)
        if rec is not None:
            rec.members = [s for s in rec.members if s.id != node_id]

    def _remember_member(self, team_id: str, spec: ChildSpec) -> None:
        rec = self.registry.record(team_id, "team")
        rec.members = [*(s for s in rec.members if s.id != spec.id), spec]


class RootObserver(LifecycleObserver):
    """Lifecycle facts plus what the root keeps in its registry: team member specs and pools' sessions."""

    def __init__(self, lifecycle: Lifecycle, nodes: Nodes) -> None:
        super().__init__(lifecycle, nodes.registry)
        self._nodes = nodes

    def child_started(self, sup: Supervisor, child_id: str, handle: Any, *, restart: bool) -> None:
        rec = self.registry.record(child_id)
        resuming, rec.resuming = rec.resuming, False
        if resuming and isinstance(handle, RpcChild) and self._nodes.pool(child_id) is None:
            self._resumed(child_id, handle)
            return
        super().child_started(sup, child_id, handle, restart=restart)
        pool = self._nodes.pool(child_id)
        if pool is not None and pool.live():
            self._nodes._background(pool.relaunch_live(), f"relaunch:{child_id}")
        ready = getattr(handle, "ready_body", None) or {}
        if pool is None and isinstance(handle, RpcChild) and ready.get("idle"):
            # an rpc session (re)started with nothing to continue (its transcript's last run had ended; it may have
            # died before its settle was seen): idle at once, as a relaunched in-pool session is
            handle.settled = True
            outcome, detail = idle_relaunch(ready)
            self.lifecycle.settled_outcome(child_id, outcome, **detail)

    def _resumed(self, child_id: str, handle: RpcChild) -> None:
        """An rpc session a revive relaunched (docs/spec-conformance.md §2.2): node_resumed when it continues a cut
        run; idle at once, only its status restored (the input that follows writes node_resumed)."""
        rec = self.registry.record(child_id)
        rec.attempt += 1
        rec.pid = handle.pid if isinstance(handle.pid, int) else None
        rec.state, rec.after = "running", None
        ready = getattr(handle, "ready_body", None) or {}
        if ready.get("idle"):
            handle.settled = True
            outcome, detail = idle_relaunch(ready)
            self.lifecycle.restored(child_id, outcome, **detail)
        else:
            self.lifecycle.resumed(child_id, relaunched=True, pid=rec.pid, attempt=rec.attempt)

    def child_exited(self, sup: Supervisor, child_id: str, reason: ExitReason, *, restarting: bool) -> None:
        super().child_exited(sup, child_id, reason, restarting=restarting)
        self._nodes._parked(child_id)
        pool = self._nodes.pool(child_id)
        if pool is not None:
            escalated = sup.escalated_by is not None and sup.escalated_by[0] == child_id
            pool.pool_exited(reason, restarting=restarting, escalated=escalated)
        if not restarting and sup.state == "running":  # not part of an escalation: gone for good
            self._nodes._forget_member(sup.id, child_id)

    def settled_child_exited(self, sup: Supervisor, child_id: str, reason: ExitReason) -> None:
        super().settled_child_exited(sup, child_id, reason)
        self._nodes._forget_member(sup.id, child_id)  # a team's restart does not bring it back either
        self._nodes._parked(child_id)

    def child_terminated(self, sup: Supervisor, child_id: str, error: BaseException | None, *, why: str,
                         cause: str | None = None) -> None:
        super().child_terminated(sup, child_id, error, why=why, cause=cause)
        self._nodes._parked(child_id)  # stopped while it was giving its process back
        pool = self._nodes.pool(child_id)
        if pool is not None:
            pool.pool_stopped(cause or why, why=why, error=error)

