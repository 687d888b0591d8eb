"""OTP supervisors: strategies, restart intensity, backoff, significant children, nesting.

docs/architecture.md §3.

Semantics follow OTP's `supervisor` module:
- Children start in list order and stop in reverse order. `start_child` appends.
- Restart policy: permanent always, transient only after an abnormal exit, temporary never. A temporary
  child is forgotten once it stops; a transient child that stops normally keeps its spec (not running).
- `one_for_one` restarts the child; `one_for_all` stops every other child (reverse order) and starts all
  children in order; `rest_for_one` stops the children started after it and starts it and them again.
  Temporary children stopped as bystanders are removed, never restarted. As in OTP, a multi-child restart
  also starts siblings that were stopped at the time (their specs are kept).
- Restart intensity: every restart decision is stamped on a monotonic clock; stamps older than
  `restart_period` fall out of the window. When the window holds more than `max_restarts` stamps
  (restart number max_restarts + 1) the supervisor stops all its children in reverse start order and
  exits. A restart whose start fails counts again (OTP's try-again) and is retried.
- `auto_shutdown`: never (significant children rejected) | any_significant | all_significant, applied
  only when a significant child exits by itself and is not restarted, never when the supervisor stops it.

Beyond OTP (docs/architecture.md §3):
- The first restart in a window is immediate; later ones wait `Backoff.delay(n)` (exponential, capped,
  with jitter), during which the supervisor stays responsive.
- A supervisor that is stopping never restarts anything (pending restarts are cancelled).
- Exceeding the intensity exits with `ExitReason.abnormal("restart_intensity")` (OTP exits `shutdown`), so
  the parent treats the escalation as an abnormal exit of a child and applies that child's restart type.
- Auto-shutdown exits with `ExitReason.shutdown("auto_shutdown")`, as OTP.
- `keep_stopped_specs=False` forgets a child's spec once it stops for good (as OTP does only for
  temporary children), so a settled or retired agent is never restarted with its siblings.
- A child whose handle has `settled = True` when it exits (an agent session whose run had ended: its process
  only caches finished work) is neither restarted nor counted toward the intensity; its spec is forgotten
  and `settled_child_exited` reported (README "How it works", Supervision). When the supervisor stops all its
  children, the settled ones (nothing depends on finished work) are stopped together, first; the others one by
  one in reverse start order.
- Observer callbacks (`SupervisorObserver`) report every lifecycle fact; during an escalation the
  supervisor's state is already "stopping" when the failing child's exit is reported.

The API: `Supervisor(id="supervisor", *, strategy,
max_restarts, restart_period, children, auto_shutdown, backoff, clock, sleep, rand, observer,
keep_stopped_specs)`; `start()`, `stop(reason, brutal)`, `wait_exit()`, `start_child`,
`terminate_child(brutal=)`, `delete_child`, `restart_child`, `which_children()`, `child_info(id)`,
`restarts_in_window()`, `escalated_by`; `supervisor_spec(id, make)` nests a supervisor.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from loguru import logger

from legion.supervision.child_spec import (
    BRUTAL_KILL,
    ChildHandle,
    ChildSpec,
    ChildSpecError,
    ExitReason,
    RestartType,
    RetireTimeouts,
    ShutdownMode,
    should_restart,
)

Strategy = Literal["one_for_one", "one_for_all", "rest_for_one"]
AutoShutdown = Literal["never", "any_significant", "all_significant"]
SupervisorState = Literal["new", "running", "stopping", "stopped"]
STRATEGIES: tuple[Strategy, ...] = ("one_for_one", "one_for_all", "rest_for_one")
AUTO_SHUTDOWNS: tuple[AutoShutdown, ...] = ("never", "any_significant", "all_significant")
RESTART_INTENSITY = "restart_intensity"
BYSTANDER = "bystander"  # child_terminated(why=) of a temporary child stopped by a sibling's restart
Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class SupervisorError(Exception):
    """Base class of supervisor API errors."""


class ChildNotFound(SupervisorError):
    """No child with that id."""


class WorkerExited(ChildNotFound):
    """The worker asked exited before it answered: its exit, processed now or soon, decides what follows."""


class ChildAlreadyPresent(SupervisorError):
    """A child with that id exists already (running or not)."""


class ChildRunning(SupervisorError):
    """The operation needs a stopped child."""


class SupervisorNotRunning(SupervisorError):
    """The supervisor is not running (not started, stopping or stopped)."""


class ShutdownTimeout(SupervisorError, TimeoutError):
    """A child's shutdown outlived its bound; it was cancelled and may still be running."""


class StartFailed(SupervisorError):
    """A child's start factory raised or returned something that is not a ChildHandle."""

    def __init__(self, child_id: str, cause: BaseException) -> None:
        super().__init__(f"child {child_id!r} failed to start: {cause!r}")
        self.child_id = child_id
        self.cause = cause


@dataclass(frozen=True)
class Backoff:
    """Delay before the n-th restart in the intensity window: 0 for n = 1, then exponential, capped.

    delay(n) = min(cap, base * factor ** (n - 2)) * (1 - jitter * u), u uniform in [0, 1).
    """

    base: float = 0.05
    factor: float = 2.0
    cap: float = 5.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0 or self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ChildSpecError(
                f"Backoff needs base >= 0, cap >= 0, factor >= 1 and 0 <= jitter <= 1, got {self!r}"
            )

    def delay(self, nth: int, u: float) -> float:
        if nth <= 1:
            return 0.0
        raw = min(self.cap, self.base * self.factor ** (nth - 2))
        return raw * (1.0 - self.jitter * u)


@dataclass(frozen=True)
class ChildInfo:
    """One child as `which_children` reports it."""

    id: str
    restart: RestartType
    significant: bool
    running: bool
    restarting: bool


class SupervisorObserver:
    """Lifecycle callbacks (synchronous, must be quick; exceptions are logged and ignored)."""

    def child_started(self, sup: Supervisor, child_id: str, handle: ChildHandle, *, restart: bool) -> None:
        """A child was started (restart=True when this start is a restart)."""

    def child_exited(self, sup: Supervisor, child_id: str, reason: ExitReason, *, restarting: bool) -> None:
        """A child exited by itself; restarting says whether the policy restarts it."""

    def settled_child_exited(self, sup: Supervisor, child_id: str, reason: ExitReason) -> None:
        """A child whose handle said `settled` (its work done) exited by itself: not restarted, not counted."""

    def child_terminated(self, sup: Supervisor, child_id: str, error: BaseException | None, *, why: str,
                         cause: str | None = None) -> None:
        """The supervisor stopped a child; error is set when the shutdown could not be verified.

        why: "terminate_child", "strategy" (a one_for_all/rest_for_one bystander, restarted next),
        "bystander" (a temporary such bystander: stopped for good and forgotten, as OTP), "stop",
        "restart_intensity" or "auto_shutdown". cause: what the caller of `terminate_child(cause=)` /
        `stop(reason)` gave (a retire, a pause: "session-shutdown"), passed down to nested supervisors.
        """

    def child_start_failed(self, sup: Supervisor, child_id: str, error: BaseException) -> None:
        """A start (or restart) of a child raised."""

    def supervisor_exited(self, sup: Supervisor, reason: ExitReason) -> None:
        """The supervisor stopped; reason.detail is 'restart_intensity' on escalation."""


@dataclass(eq=False)
class _Child:
    spec: ChildSpec
    handle: ChildHandle | None = None
    monitor: asyncio.Task[None] | None = None
    restarting: bool = False
    pending: asyncio.Task[None] | None = None
    starting: bool = False  # a dynamic start_child in flight (outside the lock)


def _info(child: _Child) -> ChildInfo:
    spec = child.spec
    return ChildInfo(spec.id, spec.restart, spec.significant, child.handle is not None, child.restarting)


def _validate_flags(strategy: str, max_restarts: int, restart_period: float, auto_shutdown: str) -> None:
    if strategy not in STRATEGIES:
        raise ChildSpecError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if not isinstance(max_restarts, int) or isinstance(max_restarts, bool) or max_restarts < 0:
        raise ChildSpecError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
    if not isinstance(restart_period, int | float) or isinstance(restart_period, bool) or restart_period <= 0:
        raise ChildSpecError(f"restart_period must be seconds > 0, got {restart_period!r}")
    if auto_shutdown not in AUTO_SHUTDOWNS:
        raise ChildSpecError(f"auto_shutdown must be one of {', '.join(AUTO_SHUTDOWNS)}, got {auto_shutdown!r}")


class Supervisor:
    """An OTP supervisor over async children; itself a `ChildHandle`, so supervisors nest."""

    def __init__(
        self,
        id: str = "supervisor",
        *,
        strategy: Strategy = "one_for_one",
        max_restarts: int = 3,
        restart_period: float = 60.0,
        children: Sequence[ChildSpec] = (),
        auto_shutdown: AutoShutdown = "never",
        backoff: Backoff | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        rand: Callable[[], float] = random.random,
        observer: SupervisorObserver | None = None,
        keep_stopped_specs: bool = True,
    ) -> None:
        _validate_flags(strategy, max_restarts, restart_period, auto_shutdown)
        self._id = id
        self.strategy: Strategy = strategy
        self.max_restarts = max_restarts
        self.restart_period = float(restart_period)
        self.auto_shutdown: AutoShutdown = auto_shutdown
        self.backoff = backoff if backoff is not None else Backoff()
        self._clock = clock
        self._sleep = sleep
        self._rand = rand
        self.observer = observer if observer is not None else SupervisorObserver()
        # OTP keeps the spec of a stopped non-temporary child (and one_for_all/rest_for_one start it
        # again with its siblings). False forgets it like a temporary one: a settled or retired agent
        # session must never come back because a sibling crashed (docs/architecture.md §3).
        self.keep_stopped_specs = keep_stopped_specs
        self._tasks: set[asyncio.Task[None]] = set()
        self._inflight: set[asyncio.Event] = set()  # dynamic starts running outside the lock
        self._stop_why = "stop"  # why children are being stopped once the state leaves "running"
        self.shutdown_margin = 5.0  # seconds added to a child's shutdown bound (see _shutdown_limit)
        # by id, in start order (dicts keep insertion order): a launch looks its id up instead of scanning every
        # child, which made each launch cost grow with the number of children (docs/architecture.md §3)
        self._children: dict[str, _Child] = {}
        for spec in children:
            self._check_spec(spec)
            if self._find(spec.id) is not None:
                raise ChildSpecError(f"duplicate child id {spec.id!r} in supervisor {id!r}")
            self._children[spec.id] = _Child(spec)
        self._restarts: deque[float] = deque()
        self._lock = asyncio.Lock()
        self._state: SupervisorState = "new"
        self._exited = asyncio.Event()
        self._exit_reason: ExitReason | None = None
        self.escalated_by: tuple[str, ExitReason] | None = None

    # ----- introspection -------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self._id

    @property
    def state(self) -> SupervisorState:
        return self._state

    @property
    def exit_reason(self) -> ExitReason | None:
        return self._exit_reason

    def which_children(self) -> list[ChildInfo]:
        """Children in start order."""
        return [_info(c) for c in self._children.values()]

    def child_info(self, child_id: str) -> ChildInfo | None:
        """One child as `which_children` reports it (None: no such child), without listing the others."""
        child = self._find(child_id)
        return _info(child) if child is not None else None

    def handle_of(self, child_id: str) -> ChildHandle | None:
        child = self._find(child_id)
        return child.handle if child is not None else None

    def restarts_in_window(self) -> int:
        self._prune(self._clock())
        return len(self._restarts)

    # ----- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Start every child in order; if one fails, stop the started ones (reverse) and raise StartFailed."""
        if self._state != "new":
            raise SupervisorNotRunning(f"supervisor {self._id!r} cannot start from state {self._state}")
        self._state = "running"
        async with self._lock:
            for child in list(self._children.values()):
                if self._state != "running":
                    break
                try:
                    await self._start_locked(child, restart=False)
                except StartFailed as exc:
                    await self._terminate_all_locked(brutal=False, why="stop")
                    self._finish(ExitReason.abnormal(f"start_failed:{child.spec.id}"))
                    raise exc

    async def stop(self, reason: ExitReason | None = None, *, brutal: bool = False) -> ExitReason:
        """Stop all children in reverse start order and exit; never restarts anything once called.

        The children's stop cause is `reason.detail` (e.g. "session-shutdown")."""
        if self._state == "new":
            self._finish(reason or ExitReason.shutdown())
        if self._exit_reason is not None:
            await asyncio.gather(*(done.wait() for done in list(self._inflight)))
            return self._exit_reason
        self._state = "stopping"
        self._cancel_pending()
        async with self._lock:
            if self._exit_reason is None:
                await self._terminate_all_locked(brutal=brutal, why="stop",
                                                 cause=reason.detail if reason is not None else None)
            inflight = list(self._inflight)
        # starts still in flight shut their new child down themselves; wait for them to finish
        await asyncio.gather(*(done.wait() for done in inflight))
        self._finish(reason or ExitReason.shutdown())
        assert self._exit_reason is not None
        return self._exit_reason

    async def wait_exit(self) -> ExitReason:
        await self._exited.wait()
        assert self._exit_reason is not None
        return self._exit_reason

    async def shutdown(self, mode: ShutdownMode, cause: str | None = None) -> None:
        """ChildHandle: a parent stops this supervisor (brutal_kill propagates to every child, and so does the
        parent's stop cause)."""
        await self.stop(ExitReason.shutdown(cause) if cause else ExitReason.shutdown(), brutal=mode == BRUTAL_KILL)

    # ----- dynamic children ------------------------------------------------------------------------
    async def start_child(self, spec: ChildSpec) -> ChildHandle:
        """Start and add a child at the end of the start order (OTP start_child).

        Beyond OTP: the start itself runs outside the supervisor's lock, so many children can be
        started at once (a worker's start waits for its `ready`). The child's place in the start
        order is reserved first; restarts and stops leave a starting child alone, and if the
        supervisor stopped meanwhile the new child is shut down and SupervisorNotRunning raised.
        """
        self._check_spec(spec)
        async with self._lock:
            self._require_running()
            existing = self._find(spec.id)
            if existing is not None:
                state = "running" if existing.handle is not None or existing.starting else "present"
                raise ChildAlreadyPresent(f"child {spec.id!r} is already {state} in supervisor {self._id!r}")
            child = _Child(spec, starting=True)
            self._children[spec.id] = child
            done = asyncio.Event()
            self._inflight.add(done)
        try:
            return await self._start_dynamic(child)
        finally:
            self._inflight.discard(done)
            done.set()

    async def _start_dynamic(self, child: _Child) -> ChildHandle:
        try:
            handle = await self._call_start(child)
        except BaseException:
            async with self._lock:
                child.starting = False
                self._remove(child)
            raise
        async with self._lock:
            child.starting = False
            if self._state == "running" and self._has(child):
                self._install(child, handle, restart=False)
                return handle
            self._remove(child)
        error: Exception | None = None
        try:
            await handle.shutdown(child.spec.shutdown)
        except Exception as exc:
            error = exc
        self._notify("child_terminated", child.spec.id, error, why=self._stop_why)
        raise SupervisorNotRunning(f"supervisor {self._id!r} stopped while {child.spec.id!r} was starting")

    async def terminate_child(self, child_id: str, *, brutal: bool = False, cause: str | None = None) -> None:
        """Stop a child without restarting it; its spec stays unless it is temporary (OTP).

        If the handle's shutdown raised (e.g. RetireFailed), the child is still detached and the
        error is re-raised here, so a caller never mistakes a failed stop for a done one.
        """
        async with self._lock:
            child = self._get(child_id)
            if child.starting:
                raise ChildRunning(f"child {child_id!r} is still starting; terminate it once start_child returned")
            self._cancel_child_pending(child)
            error = await self._terminate_locked(child, brutal=brutal, why="terminate_child", cause=cause)
            if child.spec.restart == "temporary" or not self.keep_stopped_specs:
                self._remove(child)
        if error is not None:
            raise error

    async def delete_child(self, child_id: str) -> None:
        """Forget a stopped child's spec."""
        async with self._lock:
            child = self._get(child_id)
            if child.handle is not None or child.restarting or child.starting:
                raise ChildRunning(f"child {child_id!r} is running; terminate_child it first")
            self._remove(child)

    async def restart_child(self, child_id: str) -> ChildHandle:
        """Start a stopped child again (not counted against the intensity, as OTP)."""
        async with self._lock:
            self._require_running()
            child = self._get(child_id)
            if child.handle is not None or child.restarting or child.starting:
                raise ChildRunning(f"child {child_id!r} is already running, starting or restarting")
            return await self._start_locked(child, restart=False)

    # ----- internals: starting and stopping ----------------------------------------------------
    def _check_spec(self, spec: ChildSpec) -> None:
        if not isinstance(spec, ChildSpec):
            raise ChildSpecError(f"expected a ChildSpec, got {type(spec).__name__}")
        if spec.significant and self.auto_shutdown == "never":
            raise ChildSpecError(
                f"child {spec.id!r} is significant but supervisor {self._id!r} has auto_shutdown='never'; "
                "set auto_shutdown to any_significant or all_significant, or significant=False"
            )

    def _require_running(self) -> None:
        if self._state != "running":
            raise SupervisorNotRunning(f"supervisor {self._id!r} is {self._state}")

    def _find(self, child_id: str) -> _Child | None:
        return self._children.get(child_id)

    def _has(self, child: _Child) -> bool:
        return self._children.get(child.spec.id) is child

    def _remove(self, child: _Child) -> None:
        if self._has(child):
            del self._children[child.spec.id]

    def _get(self, child_id: str) -> _Child:
        child = self._find(child_id)
        if child is None:
            raise ChildNotFound(f"no child {child_id!r} in supervisor {self._id!r}")
        return child

    async def _call_start(self, child: _Child) -> ChildHandle:
        try:
            handle = await child.spec.start()
            if not isinstance(handle, ChildHandle):
                raise TypeError(f"start returned {type(handle).__name__}, not a ChildHandle")
        except Exception as exc:
            self._notify("child_start_failed", child.spec.id, exc)
            raise StartFailed(child.spec.id, exc) from exc
        return handle

    def _install(self, child: _Child, handle: ChildHandle, *, restart: bool) -> None:
        child.handle = handle
        child.restarting = False
        child.monitor = asyncio.create_task(self._monitor(child, handle), name=f"monitor:{child.spec.id}")
        self._notify("child_started", child.spec.id, handle, restart=restart)

    async def _start_locked(self, child: _Child, *, restart: bool) -> ChildHandle:
        handle = await self._call_start(child)
        self._install(child, handle, restart=restart)
        return handle

    async def _terminate_locked(self, child: _Child, *, brutal: bool, why: str,
                                cause: str | None = None) -> Exception | None:
        handle, monitor = child.handle, child.monitor
        child.handle, child.monitor = None, None
        was_restarting, child.restarting = child.restarting, False
        if handle is None:
            if was_restarting:  # stopped while waiting for its restart: it is stopped for good now
                self._notify("child_terminated", child.spec.id, None, why=why, cause=cause)
            return None
        error: Exception | None = None
        mode: ShutdownMode = BRUTAL_KILL if brutal else child.spec.shutdown
        limit = None if isinstance(handle, Supervisor) else self._shutdown_limit(mode)
        try:
            stopping = handle.shutdown(mode, cause) if isinstance(handle, Supervisor) else handle.shutdown(mode)
            await asyncio.wait_for(stopping, limit)
        except TimeoutError:
            error = ShutdownTimeout(
                f"child {child.spec.id!r} did not finish shutting down within {limit:.1f}s "
                f"(mode {mode!r}); it may still be running"
            )
            logger.error("supervisor {}: {}", self._id, error)
        except Exception as exc:
            error = exc
            logger.error("supervisor {}: shutdown of child {} failed: {!r}", self._id, child.spec.id, exc)
        finally:
            if monitor is not None and monitor is not asyncio.current_task():
                monitor.cancel()
        self._notify("child_terminated", child.spec.id, error, why=why, cause=cause)
        return error

    def _shutdown_limit(self, mode: ShutdownMode) -> float:
        """How long a (non-supervisor) child may take to stop: twice its whole ladder plus a margin.

        OTP bounds a worker's shutdown by its timeout; a handle that outlives even this bound is
        cancelled and reported (ShutdownTimeout), so one stuck child never wedges its supervisor.
        Nested supervisors are never bounded (OTP's `infinity` for supervisor children).
        """
        ladder = mode if isinstance(mode, RetireTimeouts) else RetireTimeouts(retire=0.0)
        return 2 * (ladder.retire + 2 * (ladder.signal + ladder.kill)) + self.shutdown_margin

    async def _terminate_all_locked(self, *, brutal: bool, why: str, cause: str | None = None) -> None:
        self._cancel_pending()
        children = list(reversed(self._children.values()))
        # settled children hold only finished work and nothing depends on them: they stop all at once, first; the
        # others one by one in reverse start order (OTP). A run's end stops hundreds of settled rpc workers, and
        # one after the other that took seconds (docs/architecture.md §3)
        idle = [c for c in children if getattr(c.handle, "settled", False) is True]
        if idle:
            await asyncio.gather(*(self._terminate_locked(c, brutal=brutal, why=why, cause=cause) for c in idle))
        for child in children:
            if child not in idle:
                await self._terminate_locked(child, brutal=brutal, why=why, cause=cause)

    def _finish(self, reason: ExitReason) -> None:
        self._state = "stopped"
        if self._exit_reason is None:
            self._exit_reason = reason
            self._exited.set()
            self._notify("supervisor_exited", reason)

    def _cancel_child_pending(self, child: _Child) -> None:
        task, child.pending = child.pending, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def _cancel_pending(self) -> None:
        for child in self._children.values():
            if child.pending is not None:
                self._cancel_child_pending(child)

    # ----- internals: exits and restarts -------------------------------------------------------
    async def _monitor(self, child: _Child, handle: ChildHandle) -> None:
        try:
            reason = await handle.wait_exit()
            if not isinstance(reason, ExitReason):
                reason = ExitReason.abnormal(f"bad exit reason {reason!r}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reason = ExitReason.abnormal(f"wait_exit raised {exc!r}")
        await self._child_exited(child, handle, reason)

    async def _child_exited(self, child: _Child, handle: ChildHandle, reason: ExitReason) -> None:
        async with self._lock:
            if child.handle is not handle:
                return  # the supervisor stopped this child itself; not an exit to act on
            child.handle, child.monitor = None, None
            if self._state != "running":
                # exited on its own while we were stopping: stopped for good, reported like the rest
                self._notify("child_terminated", child.spec.id, None, why=self._stop_why)
                return
            if getattr(handle, "settled", False) is True:
                # its work had ended: the process was a cache of it, so its loss is no crash — not restarted,
                # not counted toward the intensity, its spec forgotten (a later start is a fresh start_child)
                self._remove(child)
                self._notify("settled_child_exited", child.spec.id, reason)
                return
            if should_restart(child.spec.restart, reason):
                await self._restart_locked(child, reason)
                return
            self._notify("child_exited", child.spec.id, reason, restarting=False)
            if child.spec.restart == "temporary" or not self.keep_stopped_specs:
                self._remove(child)
            if self._auto_shutdown_due(child):
                self._state, self._stop_why = "stopping", "auto_shutdown"
                await self._terminate_all_locked(brutal=False, why="auto_shutdown")
                self._finish(ExitReason.shutdown("auto_shutdown"))

    def _auto_shutdown_due(self, child: _Child) -> bool:
        if self.auto_shutdown == "never" or not child.spec.significant:
            return False
        if self.auto_shutdown == "any_significant":
            return True
        return not any(
            c.spec.significant and (c.handle is not None or c.restarting or c.starting) for c in self._children.values()
        )

    def _prune(self, now: float) -> None:
        threshold = now - self.restart_period
        while self._restarts and self._restarts[0] < threshold:
            self._restarts.popleft()

    def _add_restart(self) -> int:
        now = self._clock()
        self._prune(now)
        self._restarts.append(now)
        return len(self._restarts)

    async def _restart_locked(self, child: _Child, reason: ExitReason) -> None:
        """Count the restart; escalate past the intensity, else restart now (1st) or after a backoff."""
        nth = self._add_restart()
        if nth > self.max_restarts:
            logger.warning(
                "supervisor {}: restart intensity {} in {}s exceeded by {} ({}); shutting down",
                self._id, self.max_restarts, self.restart_period, child.spec.id, reason,
            )
            self.escalated_by, self._state, self._stop_why = (child.spec.id, reason), "stopping", RESTART_INTENSITY
            self._notify("child_exited", child.spec.id, reason, restarting=False)
            await self._escalate_locked(child.spec.id, reason)
            return
        self._notify("child_exited", child.spec.id, reason, restarting=True)
        child.restarting = True
        delay = self.backoff.delay(nth, self._rand())
        if delay <= 0:
            await self._restart_by_strategy_locked(child)
        else:
            child.pending = self._background(self._delayed_restart(child, delay), f"restart:{child.spec.id}")

    async def _escalate_locked(self, child_id: str, reason: ExitReason) -> None:
        """Past the intensity: stop every child (reverse order) and exit abnormal(restart_intensity)."""
        self.escalated_by = (child_id, reason)
        self._state, self._stop_why = "stopping", RESTART_INTENSITY
        await self._terminate_all_locked(brutal=False, why=RESTART_INTENSITY)
        self._finish(ExitReason.abnormal(RESTART_INTENSITY))

    async def _delayed_restart(self, child: _Child, delay: float) -> None:
        await self._sleep(delay)
        async with self._lock:
            if child.pending is asyncio.current_task():
                child.pending = None
            if self._state == "running" and child.restarting and self._has(child):
                await self._restart_by_strategy_locked(child)

    def _restart_targets(self, child: _Child) -> list[_Child]:
        if self.strategy == "one_for_one":
            return [child]
        order = list(self._children.values())
        if self.strategy == "one_for_all":
            others = [c for c in order if c is not child]
        else:
            others = order[order.index(child) + 1 :]
        return [child, *others]

    async def _restart_by_strategy_locked(self, child: _Child) -> None:
        targets = self._restart_targets(child)
        for other in reversed(targets[1:]):
            self._cancel_child_pending(other)
            temporary = other.spec.restart == "temporary"
            await self._terminate_locked(other, brutal=False, why=BYSTANDER if temporary else "strategy")
            if temporary:
                self._remove(other)
        for target in [c for c in self._children.values() if c in targets]:  # start order
            if self._state != "running":
                return
            if target.handle is not None or target.starting:
                continue
            try:
                await self._start_locked(target, restart=True)
            except StartFailed as exc:
                logger.warning("supervisor {}: restart of {} failed: {!r}", self._id, target.spec.id, exc.cause)
                await self._restart_failed_locked(target, exc)
                return

    async def _restart_failed_locked(self, child: _Child, exc: StartFailed) -> None:
        """OTP try-again: a failed restart counts again; the retry runs as its own task."""
        nth = self._add_restart()
        if nth > self.max_restarts:
            reason = ExitReason.abnormal(f"start_failed: {exc.cause!r}")
            child.restarting = False
            self.escalated_by, self._state, self._stop_why = (child.spec.id, reason), "stopping", RESTART_INTENSITY
            self._notify("child_exited", child.spec.id, reason, restarting=False)
            await self._escalate_locked(child.spec.id, reason)
            return
        child.restarting = True
        delay = self.backoff.delay(nth, self._rand())
        child.pending = self._background(self._delayed_restart(child, delay), f"retry:{child.spec.id}")

    def _background(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)  # a strong reference until it is done (asyncio only keeps weak ones)
        task.add_done_callback(self._tasks.discard)
        return task

    def _notify(self, method: str, *args: object, **kwargs: object) -> None:
        try:
            getattr(self.observer, method)(self, *args, **kwargs)
        except Exception as exc:
            logger.error("supervisor {}: observer {} raised {!r}", self._id, method, exc)


def supervisor_spec(
    id: str,
    make: Callable[[], Supervisor],
    *,
    restart: RestartType = "transient",
    significant: bool = False,
) -> ChildSpec:
    """A ChildSpec whose child is a fresh nested supervisor built by `make` on every (re)start."""

    async def start() -> ChildHandle:
        sup = make()
        await sup.start()
        return sup

    return ChildSpec(id=id, start=start, restart=restart, shutdown=RetireTimeouts(), significant=significant)
