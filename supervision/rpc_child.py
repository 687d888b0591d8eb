"""An `rpc` worker as an OTP child: spawn, readiness over the bus, exit and hang detection, retire.

`RpcChild` is the `ChildHandle` of one worker process incarnation:
- started = forked by the `WorkerSpawner` **and** its `ready` message arrived within the start
  timeout (otherwise the worker is killed through the retire ladder and the start fails);
- exit = the process exited (pidfd). Exit code 0 is `normal`, anything else `abnormal` ("exit code
  N" / "signal SIGX"). After an unexpected exit the ladder still sweeps the worker's process group
  and snapshot, so no grandchild of a crashed worker outlives it;
- hung = its application heartbeat was silent for misses × interval (`HangDetector`): it is killed
  with the ladder (graceful=False) and its exit reason is `abnormal("hung")`;
- `shutdown(mode)` runs the retire ladder (graceful unless brutal_kill) and raises `RetireFailed`
  when anything survived; all ladder runs of one incarnation share a single task, so a hang kill,
  a post-exit sweep and a supervisor shutdown never race each other.
- tool process groups: a session's tools run in their own process groups (setsid), so once the
  worker is SIGKILLed they re-parent to the root and are no longer its descendants. The worker
  reports its live tool groups in every application heartbeat (`toolPgids`, replacing the set) and
  in a `tool_groups` event the moment a tool starts (adding to it); the root feeds both to
  `note_tool_groups`. After an abnormal exit, and before the supervisor hears of it (so before any
  restart), those groups and their descendants are swept too — but only the dead worker's orphans:
  processes created after the worker whose parent chain reaches the root (they re-parented to it,
  the subreaper) without passing through a live worker or the fork server (`host.protected_pids()`).
  So a recycled pgid, or a bogus report naming a sibling worker's group, never hits a stranger.
- settled = its session's run ended and it took no new input since (`settled`, set by the root). A settled
  worker is not watched for hangs (it runs nothing; it stops its heartbeat too), and after the host's
  `idle_grace` it gives its process back: the host parks it (`park()`: the graceful retire ladder). Its exit is
  then a settled one, which its supervisor neither restarts nor counts, and its node keeps its status; new
  input relaunches it from its transcript (README "How it works").
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from loguru import logger

from legion.bus.control import incarnation_identity
from legion.procs import (
    ProcRef,
    RetireFailed,
    RetireReport,
    RetireTimeouts,
    orphans_of,
    reap,
    retire_worker,
    snapshot_tree,
    sweep_async,
)
from legion.supervision.child_spec import (
    BRUTAL_KILL,
    ChildHandle,
    ChildSpec,
    ExitReason,
    RestartType,
    ShutdownMode,
)
from legion.supervision.hang import HangDetector
from legion.supervision.spawn import UNKNOWN_EXIT, WorkerProcess, WorkerSpawner, WorkerStart

HUNG = "hung"
ATTEMPT_ENV = "LEGION_WORKER_ATTEMPT"  # 1 on the first start, n on the (n-1)-th restart: "restart = resume"
# Timeouts for cleaning up after a worker that already exited (only its leftovers remain).
_AFTER_EXIT = RetireTimeouts(retire=0.0, signal=1.0, kill=1.0)
# A worker may send `ready` and exit at once; its exit (pidfd) can overtake the frame (ZeroMQ).
READY_GRACE = 1.0


@dataclass(frozen=True)
class RpcNode:
    """What an rpc child runs and how it is supervised (one per node; node id = worker id)."""

    node_id: str
    entry: str
    args: dict[str, Any] = field(default_factory=dict)
    cwd: str | None = None
    env: dict[str, str] | None = None
    restart: RestartType = "transient"
    shutdown: ShutdownMode = field(default_factory=RetireTimeouts)
    significant: bool = False
    role: str = "worker"
    name: str | None = None  # the ledger's node name (a slug); defaults to node_id
    start_timeout: float = 15.0  # docs/spec-conformance.md §8.2 spawn start timeout
    log_path: str | None = None


_MAX_TOOL_GROUPS = 4096  # a worker reporting more is misbehaving; keep the newest reports bounded
# create_time is derived from clock ticks; allow one tick of rounding when comparing with the worker's
_CT_SLACK = 0.02


class RpcHost(Protocol):
    """What an RpcChild needs from the root supervisor."""

    @property
    def spawner(self) -> WorkerSpawner: ...

    hang: HangDetector
    heartbeat_interval: float
    idle_grace: float | None  # seconds a settled worker keeps its process (None: until it is stopped)

    def register(self, child: RpcChild) -> None: ...

    def unregister(self, child: RpcChild) -> None: ...

    def child_problem(self, child: RpcChild, what: str, detail: str) -> None: ...

    def protected_pids(self) -> set[int]:
        """Pids a tool sweep must never touch nor reach through (live workers, the fork server)."""
        ...

    def idle_expired(self, child: RpcChild) -> None:
        """`child` stayed settled for `idle_grace`: give its process back (`RpcChild.park`), or leave it."""
        ...


def describe_exit(code: int | None) -> ExitReason:
    """Map a process exit status to an exit reason (0 normal; code or signal abnormal)."""
    if code == 0:
        return ExitReason.normal()
    if code is None or code == UNKNOWN_EXIT:
        return ExitReason.abnormal("exit status unknown")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return ExitReason.abnormal(f"signal {name}")
    return ExitReason.abnormal(f"exit code {code}")


def _timeouts(mode: ShutdownMode) -> RetireTimeouts:
    return mode if isinstance(mode, RetireTimeouts) else RetireTimeouts()


class RpcChild:
    """One incarnation of an rpc worker (a `ChildHandle`)."""

    def __init__(self, node: RpcNode, host: RpcHost, *, attempt: int = 1) -> None:
        self.node = node
        self.host = host
        self.attempt = attempt
        self.identity = incarnation_identity(node.node_id, attempt)  # this incarnation's bus identity
        self.proc: WorkerProcess | None = None
        self.ready_body: dict[str, Any] | None = None
        self.retire_report: RetireReport | None = None
        loop = asyncio.get_running_loop()
        self._ready: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._exit: asyncio.Future[ExitReason] = loop.create_future()
        self._proc_exited = asyncio.Event()
        self._watch_task: asyncio.Task[None] | None = None
        self._retire_task: asyncio.Task[RetireReport] | None = None
        self._hung = False
        self._stopping = False
        self._start_done = False
        self._hung_task: asyncio.Future[RetireReport] | None = None
        self.tool_pgids: set[int] = set()  # live tool process groups the worker last reported
        self.tool_sweep: list[ProcRef] = []  # what the post-exit tool sweep found (diagnostics, tests)
        # its session has settled and took no new input since: the process only caches finished work, so its
        # exit is no crash — its supervisor neither restarts it nor counts it (README "How it works")
        self._settled = False
        self._idle_timer: asyncio.TimerHandle | None = None
        self.parking = False  # settled past its idle grace: its process is being given back (`park`)

    @property
    def id(self) -> str:
        return self.node.node_id

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        """Its process runs (it was spawned and has not exited)."""
        return self.proc is not None and self.proc.is_alive()

    @property
    def hung(self) -> bool:
        return self._hung

    @property
    def settled(self) -> bool:
        """Its session's run ended and it took no new input since (see the module docstring)."""
        return self._settled

    @settled.setter
    def settled(self, value: bool) -> None:
        self._settled = value
        if not self._start_done or self._proc_exited.is_set():
            return  # `start` applies it once it is done; an exited worker has nothing to watch or park
        if value:
            self._went_idle()
        else:
            self._went_busy()

    def _went_idle(self) -> None:
        self.host.hang.unwatch(self.id)
        grace = getattr(self.host, "idle_grace", None)
        if grace is not None and self._idle_timer is None and not self._stopping:
            self._idle_timer = asyncio.get_running_loop().call_later(grace, self._idle_expired)

    def _went_busy(self) -> None:
        self._cancel_idle_timer()
        if not self._stopping:
            self.host.hang.watch(self.id, self._on_hung)

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _idle_expired(self) -> None:
        self._idle_timer = None
        if self._settled and not self._stopping and not self._proc_exited.is_set():
            self.host.idle_expired(self)

    def park(self) -> Coroutine[Any, Any, None]:
        """Give the process of a settled worker back: the graceful retire ladder, its exit a settled one. It is
        `parking` from the call on; the returned coroutine runs the ladder."""
        self.parking = self._stopping = True
        self._cancel_idle_timer()
        self.host.hang.unwatch(self.id)
        return self._give_back()

    async def _give_back(self) -> None:
        try:
            await self._retire(graceful=True, timeouts=_timeouts(self.node.shutdown))
        except Exception as exc:  # reported; the supervisor's own stop of it tries again and says so too
            self.host.child_problem(self, "retire_failed", f"giving back the idle worker's process failed: {exc}")

    @property
    def stopping(self) -> bool:
        """The supervisor is stopping this incarnation (retire, pause, strategy, escalation)."""
        return self._stopping

    # ----- start -------------------------------------------------------------------------------
    async def start(self) -> RpcChild:
        """Spawn and wait for `ready`; on failure kill whatever was started and raise."""
        start = WorkerStart(
            worker_id=self.id, entry=self.node.entry, args=dict(self.node.args), cwd=self.node.cwd,
            env={**(self.node.env or {}), ATTEMPT_ENV: str(self.attempt)}, log_path=self.node.log_path,
            heartbeat_interval=self.host.heartbeat_interval, identity=self.identity,
        )  # fmt: skip
        self.host.register(self)
        # the fork-server round trip blocks on a socket; keep the root's loop free meanwhile
        spawning = asyncio.ensure_future(asyncio.to_thread(self.host.spawner.spawn, start))
        try:
            self.proc = await asyncio.shield(spawning)
        except asyncio.CancelledError:
            spawning.add_done_callback(self._kill_orphan)  # the fork happens anyway: never leak it
            self.host.unregister(self)
            raise
        except BaseException:
            self.host.unregister(self)
            raise
        self._watch_task = asyncio.create_task(self._watch_exit(), name=f"exit:{self.id}")
        try:
            await self._wait_ready()
        except BaseException:
            await self._abort_start()
            self.host.unregister(self)
            raise
        finally:
            self._start_done = True
        if self._exit.done():
            self.host.unregister(self)  # ready, then gone already: the supervisor sees the exit next
        elif self._settled:  # it settled before its start returned (or started idle)
            self._went_idle()
        else:
            self.host.hang.watch(self.id, self._on_hung)
        return self

    async def _wait_ready(self) -> None:
        exited: asyncio.Future[Any] = asyncio.ensure_future(self._proc_exited.wait())
        waiting: set[asyncio.Future[Any]] = {self._ready, exited}
        try:
            await asyncio.wait(waiting, timeout=self.node.start_timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
        if not self._ready.done() and self._proc_exited.is_set():
            await asyncio.wait({self._ready}, timeout=READY_GRACE)
        if self._ready.done():
            return
        if self._proc_exited.is_set():
            code = self.proc.returncode if self.proc is not None else None
            if code == 0:
                # it ran and finished cleanly (its `ready` can be lost when it exits at once): a
                # started child that already exited normally, not a failed start
                return
            raise RuntimeError(f"worker {self.id!r} exited before it was ready ({describe_exit(code)})")
        raise TimeoutError(f"worker {self.id!r} was not ready within {self.node.start_timeout:g}s (start_timeout)")

    async def _abort_start(self) -> None:
        self._stopping = True
        try:
            await self._retire(graceful=False, timeouts=_timeouts(self.node.shutdown))
        except Exception as exc:  # reported, never swallowed: the worker may still be alive
            self.host.child_problem(self, "retire_failed", f"killing the unready worker failed: {exc}")
        self._finish(ExitReason.abnormal("start_failed"))

    def _kill_orphan(self, spawning: asyncio.Future[WorkerProcess]) -> None:
        if spawning.cancelled() or spawning.exception() is not None:
            return
        self.proc = spawning.result()
        self._stopping = True
        task = asyncio.ensure_future(self._retire(graceful=False, timeouts=_timeouts(self.node.shutdown)))
        self._hung_task = task
        task.add_done_callback(
            lambda t: None if t.cancelled() or t.exception() is None
            else self.host.child_problem(self, "retire_failed", f"killing an orphaned spawn failed: {t.exception()}")
        )

    def on_ready(self, body: dict[str, Any]) -> bool:
        """The root received `ready` from this worker id; accept it only from this incarnation's pid."""
        pid = body.get("pid")
        if self.proc is not None and pid is not None and pid != self.proc.pid:
            return False
        if not self._ready.done():
            self.ready_body = body
            self._ready.set_result(body)
        return True

    # ----- tool process groups ------------------------------------------------------------------
    def note_tool_groups(self, pgids: object, *, replace: bool) -> bool:
        """Record tool process groups reported by the worker; False (nothing changed) for a bad list."""
        if not isinstance(pgids, list) or len(pgids) > _MAX_TOOL_GROUPS:
            return False
        if not all(isinstance(g, int) and not isinstance(g, bool) and g > 1 for g in pgids):
            return False
        if self._proc_exited.is_set():
            return True  # a frame that overtook nothing: the sweep already used what it had
        if replace:
            self.tool_pgids = set(pgids)
        else:
            self.tool_pgids.update(pgids)
        return True

    async def _sweep_tool_groups(self, timeouts: RetireTimeouts) -> list[ProcRef]:
        """Sweep the reported tool groups (and their descendants) the worker left behind."""
        assert self.proc is not None
        own = {os.getpgrp(), self.proc.pgid}
        pgids = {g for g in self.tool_pgids if g not in own}
        if not pgids:
            return []
        born = self.proc.create_time - _CT_SLACK
        protected = set(getattr(self.host, "protected_pids", set)()) - {self.proc.pid}
        procs = await asyncio.to_thread(orphans_of, [p for p in snapshot_tree(pgids) if p.create_time >= born], protected)
        self.tool_sweep = procs
        if not procs:
            return []
        survivors = await sweep_async(procs, signal_timeout=timeouts.signal, kill_timeout=timeouts.kill)
        reap(p.pid for p in procs)  # they re-parented to us (subreaper): collect their exit statuses
        return survivors

    # ----- exit --------------------------------------------------------------------------------
    async def wait_exit(self) -> ExitReason:
        return await asyncio.shield(self._exit)

    async def _watch_exit(self) -> None:
        assert self.proc is not None
        try:
            code = await self.proc.wait()
        except Exception as exc:  # never leave the supervisor waiting for an exit it cannot learn
            logger.error("waiting for worker {} failed: {!r}; killing it", self.id, exc)
            self.proc.signal(signal.SIGKILL)
            code = self.proc.wait_blocking(1.0)
        self._proc_exited.set()
        self.host.hang.unwatch(self.id)
        reason = ExitReason.abnormal(HUNG) if self._hung else describe_exit(code)
        if not self._stopping:
            # an unexpected exit: sweep what the worker left behind before anyone restarts it
            try:
                await self._retire(graceful=False, timeouts=_AFTER_EXIT)
            except RetireFailed as exc:
                self.host.child_problem(self, "retire_failed", str(exc))
                reason = ExitReason.abnormal(f"{reason.detail}; {exc.code}")
            except Exception as exc:
                self.host.child_problem(self, "cleanup_failed", repr(exc))
            try:
                survivors = await self._sweep_tool_groups(_AFTER_EXIT)
            except Exception as exc:
                survivors = []
                self.host.child_problem(self, "cleanup_failed", f"tool group sweep: {exc!r}")
            if survivors:
                pids = [p.pid for p in survivors]
                self.host.child_problem(self, "retire_failed", f"tool processes survived the sweep: {pids}")
                reason = ExitReason.abnormal(f"{reason.detail}; tool processes survived: {pids}")
        self._finish(reason)

    def _finish(self, reason: ExitReason) -> None:
        if self._start_done:  # until then a `ready` still in flight must find this child
            self.host.unregister(self)
        self._cancel_idle_timer()
        self.host.hang.unwatch(self.id)
        if not self._exit.done():
            self._exit.set_result(reason)

    def _on_hung(self, worker_id: str, silent_for: float) -> None:
        if self._stopping or self._proc_exited.is_set():
            return
        self._hung = True
        self.host.child_problem(self, HUNG, f"application heartbeat silent for {silent_for:.2f}s")
        self._hung_task = asyncio.ensure_future(self._retire(graceful=False, timeouts=_timeouts(self.node.shutdown)))
        self._hung_task.add_done_callback(self._hung_kill_done)

    def _hung_kill_done(self, task: asyncio.Future[RetireReport]) -> None:
        """A hung worker that could not be killed is still reported as exited (never stuck 'running')."""
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        logger.error("killing hung worker {} failed: {!r}", self.id, exc)
        if self.proc is not None and self.proc.is_alive():
            code = getattr(exc, "code", type(exc).__name__)
            self.host.child_problem(self, "retire_failed", str(exc))
            if self._watch_task is not None:
                self._watch_task.cancel()
            self._proc_exited.set()
            self._finish(ExitReason.abnormal(f"{HUNG}; {code}"))

    # ----- stop --------------------------------------------------------------------------------
    async def shutdown(self, mode: ShutdownMode) -> None:
        """Retire this worker with the ladder; raises RetireFailed if anything survived."""
        self._stopping = True
        self._cancel_idle_timer()
        self.host.hang.unwatch(self.id)
        try:
            await self._retire(graceful=mode != BRUTAL_KILL, timeouts=_timeouts(mode))
        finally:
            await self._sweep_tools_after_retire(mode)
            if self.proc is None or not self.proc.is_alive():
                self._finish(ExitReason.shutdown())
            elif self._watch_task is not None:
                self._watch_task.cancel()  # unkillable (RetireFailed): stop waiting for an exit

    async def _sweep_tools_after_retire(self, mode: ShutdownMode) -> None:
        """A worker killed mid-retire cannot dispose its sessions: their tool groups go too."""
        if self.proc is None or self.proc.is_alive():
            return
        try:
            survivors = await self._sweep_tool_groups(_timeouts(mode))
        except Exception as exc:
            self.host.child_problem(self, "cleanup_failed", f"tool group sweep: {exc!r}")
            return
        if survivors:
            self.host.child_problem(self, "retire_failed",
                                    f"tool processes survived the sweep: {[p.pid for p in survivors]}")

    async def _retire(self, *, graceful: bool, timeouts: RetireTimeouts) -> RetireReport:
        """Run the ladder once per incarnation; later callers share the first run's result."""
        if self.proc is None:
            raise RuntimeError(f"worker {self.id!r} was never spawned")
        if self._retire_task is None:
            self._retire_task = asyncio.ensure_future(retire_worker(self.proc, graceful=graceful, timeouts=timeouts))
        report = await asyncio.shield(self._retire_task)
        self.retire_report = report
        return report


def rpc_child_spec(node: RpcNode, host: RpcHost) -> ChildSpec:
    """The ChildSpec that (re)starts `node` as a fresh RpcChild each time (attempt 1, 2, ...)."""
    attempts = 0

    async def start() -> ChildHandle:
        nonlocal attempts
        attempts += 1
        return await RpcChild(node, host, attempt=attempts).start()

    return ChildSpec(id=node.node_id, start=start, restart=node.restart, shutdown=node.shutdown,
                     significant=node.significant)
