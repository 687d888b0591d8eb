"""The root supervisor: one asyncio object that owns a run (DESIGN §2–§3).

It owns the run directory (0700), the control ROUTER (`ipc://<run_dir>/ctl.sock` unless told
otherwise), the monitor PUB + snapshot endpoint, the `WorkerSpawner` (fork server; the root becomes a
child subreaper), the hang detector, a ledger connection and the top `Supervisor` of the tree.
Teams are nested supervisors; rpc workers are `RpcChild` handles (see rpc_child.py).

- `launch(node, parent=None)` starts an rpc worker under the root or a team;
  `launch_team(team_id, ...)` starts a team supervisor; `retire(node_id, cause)` stops one child
  through the ladder and raises `RetireFailed` if anything survived (the ledger then says
  `node_failed{reason: "retire_failed"}`, never `node_retired`).
- `stop()` is the session-shutdown **pause**: every child is retired with cause
  `session-shutdown` (status `retired`, phase untouched), then the root closes its resources.
- If the top supervisor exceeds its restart intensity, the root node fails with
  `restart_intensity`, its children are shut down, and `wait_exit()` returns.
- Nothing a worker or the network sends can crash it: the bus drops malformed frames, and
  `_on_message` validates bodies and never raises.

Worker-hosted sessions (pool_child.py): `launch_pool(pool_id, ...)` runs a pool worker
(`session_worker:pool_main`, `permanent` by default) as a child; `launch_session(spec, pool=...)`
launches an inprocess session into it (its own node, `transient` by default) and remembers its spec;
when the pool dies the supervisor restarts it per its child spec and every session that was live in
it is relaunched and resumes from its transcript (settled or retired sessions are not revived).
`retire(session_id)` disposes one in-pool session (`session.retire`) without touching the pool;
`session_request(node_id, op, ...)` sends any `session.*` op to the worker hosting the node (a pool,
or an rpc session worker launched with `launch(RpcNode(entry=SESSION_ENTRY, args=spec))`).
Every worker's tool process groups (heartbeat `toolPgids`, `tool_groups` events) are handed to its
`RpcChild`, which sweeps them after an abnormal exit before any restart.

Interface (INTERFACES.md: `RootSupervisor(run_dir, ledger_path, ...)`): `ledger_path` defaults to
`<run_dir>/legion.db`; keyword options root_id, run_id, endpoint (a tcp:// control endpoint needs
`curve`, and workers spawned here only speak ipc), monitor_tcp + curve (a remote read-only monitor;
refused without curve), strategy, max_restarts, restart_period, backoff, heartbeat_interval,
hang_misses, preload, monitor. Methods: start, stop(cause, force), wait_exit,
install_signal_handlers, launch(RpcNode, parent), launch_team(...), retire(node_id, cause, force),
worker(node_id), team(team_id), launch_pool(...), launch_session(...), session_request(...),
session_state(node_id), pool(pool_id), launch_rpc_session(spec, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from loguru import logger

from legion.bus.control import ControlServer, control_endpoint
from legion.bus.monitor import MonitorPublisher
from legion.bus.protocol import Message, wire_safe
from legion.bus.security import CurveServerConfig, ensure_private_dir
from legion.ledger import open_ledger
from legion.ledger.ledger import Ledger
from legion.ledger.nodes import validate_slug
from legion.ledger.writer import LedgerWriter
from legion.supervision.child_spec import (
    ChildSpec,
    ChildSpecError,
    ExitReason,
    RestartType,
    Shutdown,
    ShutdownMode,
)
from legion.supervision.hang import HangDetector
from legion.supervision.lifecycle import SESSION_SHUTDOWN, START_FAILED, Lifecycle, LifecycleObserver
from legion.supervision.pool_child import POOL_ENTRY, SESSION_ENTRY, PoolSessions, SessionState
from legion.supervision.rpc_child import RpcChild, RpcNode, rpc_child_spec
from legion.supervision.spawn import DEFAULT_PRELOAD, WorkerSpawner
from legion.supervision.supervisor import (
    RESTART_INTENSITY,
    AutoShutdown,
    Backoff,
    ChildAlreadyPresent,
    ChildNotFound,
    StartFailed,
    Strategy,
    Supervisor,
    SupervisorError,
    SupervisorNotRunning,
    supervisor_spec,
)
from legion.workers.session_spec import SessionSpec

ROOT_LOCK = "root.lock"


ToolHandler = Callable[[str, str, dict[str, Any]], Awaitable[dict[str, Any]]]  # (node id, tool, args) -> reply
SessionEventHook = Callable[[str, str, dict[str, Any]], None]  # (worker id, event name, body)


class RunDirBusy(RuntimeError):
    """Another live root supervisor owns this run directory."""


_NEW_INPUT_OPS = frozenset({"session.prompt", "session.steer", "session.follow_up"})
_LOG_LEVELS = frozenset({"TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL"})
_MAX_TEXT = 2000


class RootSupervisor:
    """Owns one run: bus endpoints, fork server, ledger connection and the supervision tree."""

    def __init__(
        self,
        run_dir: str | Path,
        ledger_path: str | Path | None = None,
        *,
        root_id: str = "root",
        run_id: str | None = None,
        endpoint: str | None = None,
        strategy: Strategy = "one_for_one",
        max_restarts: int = 3,
        restart_period: float = 60.0,
        backoff: Backoff | None = None,
        heartbeat_interval: float = 1.0,
        hang_misses: int = 3,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        monitor: bool = True,
        monitor_tcp: tuple[str, str] | None = None,
        curve: CurveServerConfig | None = None,
        root_node: bool = True,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.ledger_path = Path(ledger_path) if ledger_path is not None else self.run_dir / "legion.db"
        self.root_id = root_id
        # root_node=False: an agent tree's run — the supervisor itself is no node and pools are infrastructure
        # (the root agent session is the node at depth 0, launched by the orchestrator)
        self.root_node = root_node
        self.tool_handler: ToolHandler | None = None  # legion tool calls (`legion.tool` requests)
        self.session_event: SessionEventHook | None = None  # session events, after the pool's bookkeeping
        self.run_id = run_id
        self._endpoint = endpoint
        self.strategy: Strategy = strategy
        self.max_restarts = max_restarts
        self.restart_period = restart_period
        self.backoff = backoff
        self.heartbeat_interval = heartbeat_interval
        self.hang_misses = hang_misses
        self.preload = tuple(preload)
        self.want_monitor = monitor
        self.monitor_tcp = monitor_tcp  # (PUB, snapshot) tcp:// endpoints; CurveZMQ required
        self.curve = curve
        self.control_endpoint: str | None = None
        self.ledger: Ledger | None = None  # the root's reads; its writes go through `writer`
        self.writer: LedgerWriter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.control: ControlServer | None = None
        self.monitor: MonitorPublisher | None = None
        self.hang = HangDetector(self._last_seen, interval=heartbeat_interval, misses=hang_misses)
        self.lifecycle: Lifecycle | None = None
        self.observer: LifecycleObserver | None = None
        self.supervisor: Supervisor | None = None
        self._spawner: WorkerSpawner | None = None
        self._workers: dict[str, RpcChild] = {}
        self._teams: dict[str, Supervisor] = {}
        self._team_specs: dict[str, list[ChildSpec]] = {}
        self._parent_of: dict[str, str | None] = {}
        self._launching: set[str] = set()
        self._pools: dict[str, PoolSessions] = {}
        self._session_pool: dict[str, str] = {}  # in-pool session node id -> pool node id
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock_fd: int | None = None
        self._watch: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._stopping = False
        self._signal_stop: asyncio.Future[ExitReason] | None = None
        self.unknown_frames = 0
        self.bad_bodies = 0

    # ----- RpcHost -----------------------------------------------------------------------------
    @property
    def spawner(self) -> WorkerSpawner:
        if self._spawner is None:
            raise RuntimeError("RootSupervisor.start() was not called")
        return self._spawner

    def register(self, child: RpcChild) -> None:
        self._workers[child.id] = child
        if self.control is not None:  # frames count as this worker's only from this incarnation's identity
            self.control.admit(child.id, child.identity)

    def unregister(self, child: RpcChild) -> None:
        worker_id = child.id
        if self._workers.get(worker_id) is child:
            del self._workers[worker_id]
            if self.control is not None:
                self.control.forget(worker_id)

    def protected_pids(self) -> set[int]:
        """Live workers and the fork server: a dead worker's tool sweep never touches or reaches through them."""
        pids = {c.pid for c in self._workers.values() if c.pid is not None}
        zygote = self._spawner.zygote_pid if self._spawner is not None else None
        return pids | ({zygote} if zygote else set())

    def child_problem(self, child: RpcChild, what: str, detail: str) -> None:
        logger.warning("node {}: {} ({})", child.id, what, detail)
        self._publish("node_problem", {"node_id": child.id, "what": what, "detail": detail[:_MAX_TEXT]})

    # ----- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Open everything the run needs and start the (empty) top supervisor."""
        self._loop = asyncio.get_running_loop()
        try:
            ensure_private_dir(self.run_dir)
            self._lock_run_dir()
            self.ledger = open_ledger(self.ledger_path)
            self.writer = LedgerWriter(self.ledger_path, on_stall=self._ledger_stall)
            self.lifecycle = Lifecycle(self.ledger, self._publish, run_id=self.run_id, writer=self.writer)
            self.observer = _RootObserver(self.lifecycle, self)
            self.control = ControlServer(self._endpoint or control_endpoint(self.run_dir), on_message=self._on_message,
                                         curve=self.curve if (self._endpoint or "").startswith("tcp://") else None,
                                         admission=True)
            self.control_endpoint = await self.control.start()
            if self.want_monitor:
                tcp_pub, tcp_snap = self.monitor_tcp or (None, None)
                self.monitor = MonitorPublisher(self.run_dir, provider=self._snapshot, tcp_endpoint=tcp_pub,
                                                tcp_snapshot_endpoint=tcp_snap, curve=self.curve)
                await self.monitor.start()
            self._spawner = WorkerSpawner(self.control_endpoint, preload=self.preload)
            await asyncio.to_thread(self._spawner.start)
            self.hang.start()
            if self.root_node:
                self.lifecycle.ensure_root(self.root_id)
            self.supervisor = Supervisor(
                self.root_id, strategy=self.strategy, max_restarts=self.max_restarts,
                restart_period=self.restart_period, backoff=self.backoff, observer=self.observer,
                keep_stopped_specs=False,
            )  # fmt: skip
            await self.supervisor.start()
        except BaseException:
            await self._close_resources()
            raise
        self._watch = asyncio.create_task(self._watch_supervisor(), name="root-supervisor")
        logger.info("root supervisor up: run {} control {}", self.run_dir, self.control_endpoint)

    def install_signal_handlers(self, signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM)) -> None:
        """SIGINT/SIGTERM pause the run (`stop()`, cause session-shutdown), as DESIGN §3 says."""
        loop = asyncio.get_running_loop()
        for sig in signals:
            loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: int) -> None:
        if self._stopping or self.supervisor is None:
            return
        logger.info("signal {}: pausing the run (session-shutdown)", signal.Signals(sig).name)
        self._signal_stop = asyncio.ensure_future(self.stop())

    async def wait_exit(self) -> ExitReason:
        """Wait until the root has stopped (pause or escalation) and closed its resources."""
        await self._closed.wait()
        assert self.supervisor is not None and self.supervisor.exit_reason is not None
        return self.supervisor.exit_reason

    async def stop(self, *, cause: str = SESSION_SHUTDOWN, force: bool = False) -> ExitReason:
        """Pause the run: retire every child (cause `session-shutdown` by default), then close."""
        sup = self._require_started()
        self._stopping = True
        if self.observer is not None:
            for node_id in self._all_children(sup):
                self.observer.causes.setdefault(node_id, cause)
        reason = await sup.stop(ExitReason.shutdown(cause), brutal=force)
        if self._watch is not None:
            await asyncio.shield(self._watch)
        return reason

    async def _watch_supervisor(self) -> None:
        sup = self._require_started()
        reason = await sup.wait_exit()
        await sup.stop()  # returns at once, after any start still in flight has settled
        assert self.lifecycle is not None
        if not self.root_node:
            pass
        elif reason.detail == RESTART_INTENSITY:
            by = sup.escalated_by
            self.lifecycle.failed(self.root_id, RESTART_INTENSITY, child=by[0] if by else None,
                                  detail=str(by[1]) if by else None)
        else:
            self.lifecycle.retired(self.root_id, reason.detail or SESSION_SHUTDOWN)
        await self._close_resources()

    async def _close_resources(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self.hang.close()
        if self._spawner is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._spawner.close)
        for closer in (self.control, self.monitor):
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer.close()
        if self.writer is not None:  # drains what is queued: nothing the run recorded is lost on a clean close
            with contextlib.suppress(Exception):
                if not await asyncio.to_thread(self.writer.close, 30.0):
                    logger.error("ledger writes still queued after 30 s were not recorded (the ledger is locked)")
        if self.ledger is not None:
            with contextlib.suppress(Exception):
                self.ledger.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
        self._closed.set()

    def _lock_run_dir(self) -> None:
        """One root per run: an ipc bind would silently take over another root's sockets."""
        path = self.run_dir / ROOT_LOCK
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunDirBusy(
                f"run directory {self.run_dir} is owned by another root supervisor (pid {owner}); "
                "stop it first (`legion stop`) or use another run directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    # ----- launching and retiring ---------------------------------------------------------------
    async def launch(self, node: RpcNode, *, parent: str | None = None) -> RpcChild:
        """Start an rpc worker under the root (parent=None) or a running team; ready when it returns."""
        sup = self._supervisor_for(parent)
        assert self.lifecycle is not None
        self._check_launchable(sup, node.node_id)
        validate_slug(node.name or node.node_id)
        self._launching.add(node.node_id)
        try:
            self.lifecycle.reserve(node.node_id, parent_id=parent or self.root_id, role=node.role, team=parent,
                                   name=node.name)
            spec = rpc_child_spec(node, self)
            await self._forget_stopped(sup, node.node_id)
            try:
                handle = await sup.start_child(spec)
            except StartFailed as exc:
                self.lifecycle.failed(node.node_id, START_FAILED, detail=repr(exc.cause)[:_MAX_TEXT])
                raise
            except SupervisorError as exc:  # lost a race with stop()
                self.lifecycle.failed(node.node_id, START_FAILED, detail=str(exc)[:_MAX_TEXT])
                raise
            except asyncio.CancelledError:
                self.lifecycle.failed(node.node_id, START_FAILED, detail="launch cancelled")
                raise
        finally:
            self._launching.discard(node.node_id)
            await self.lifecycle.drained()  # the caller sees the facts of its launch in the ledger
        self._parent_of[node.node_id] = parent
        if parent is not None:
            self._remember_team_spec(parent, spec)
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
        assert self.lifecycle is not None
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
        self._launching.update(ids)
        try:
            return await self._launch_team(sup, team_id, members, parent, strategy, max_restarts, restart_period,
                                           restart, auto_shutdown)
        finally:
            self._launching.difference_update(ids)
            await self.lifecycle.drained()

    async def _launch_team(self, sup: Supervisor, team_id: str, members: Sequence[RpcNode], parent: str | None,
                           strategy: Strategy, max_restarts: int, restart_period: float,
                           restart: RestartType, auto_shutdown: AutoShutdown) -> Supervisor:
        assert self.lifecycle is not None
        self.lifecycle.reserve(team_id, parent_id=parent or self.root_id, role="team", team=team_id)
        for member in members:
            self.lifecycle.reserve(member.node_id, parent_id=team_id, role=member.role, team=team_id,
                                   name=member.name)
            self._parent_of[member.node_id] = team_id
        self._team_specs[team_id] = [rpc_child_spec(m, self) for m in members]

        def make() -> Supervisor:
            team = Supervisor(
                team_id, strategy=strategy, max_restarts=max_restarts, restart_period=restart_period,
                children=list(self._team_specs[team_id]), backoff=self.backoff, observer=self.observer,
                keep_stopped_specs=False, auto_shutdown=auto_shutdown,
            )  # fmt: skip
            self._teams[team_id] = team
            return team

        await self._forget_stopped(sup, team_id)
        try:
            await sup.start_child(supervisor_spec(team_id, make, restart=restart))
        except StartFailed as exc:
            self.lifecycle.failed(team_id, START_FAILED, detail=repr(exc.cause)[:_MAX_TEXT])
            for member in members:  # the failing member and those never started
                if self.lifecycle.tree.get(member.node_id, {}).get("status") == "starting":
                    self.lifecycle.failed(member.node_id, START_FAILED, detail=f"team {team_id!r} failed to start")
            raise
        except SupervisorError as exc:
            self.lifecycle.failed(team_id, START_FAILED, detail=str(exc)[:_MAX_TEXT])
            raise
        self._parent_of[team_id] = parent
        return self._teams[team_id]

    async def retire(self, node_id: str, *, cause: str = "retire", force: bool = False) -> None:
        """Retire one child (worker or team) with the ladder; raises RetireFailed if something survived.

        An in-pool session is disposed inside its pool instead (its tool groups swept; the pool and
        its other sessions untouched); that raises SessionRetireFailed when it cannot be verified.
        """
        try:
            await self._retire(node_id, cause, force)
        finally:
            assert self.lifecycle is not None
            await self.lifecycle.drained()

    async def _retire(self, node_id: str, cause: str, force: bool) -> None:
        pool_id = self._session_pool.get(node_id)
        if pool_id is not None:
            try:
                await self._pools[pool_id].retire(node_id, cause)
            except KeyError:
                raise ChildNotFound(f"no session {node_id!r} in pool {pool_id!r}") from None
            return
        parent = self._parent_of.get(node_id)
        sup = self._supervisor_for(parent)
        assert self.observer is not None
        if node_id in self._teams:
            for member in self._all_children(self._teams[node_id]):
                self.observer.causes.setdefault(member, cause)
        self.observer.causes[node_id] = cause
        try:
            await sup.terminate_child(node_id, brutal=force)
        finally:
            self.observer.causes.pop(node_id, None)
        if parent is not None:
            self._team_specs[parent] = [s for s in self._team_specs.get(parent, []) if s.id != node_id]

    def worker(self, node_id: str) -> RpcChild | None:
        """The live incarnation of a worker (None between exit and restart)."""
        return self._workers.get(node_id)

    def team(self, team_id: str) -> Supervisor | None:
        return self._teams.get(team_id)

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
        args: dict[str, Any] = {"ledgerPath": str(self.ledger_path)}
        if inprocess is not None:
            args["inprocess"] = dict(inprocess)
        node = RpcNode(node_id=pool_id, entry=POOL_ENTRY, args=args, restart=restart,
                       shutdown=shutdown if shutdown is not None else Shutdown(), role="pool",
                       start_timeout=start_timeout, log_path=log_path)
        assert self.lifecycle is not None
        if not self.root_node:
            self.lifecycle.infra.add(pool_id)
        previous = self._pools.get(pool_id)
        if previous is not None and (previous.live() or self.worker(pool_id) is not None):
            raise ChildAlreadyPresent(f"pool {pool_id!r} is already running")
        # a pool launched again under an old id keeps the book of its (settled, retired) sessions
        self._pools[pool_id] = previous or PoolSessions(
            pool_id, self.lifecycle, lambda body, timeout: self._pool_request(pool_id, body, timeout),
            lambda: self._worker_pid(pool_id), lambda: self._worker_stopping(pool_id))
        try:
            return await self.launch(node, parent=parent)
        except BaseException:
            if previous is None:
                self._pools.pop(pool_id, None)
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
    ) -> str:
        """Launch an inprocess session (a SessionSpec dict) into a running pool; returns started | queued.

        The node is recorded `starting` first; `running` once the pool started it (a queued launch
        turns `running` when the pool admits it). Raises SessionLaunchFailed when the pool refuses.
        """
        SessionSpec.from_dict(spec)  # a bad spec is refused (SpecError names the key) before any ledger row
        node_id = str(spec["nodeId"])
        sessions = self._pools.get(pool)
        if sessions is None or self.worker(pool) is None:
            raise ChildNotFound(f"no running pool {pool!r}; launch_pool({pool!r}) first (or wait for its restart)")
        if self._stopping:
            raise SupervisorNotRunning(f"the root is stopping; cannot launch {node_id!r}")
        if node_id in self._workers or node_id in self._launching or (self.root_node and node_id == self.root_id) or any(
            p.state(node_id) in ("starting", "running") for p in self._pools.values()
        ) or node_id in self._teams:
            raise ChildAlreadyPresent(f"node {node_id!r} is already running; retire it first or pick another id")
        validate_slug(name or node_id)
        assert self.lifecycle is not None
        spec_team = spec.get("team")
        self.lifecycle.reserve(node_id, parent_id=parent_id or pool, role=role or str(spec.get("role") or "session"),
                               team=spec_team if isinstance(spec_team, str) else None, name=name)
        old_pool = self._session_pool.get(node_id)
        if old_pool is not None and old_pool != pool:
            self._pools[old_pool].sessions.pop(node_id, None)
        self._session_pool[node_id] = pool
        try:
            return await sessions.launch(node_id, spec, restart)
        finally:
            await self.lifecycle.drained()

    async def session_request(self, node_id: str, op: str, *, timeout: float = 30.0, **body: Any) -> dict[str, Any]:
        """Send a `session.*` op about one node to the worker hosting it (its pool, or its rpc worker)."""
        pool_id = self._session_pool.get(node_id)
        if pool_id is not None:
            pool = self._pools[pool_id]
            reopened = op in _NEW_INPUT_OPS and pool.reopening(node_id)  # before: the settle may overtake the reply
            try:
                reply = await self._pool_request(pool_id, {"op": op, "nodeId": node_id, **body}, timeout)
            except BaseException:
                if reopened:
                    pool.reopen_not_taken(node_id)
                raise
            if reopened and (not reply.get("ok") or reply.get("disposition") == "intercepted"):
                pool.reopen_not_taken(node_id)
            if reopened and self.lifecycle is not None:
                await self.lifecycle.drained()  # the caller sees the facts its input caused
            return reply
        if node_id not in self._workers:
            raise ChildNotFound(f"no running session {node_id!r}")
        return await self._pool_request(node_id, {"op": op, **body}, timeout)

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
    ) -> RpcChild:
        """Start an rpc session worker (one session, its own process) under the root or a team.

        A crash restarts it (per `restart`) and the session resumes from its transcript.
        """
        SessionSpec.from_dict(spec)  # a bad spec is refused (SpecError names the key) before any ledger row
        spec = wire_safe(dict(spec))  # it travels as JSON to the fork server at every (re)start
        node = RpcNode(node_id=str(spec["nodeId"]), entry=SESSION_ENTRY, args=spec, restart=restart,
                       shutdown=shutdown if shutdown is not None else Shutdown(),
                       role=role or str(spec.get("role") or "session"), name=name, log_path=log_path)
        return await self.launch(node, parent=parent)

    def session_state(self, node_id: str) -> SessionState | None:
        """What the root knows of an in-pool session (starting, running, settled, retired, failed)."""
        pool_id = self._session_pool.get(node_id)
        return self._pools[pool_id].state(node_id) if pool_id is not None else None

    def pool(self, pool_id: str) -> PoolSessions | None:
        return self._pools.get(pool_id)

    async def _pool_request(self, worker_id: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        if self.control is None:
            raise RuntimeError("RootSupervisor.start() was not called")
        child = self._workers.get(worker_id)
        if child is None:
            raise ChildNotFound(f"worker {worker_id!r} is not running")
        # a worker that dies never answers: fail at its exit instead of at the timeout
        body = wire_safe(body)
        asking = asyncio.ensure_future(self.control.request(worker_id, "request", body, timeout))
        gone = asyncio.ensure_future(child.wait_exit())
        try:
            await asyncio.wait({asking, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not asking.done():
                asking.cancel()
        if not asking.done() or asking.cancelled():
            raise ChildNotFound(f"worker {worker_id!r} exited before it answered {body.get('op')!r}")
        return dict(asking.result().body)

    def _worker_pid(self, worker_id: str) -> int | None:
        child = self._workers.get(worker_id)
        return child.pid if child is not None else None

    def _worker_stopping(self, worker_id: str) -> bool:
        child = self._workers.get(worker_id)
        return self._stopping or child is None or child.stopping

    def _background(self, coro: Any, name: str) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ----- helpers -----------------------------------------------------------------------------
    def _require_started(self) -> Supervisor:
        if self.supervisor is None:
            raise RuntimeError("RootSupervisor.start() was not called")
        return self.supervisor

    def _supervisor_for(self, parent: str | None) -> Supervisor:
        if parent is None:
            return self._require_started()
        team = self._teams.get(parent)
        if team is None or team.state != "running":
            raise ChildNotFound(f"no running team {parent!r}; launch_team({parent!r}) first")
        return team

    def _check_launchable(self, sup: Supervisor, node_id: str) -> None:
        """Refuse before touching the ledger: a stopping root, or an id that is live anywhere in the tree."""
        if self._stopping or sup.state != "running":
            raise SupervisorNotRunning(f"supervisor {sup.id!r} is {sup.state}; cannot launch {node_id!r}")
        if (self.root_node and node_id == self.root_id) or node_id in self._workers or node_id in self._launching or (
            node_id in self._teams and self._teams[node_id].state == "running"
        ):
            raise ChildAlreadyPresent(f"node {node_id!r} is already running; retire it first or pick another id")
        for info in sup.which_children():
            if info.id == node_id and (info.running or info.restarting):
                raise ChildAlreadyPresent(f"node {node_id!r} is already running under {sup.id!r}")

    def _all_children(self, sup: Supervisor) -> list[str]:
        found: list[str] = []
        for info in sup.which_children():
            found.append(info.id)
            team = self._teams.get(info.id)
            if team is not None and team is not sup:
                found.extend(self._all_children(team))
        return found

    async def _forget_stopped(self, sup: Supervisor, child_id: str) -> None:
        """A relaunch replaces a stopped child's old spec (a running one is refused by start_child)."""
        info = next((i for i in sup.which_children() if i.id == child_id), None)
        if info is not None and not info.running and not info.restarting:
            await sup.delete_child(child_id)

    def _forget_team_member(self, team_id: str, node_id: str) -> None:
        """A member that stopped for good (settled, failed, retired) does not come back with its team."""
        if team_id in self._team_specs:
            self._team_specs[team_id] = [s for s in self._team_specs[team_id] if s.id != node_id]

    def _remember_team_spec(self, team_id: str, spec: ChildSpec) -> None:
        specs = [s for s in self._team_specs.get(team_id, []) if s.id != spec.id]
        self._team_specs[team_id] = [*specs, spec]

    def _ledger_stall(self, seconds: float, detail: str) -> None:
        """The ledger writer has waited `seconds` (on its own thread): say so on the loop, never block it."""
        def report() -> None:
            logger.warning("ledger writes waiting for {:.1f}s: {}", seconds, detail)
            self._publish("ledger_stall", {"seconds": round(seconds, 1), "detail": detail[:_MAX_TEXT]})

        if self._loop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(report)

    def _last_seen(self, worker_id: str) -> float | None:
        return self.control.last_seen(worker_id) if self.control is not None else None

    def _publish(self, type: str, body: dict[str, Any]) -> None:
        if self.monitor is None:
            return
        try:
            self.monitor.publish(type, body)
        except Exception as exc:
            logger.error("monitor publish {} failed: {!r}", type, exc)

    def _snapshot(self) -> dict[str, Any]:
        nodes = self.lifecycle.tree if self.lifecycle is not None else {}
        return {"root": self.root_id, "nodes": {k: dict(v) for k, v in nodes.items()}}

    # ----- control channel ---------------------------------------------------------------------
    async def _on_message(self, worker_id: str, msg: Message) -> dict[str, Any] | None:
        """Handle one validated frame from a worker; never raises (bad bodies are counted)."""
        child = self._workers.get(worker_id)
        if child is None:
            self.unknown_frames += 1
            return {"ok": False, "error": f"unknown worker {worker_id!r}"} if msg.corr else None
        handler = _HANDLERS.get(msg.type)
        try:
            if handler is None:
                if msg.corr is None:
                    return None
                return {"ok": False, "error": f"unsupported request type {msg.type!r}"}
            return await handler(self, child, msg.body, msg.corr is not None)
        except Exception as exc:
            self.bad_bodies += 1
            logger.warning("control message {!r} from {!r} rejected: {!r}", msg.type, worker_id, exc)
            return {"ok": False, "error": "rejected", "detail": repr(exc)[:_MAX_TEXT]} if msg.corr else None

    async def _on_heartbeat(self, child: RpcChild, body: dict[str, Any], _: bool) -> None:
        if "toolPgids" in body and not child.note_tool_groups(body["toolPgids"], replace=True):
            self.bad_bodies += 1

    async def _on_ready(self, child: RpcChild, body: dict[str, Any], _: bool) -> None:
        pid = body.get("pid")
        if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool)):
            raise ValueError(f"ready.pid must be an int, got {pid!r}")
        if not child.on_ready(body):
            self.bad_bodies += 1

    async def _on_event(self, child: RpcChild, body: dict[str, Any], _: bool) -> None:
        name = str(body["name"])
        if name == "tool_groups":
            if not child.note_tool_groups(body.get("pgids"), replace=False):
                self.bad_bodies += 1
            return
        if self.session_event is not None:  # first: the orchestrator notes a settle before its status lands
            self.session_event(child.id, name, dict(body))
        pool = self._pools.get(child.id)
        if pool is not None:
            pool.on_event(name, dict(body))
        extra = {k: v for k, v in body.items() if k not in ("name", "nodeId") and isinstance(k, str)}
        node_id = body.get("nodeId") if isinstance(body.get("nodeId"), str) else child.id
        self._publish(name[:200], {"node_id": node_id, "worker": child.id, **extra})

    async def _on_log(self, child: RpcChild, body: dict[str, Any], _: bool) -> None:
        level = str(body["level"]).upper()
        logger.log(level if level in _LOG_LEVELS else "INFO", "[{}] {}", child.id, str(body["msg"])[:_MAX_TEXT])

    async def _on_request(self, child: RpcChild, body: dict[str, Any], want_reply: bool) -> dict[str, Any] | None:
        op = body.get("op")
        if op == "legion.tool" and self.tool_handler is not None:
            node_id = body.get("nodeId") if isinstance(body.get("nodeId"), str) else child.id
            tool, args = body.get("tool"), body.get("args")
            if not isinstance(tool, str) or not isinstance(args, dict):
                return {"ok": False, "text": "legion.tool needs a tool name and an args object"}
            call = body.get("callId")
            return await self.tool_handler(str(node_id), tool, {**args, "_callId": call} if isinstance(call, str) else args)
        return {"ok": False, "error": f"unsupported op {op!r}"} if want_reply else None


_Handler = Callable[[RootSupervisor, RpcChild, dict[str, Any], bool], Awaitable[dict[str, Any] | None]]
_HANDLERS: dict[str, _Handler] = {
    "heartbeat": RootSupervisor._on_heartbeat, "ready": RootSupervisor._on_ready, "event": RootSupervisor._on_event,
    "log": RootSupervisor._on_log, "request": RootSupervisor._on_request,
}


class _RootObserver(LifecycleObserver):
    """Lifecycle facts plus the root's bookkeeping of team member specs and of pools' sessions."""

    def __init__(self, lifecycle: Lifecycle, root: RootSupervisor) -> None:
        super().__init__(lifecycle)
        self._root = root

    def child_started(self, sup: Supervisor, child_id: str, handle: Any, *, restart: bool) -> None:
        super().child_started(sup, child_id, handle, restart=restart)
        pool = self._root._pools.get(child_id)
        if pool is not None and pool.live():
            self._root._background(pool.relaunch_live(), f"relaunch:{child_id}")

    def child_exited(self, sup: Supervisor, child_id: str, reason: ExitReason, *, restarting: bool) -> None:
        super().child_exited(sup, child_id, reason, restarting=restarting)
        pool = self._root._pools.get(child_id)
        if pool is not None:
            escalated = sup.escalated_by is not None and sup.escalated_by[0] == child_id
            pool.pool_exited(reason, restarting=restarting, escalated=escalated)
        if not restarting and sup.state == "running":  # not part of an escalation: gone for good
            self._root._forget_team_member(sup.id, child_id)

    def child_terminated(self, sup: Supervisor, child_id: str, error: BaseException | None, *, why: str) -> None:
        cause = self.causes.get(child_id) or why
        super().child_terminated(sup, child_id, error, why=why)
        pool = self._root._pools.get(child_id)
        if pool is not None:
            pool.pool_stopped(cause, why=why, error=error)

