"""The root supervisor: the composition root of a run (docs/architecture.md §2–§3).

`RootSupervisor` composes the run's resources — the run directory (0700, one root per directory: a
flock, `run_lock.py`), its alarm reports (`alarms.py`), the ledger (reads on the loop, writes through one `LedgerWriter` thread), the control ROUTER
(`ipc://<run_dir>/ctl.sock` unless told otherwise), the monitor PUB + snapshot endpoint, the
`WorkerSpawner` (fork server; the root becomes a child subreaper), the hang detector and the top
`Supervisor` — with the node registry (`registry.py`: one record per node) and the message-dispatch
table (`dispatch.py`). It derives from nothing: what it does to nodes (launch, retire, sessions) is
`self.nodes`, a `Nodes` (node_ops.py) it constructs with the registry, the run's fixed settings and itself
(the `RpcHost` of its workers, and the `RootState` whose resources `start()` opens). Callers use it
directly (`root.nodes.launch_pool(...)`); it is the `Host` the orchestration layer holds
(orchestration/host.py).

- `start()` / `stop(cause, force)` or `async with RootSupervisor(...) as root:`; `stop()` is the
  session-shutdown **pause**: every child is retired with cause `session-shutdown` (status `retired`,
  phase untouched), then the root closes its resources. `wait_exit()` returns once it has.
- If the top supervisor exceeds its restart intensity, the root node fails with `restart_intensity`
  (an agent-tree run, `root_node=False`, has no root node: its caller reads the exit reason), its
  children are shut down, and `wait_exit()` returns.
- Nothing a worker or the network sends can crash it: the bus drops malformed frames and refuses
  identities it did not hand out, and the dispatch validates bodies and never raises.

Options: `ledger_path` (default `<run_dir>/legion.db`; a `postgresql://` URL without its password puts the run's rows,
scoped by `run_id`, in a shared database: ledger/location.py), root_id, run_id, endpoint (a tcp:// control
endpoint needs `curve`; workers spawned here only speak ipc), monitor_tcp + curve (a remote read-only
monitor, refused without curve: served by the relay, a supervised child process — the root itself never
listens on tcp for it; `supervision/relay_child.py`), strategy, max_restarts, restart_period, backoff, heartbeat_interval,
hang_misses, preload (+ early_fork_server: one started ahead with it, `EarlyForkServer`), monitor, root_node, on_disk_full (the ledger's filesystem is full; called on the loop),
on_ledger_unreachable + ledger_unreachable_s (a ledger server unreachable for longer than that; called on the loop),
idle_grace (seconds a settled rpc worker keeps its process before it is parked; None, the default: until it is
stopped).
The orchestration layer registers with `serve_tools` (the one handler of legion tool calls) and
`subscribe_sessions` (session events); nothing assigns the root's attributes from outside.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from loguru import logger

from legion.bus.control import ControlServer, control_endpoint
from legion.bus.monitor import MonitorPublisher
from legion.bus.protocol import Message
from legion.bus.security import CurveServerConfig, check_bind_endpoint, ensure_private_dir
from legion.ledger import open_ledger
from legion.ledger.ledger import Ledger
from legion.ledger.location import ledger_scope, ledger_target
from legion.ledger.writer import LedgerWriter
from legion.procs import raise_nofile
from legion.supervision import dispatch
from legion.supervision.alarms import Alarms
from legion.supervision.child_spec import ExitReason
from legion.supervision.hang import HANG_MISSES, HangDetector
from legion.supervision.lifecycle import SESSION_SHUTDOWN, Lifecycle, LifecycleObserver
from legion.supervision.node_facts import NodeFacts
from legion.supervision.node_ops import Nodes, RootObserver
from legion.supervision.registry import Registry
from legion.supervision.relay_child import MonitorRelayChild
from legion.supervision.rpc_child import RpcChild
from legion.supervision.run_lock import lock_run_dir
from legion.supervision.spawn import DEFAULT_PRELOAD, EarlyForkServer, WorkerSpawner
from legion.supervision.supervisor import Backoff, Strategy, Supervisor

LOW_NOFILE = 4096  # below this RLIMIT_NOFILE (after raising the soft limit to the hard one) the root warns


class RootSupervisor:
    """Owns one run: bus endpoints, fork server, ledger, node registry, its nodes and the supervision tree."""

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
        hang_misses: int = HANG_MISSES,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        monitor: bool = True,
        monitor_tcp: tuple[str, str] | None = None,
        curve: CurveServerConfig | None = None,
        root_node: bool = True,
        on_disk_full: Callable[[str], None] | None = None,
        idle_grace: float | None = None,
        on_ledger_unreachable: Callable[[str], None] | None = None,
        ledger_unreachable_s: float = 60.0,
        early_fork_server: EarlyForkServer | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.ledger_path = ledger_target(self.run_dir, ledger_path)
        self.root_id = root_id
        # root_node=False: an agent tree's run — the supervisor itself is no node and pools are infrastructure
        # (the root agent session is the node at depth 0, launched by the orchestrator)
        self.root_node = root_node
        self.run_id = run_id
        self._endpoint = endpoint
        self.strategy: Strategy = strategy
        self.max_restarts = max_restarts
        self.restart_period = restart_period
        self.backoff = backoff
        self.heartbeat_interval = heartbeat_interval
        self.hang_misses = hang_misses
        if idle_grace is not None and idle_grace < 0:
            raise ValueError(f"idle_grace must be seconds >= 0 or None (never), got {idle_grace!r}")
        self.idle_grace = idle_grace  # a settled rpc worker gives its process back after this (None: never)
        self.preload = tuple(preload)
        self.early_fork_server = early_fork_server  # started ahead with `preload`: the spawner adopts it if it fits
        self.want_monitor = monitor
        self.monitor_tcp = monitor_tcp  # (PUB, snapshot) tcp:// endpoints; CurveZMQ required
        self.curve = curve
        self.registry = Registry()
        self.nodes = Nodes(self.registry, root=self, host=self, root_id=root_id, root_node=root_node,
                           ledger_path=self.ledger_path, ledger_run=ledger_scope(self.ledger_path, run_id),
                           backoff=backoff)
        self.alarms = Alarms(self.publish, on_disk_full, on_ledger_unreachable, ledger_unreachable_s)  # on the loop
        self.control_endpoint: str | None = None
        self.ledger: Ledger | None = None  # the root's reads; its writes go through `writer`
        self.writer: LedgerWriter | None = None
        self.control: ControlServer | None = None
        self.monitor: MonitorPublisher | None = None
        self.facts = NodeFacts()  # model, phase, turns, tokens, cost per node: the monitor snapshot's figures
        self.relay: MonitorRelayChild | None = None  # the tcp monitor (a child process), with monitor_tcp
        self.hang = HangDetector(self._last_seen, interval=heartbeat_interval, misses=hang_misses)
        self.lifecycle: Lifecycle | None = None
        self.observer: LifecycleObserver | None = None
        self.supervisor: Supervisor | None = None
        self._spawner: WorkerSpawner | None = None
        self._lock_fd: int | None = None
        self._watch: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._stopping = False
        self._signal_stop: asyncio.Future[ExitReason] | None = None
        self.unknown_frames = 0
        self.bad_bodies = 0

    async def __aenter__(self) -> RootSupervisor:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self.supervisor is not None and self.supervisor.state == "running":
            await self.stop()
        else:
            await self._closed.wait()

    # ----- RpcHost -----------------------------------------------------------------------------
    @property
    def spawner(self) -> WorkerSpawner:
        if self._spawner is None:
            raise RuntimeError("RootSupervisor.start() was not called")
        return self._spawner

    def register(self, child: RpcChild) -> None:
        self.registry.record(child.id).handle = child
        if self.control is not None:  # frames count as this worker's only from this incarnation's identity
            self.control.admit(child.id, child.identity)

    def unregister(self, child: RpcChild) -> None:
        rec = self.registry.get(child.id)
        if rec is not None and rec.handle is child:
            rec.handle = None
            if self.control is not None:
                self.control.forget(child.id)

    def protected_pids(self) -> set[int]:
        """Live workers and the fork server: a dead worker's tool sweep never touches or reaches through them."""
        pids = {c.pid for c in self.registry.workers() if c.pid is not None}
        zygote = self._spawner.zygote_pid if self._spawner is not None else None
        return pids | ({zygote} if zygote else set())

    def idle_expired(self, child: RpcChild) -> None:
        self.nodes.park_idle(child)

    def child_problem(self, child: RpcChild, what: str, detail: str) -> None:
        self.alarms.child_problem(child.id, what, detail)

    # ----- how the run ended (for the Run that composes it) ---------------------------------------
    @property
    def running(self) -> bool:
        """Started and not yet stopped."""
        return self.supervisor is not None and self.supervisor.state == "running"

    @property
    def stopping(self) -> bool:
        """`stop()` was called: nothing new is launched."""
        return self._stopping

    @property
    def exit_reason(self) -> ExitReason | None:
        return self.supervisor.exit_reason if self.supervisor is not None else None

    @property
    def retire_failures(self) -> list[str]:
        """Nodes whose stop could not be verified (RETIRE_FAILED)."""
        return list(self.lifecycle.retire_failures) if self.lifecycle is not None else []

    # ----- the run's resources -----------------------------------------------------------------
    async def start(self) -> None:
        """Open everything the run needs and start the (empty) top supervisor."""
        self.alarms.bind(asyncio.get_running_loop())
        soft, hard = raise_nofile()
        if soft < LOW_NOFILE:
            logger.warning("this root may open at most {} descriptors (hard limit {}): a large tree can run out; "
                           "raise the hard limit (ulimit -Hn, systemd LimitNOFILE=)", soft, hard)
        try:
            ensure_private_dir(self.run_dir)
            self._lock_fd = lock_run_dir(self.run_dir)
            scope = ledger_scope(self.ledger_path, self.run_id)
            self.ledger = open_ledger(self.ledger_path, run_id=scope)
            self.writer = self.alarms.writer(str(self.ledger_path), scope)
            self.lifecycle = Lifecycle(self.ledger, self.publish, run_id=self.run_id, writer=self.writer)
            self.observer = RootObserver(self.lifecycle, self.nodes)
            self.control = ControlServer(self._endpoint or control_endpoint(self.run_dir), on_message=self._on_message,
                                         curve=self.curve if (self._endpoint or "").startswith("tcp://") else None,
                                         admission=True)
            self.control_endpoint = await self.control.start()
            if self.want_monitor:
                for tcp in self.monitor_tcp or ():
                    check_bind_endpoint(tcp, self.curve)  # refused without curve, before any process starts
                self.monitor = MonitorPublisher(self.run_dir, provider=self._snapshot)
                await self.monitor.start()
            early, self.early_fork_server = self.early_fork_server, None
            self._spawner = WorkerSpawner(self.control_endpoint, preload=self.preload, early=early)
            await asyncio.to_thread(self._spawner.start)
            self.hang.start()
            if self.want_monitor and self.monitor_tcp is not None and self.curve is not None:
                self.relay = MonitorRelayChild(self, self.run_dir, self.monitor_tcp, self.curve, publish=self.publish)
                await self.relay.start()
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
        """SIGINT/SIGTERM pause the run (`stop()`, cause session-shutdown): docs/architecture.md §3."""
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
        reason = await sup.stop(ExitReason.shutdown(cause), brutal=force)  # the cause reaches every child
        if self._watch is not None:
            await asyncio.shield(self._watch)
        return reason

    async def _watch_supervisor(self) -> None:
        sup = self._require_started()
        reason = await sup.wait_exit()
        await sup.stop()  # returns at once, after any start still in flight has settled
        if self.root_node:
            self._lifecycle().root_exited(self.root_id, reason, sup.escalated_by)
        await self._close_resources()

    async def _close_resources(self) -> None:
        self.nodes.cancel_background()
        if self.relay is not None:
            with contextlib.suppress(Exception):
                await self.relay.close()
        await self.hang.close()
        if self._spawner is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._spawner.close)
        for closer in (self.control, self.monitor):
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer.close()
        if self.writer is not None:
            await self.alarms.close_writer(self.writer)
        if self.ledger is not None:
            with contextlib.suppress(Exception):
                self.ledger.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None
        self._closed.set()

    # ----- monitor, liveness ---------------------------------------------------
    def publish(self, type: str, body: dict[str, Any]) -> None:
        """One event on the monitor stream (never raises)."""
        if self.monitor is None:
            return
        try:
            self.facts.apply(type, body)  # before publishing: a snapshot at seq S holds events 1..S
            self.monitor.publish(type, body)
        except Exception as exc:
            logger.error("monitor publish {} failed: {!r}", type, exc)

    def _snapshot(self) -> dict[str, Any]:
        lifecycle = self.lifecycle
        if lifecycle is None:
            return {"run": self.run_id, "root": self.root_id, "nodes": {}}
        # the run id too: a tcp monitor client knows only the endpoint, and its events name their run (docs/events.md)
        return {"run": self.run_id, **self.facts.snapshot(self.root_id, lifecycle.tree, lifecycle.infra)}

    def _lifecycle(self) -> Lifecycle:
        if self.lifecycle is None:
            raise RuntimeError("RootSupervisor.start() was not called")
        return self.lifecycle

    def _require_started(self) -> Supervisor:
        if self.supervisor is None:
            raise RuntimeError("RootSupervisor.start() was not called")
        return self.supervisor

    def _last_seen(self, worker_id: str) -> float | None:
        return self.control.last_seen(worker_id) if self.control is not None else None

    async def _on_message(self, worker_id: str, msg: Message) -> dict[str, Any] | None:
        return await dispatch.handle(self, worker_id, msg)
