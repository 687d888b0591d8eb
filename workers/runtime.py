"""The in-worker side of every rpc worker process: control channel, heartbeat, lifeline, main coroutine.

`run_worker(ctx)` is what the fork server calls inside a freshly forked worker: it configures loguru,
loads the entry (`"module:function"`, an `async def main(rt: WorkerRuntime) -> int`), and runs it
under a `WorkerRuntime`. The runtime connects a DEALER to the root's ROUTER — its identity is the
one the root made for this incarnation and handed over through the fork server (`WorkerContext.identity`;
the worker id when None), its sender name the worker id — sends `ready`, starts the 1 s application heartbeat and watches the lifeline: EOF on it (the root
closed it, or the root died) is the graceful stop — the main task is cancelled, shutdown callbacks
run and the worker exits 0. However `run` ends (return, crash, graceful stop), the worker then sweeps
its own descendants (it is a child subreaper, so double-forked daemons are among them): a worker that
exits takes its process tree with it, including when it leaves because the root died.

`WorkerRuntime` offers `ready()` (an entry that sets `main.auto_ready = False` reports ready itself,
e.g. after loading state), `on_shutdown(cb)`, `args`, `lifeline_fd`, `stop_requested` (lifeline EOF or a
"shutdown" message), `handlers` (message type -> async handler for root messages; "shutdown" is built
in) and `beat_with(fn)` (extra heartbeat fields; `fn()` returning None skips a beat). `control` is None when the worker was started without a control endpoint (process-mechanics
tests only). SIGTERM keeps its default action (immediate exit): the graceful path is the lifeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import os
import select
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from loguru import logger

from legion.procs import Cgroup, ProcRef, has_children, pidfd_exited, reap, snapshot_descendants, sweep

if TYPE_CHECKING:
    import zmq.asyncio

    from legion.bus.control import ControlClient
    from legion.bus.protocol import Message

Handler = Callable[["Message"], Awaitable[dict[str, Any] | None]]

__all__ = ["EXIT_BAD_ENTRY", "EXIT_CRASH", "EXIT_START_FAILED", "EntryError", "WorkerContext", "WorkerRuntime", "load_entry", "preconfigure_logging", "run_worker"]

Main = Callable[["WorkerRuntime"], Awaitable[int]]
ShutdownCallback = Callable[[], Awaitable[None] | None]

EXIT_CRASH = 1  # the main coroutine raised
EXIT_BAD_ENTRY = 78  # the entry could not be loaded (EX_CONFIG)
EXIT_START_FAILED = 71  # the control channel could not be set up or `ready` not sent (EX_OSERR)
# The worker's own exit sweep goes round until no descendant is left: what a descendant starts from its TERM
# handler re-parents to us (the subreaper) and a chain of such forks is one generation per round. A time bound,
# not a round count, ends a chain that never stops; what is left then is the root's (its post-exit sweep).
_SELF_SWEEP_S = 3.0
_STANDBY_EXIT_S = 1.0  # the longest `start` waits for the fork server's intermediate to exit
GRACEFUL_CANCEL_TIMEOUT = 3.0  # how long a cancelled main may take to unwind on lifeline EOF


class EntryError(ValueError):
    """The worker entry string is malformed or does not name an async callable."""


@dataclass(frozen=True)
class WorkerContext:
    """What a worker process is told at fork time."""

    worker_id: str
    entry: str
    lifeline_fd: int
    args: dict[str, Any] = field(default_factory=dict)
    control_endpoint: str | None = None
    log_path: str | None = None
    heartbeat_interval: float = 1.0
    identity: str | None = None  # this incarnation's bus identity, from the root (None: the worker id)
    descendant_timeout: float = 0.5  # TERM -> KILL wait when the worker takes its own tree down
    cgroup: str | None = None  # the worker's own cgroup (cgroup containment), else None
    root_pidfd: int | None = None  # a pidfd of the root: a worker whose root died kills its own cgroup
    # the fork server's intermediate that forked us: it is in our cgroup until its exit, which `start` waits for
    standby_pid: int | None = None


def load_entry(entry: str) -> Main:
    """Resolve `"package.module:function"` to an async callable."""
    module_name, sep, func_name = entry.partition(":")
    if not sep or not module_name or not func_name:
        raise EntryError(f"worker entry {entry!r} must look like 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EntryError(f"worker entry {entry!r}: cannot import {module_name!r}: {exc}") from exc
    func = getattr(module, func_name, None)
    if func is None or not callable(func):
        raise EntryError(f"worker entry {entry!r}: {module_name} has no callable {func_name!r}")
    if not inspect.iscoroutinefunction(func):
        raise EntryError(f"worker entry {entry!r} must be an 'async def' taking the WorkerRuntime")
    return func


class WorkerRuntime:
    """Runs inside the worker after fork; owns the worker's zmq context and control DEALER."""

    def __init__(self, ctx: WorkerContext, *, owns_process: bool = False) -> None:
        """`owns_process`: this runtime is the whole process (a forked worker), so on exit it sweeps
        every descendant of the process; never set it when embedding a runtime in another program."""
        self.ctx = ctx
        self.owns_process = owns_process
        self.worker_id = ctx.worker_id
        self.args = ctx.args
        self.lifeline_fd = ctx.lifeline_fd
        self.lifeline_closed = asyncio.Event()
        self.control: ControlClient | None = None
        self._zmq_ctx: zmq.asyncio.Context | None = None
        self.stop_requested = asyncio.Event()  # lifeline EOF or a "shutdown" message
        self.handlers: dict[str, Handler] = {}  # message type -> handler for root messages
        # extra heartbeat fields (e.g. a session's in-flight tool stack and last activity time): `beat_with`
        self.heartbeat_info: Callable[[], dict[str, Any] | None] | None = None
        self._shutdown: list[ShutdownCallback] = []
        self._started = False
        self._ready_sent = False

    def on_shutdown(self, callback: ShutdownCallback) -> None:
        """Register a callback run (in reverse order) when the worker stops."""
        self._shutdown.append(callback)

    def beat_with(self, info: Callable[[], dict[str, Any] | None]) -> None:
        """Add the fields `info()` returns to every heartbeat (one source per worker); None skips the beat."""
        self.heartbeat_info = info

    async def start(self) -> None:
        """Watch the lifeline, connect the control DEALER and start the app heartbeat."""
        if self._started:
            return
        self._started = True
        await self._standby_gone()
        loop = asyncio.get_running_loop()
        os.set_blocking(self.lifeline_fd, False)
        loop.add_reader(self.lifeline_fd, self._on_lifeline)
        if self.ctx.control_endpoint:
            import zmq.asyncio

            from legion.bus.control import ControlClient  # preloaded by the fork server

            # our own context, so _stop can term() it: that flushes queued frames (a last reply,
            # `ready` of a worker that exits at once) within the socket linger before the process exits
            self._zmq_ctx = zmq.asyncio.Context()
            self.control = ControlClient(self.ctx.control_endpoint, self.ctx.identity or self.worker_id,
                                         name=self.worker_id, on_message=self._on_message,
                                         context=self._zmq_ctx)  # fmt: skip
            await self.control.connect()
            self.control.start_heartbeat(self.ctx.heartbeat_interval, self._heartbeat_payload)

    async def ready(self, extra: dict[str, Any] | None = None) -> None:
        """Tell the root this worker is ready (once)."""
        if self._ready_sent:
            return
        self._ready_sent = True
        body = {"pid": os.getpid(), "pgid": os.getpgrp(), **(extra or {})}
        if self.control is not None:
            await self.control.send("ready", body)
        logger.debug("worker {} ready", self.worker_id)

    async def _standby_gone(self) -> None:
        """Wait (≤ 1 s) until the intermediate that forked us has left our cgroup: once the root hears from us,
        the cgroup holds this worker's own tree only (a retire's snapshot counts no stranger). It exits right
        after forking us, so this is one getppid() unless the machine is loaded."""
        standby = self.ctx.standby_pid
        if standby is None or self.ctx.cgroup is None or os.getppid() != standby:
            return  # re-parented: the standby has run its cgroup exit already (it comes before the re-parenting)
        try:
            fd = os.pidfd_open(standby)
        except OSError:
            return
        gone = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_reader(fd, gone.set)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gone.wait(), _STANDBY_EXIT_S)
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    async def _on_message(self, msg: Message) -> dict[str, Any] | None:
        if msg.type == "shutdown":
            logger.debug("worker {}: shutdown requested by the root ({})", self.worker_id, msg.body.get("reason"))
            # stop only after this reply went out: closing the DEALER would cancel the reply task
            asyncio.get_running_loop().call_soon(self.stop_requested.set)
            return {"ok": True}
        handler = self.handlers.get(msg.type)
        if handler is None:
            if msg.corr is not None:
                raise LookupError(f"worker {self.worker_id} has no handler for {msg.type!r}")
            logger.debug("worker {}: ignoring {!r} (no handler)", self.worker_id, msg.type)
            return None
        return await handler(msg)

    def _heartbeat_payload(self) -> dict[str, Any] | None:
        body: dict[str, Any] = {"pid": os.getpid()}
        if self.heartbeat_info is not None:
            extra = self.heartbeat_info()  # an exception here is logged by the bus; beat still sent
            if extra is None:
                return None  # quiet: nothing in flight, and the root does not watch it
            body.update(extra)
        return body

    def _on_lifeline(self) -> None:
        try:
            data = os.read(self.lifeline_fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            return  # nothing is ever written; only EOF carries meaning
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self.lifeline_fd)
        self.lifeline_closed.set()
        self.stop_requested.set()

    def _lifeline_at_eof(self) -> bool:
        poller = select.poll()
        poller.register(self.lifeline_fd, select.POLLIN)
        if not poller.poll(0):
            return False
        try:
            return os.read(self.lifeline_fd, 1) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    async def run(self, main: Main) -> int:
        """Run `main` until it returns or the lifeline closes; returns the exit code."""
        if self._lifeline_at_eof():
            # closed before we began (a spawn the root abandoned, e.g. its fork server died before
            # replying): never connect, so no frame of ours can claim this worker id
            logger.debug("worker {}: lifeline closed before start; exiting", self.worker_id)
            self.lifeline_closed.set()
            await self._stop()
            return 0
        try:
            await self.start()
            if getattr(main, "auto_ready", True):
                await self.ready()
        except Exception as exc:
            logger.error("worker {} could not start (control endpoint {!r}): {}: {}", self.worker_id,
                         self.ctx.control_endpoint, type(exc).__name__, exc)  # fmt: skip
            await self._stop()
            return EXIT_START_FAILED
        main_task = asyncio.ensure_future(main(self))
        eof_task = asyncio.ensure_future(self.stop_requested.wait())
        await asyncio.wait({main_task, eof_task}, return_when=asyncio.FIRST_COMPLETED)
        if main_task.done():
            eof_task.cancel()
            code = self._main_result(main_task)
        else:
            logger.debug("worker {}: stopping gracefully (lifeline EOF or shutdown)", self.worker_id)
            main_task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(main_task, GRACEFUL_CANCEL_TIMEOUT)
            code = 0
        await self._stop()
        return code

    def _main_result(self, task: asyncio.Future[int]) -> int:
        if task.cancelled():
            return 0
        exc = task.exception()
        if exc is not None:
            logger.opt(exception=exc).error("worker {} main crashed", self.worker_id)
            return EXIT_CRASH
        result = task.result()
        return result if isinstance(result, int) and not isinstance(result, bool) else 0

    async def _stop(self) -> None:
        for callback in reversed(self._shutdown):
            try:
                maybe = callback()
                if inspect.isawaitable(maybe):
                    await maybe
            except Exception:
                logger.exception("worker {} shutdown callback failed", self.worker_id)
        if self.control is not None:
            with contextlib.suppress(Exception):
                await self.control.close()
        if self._zmq_ctx is not None:
            with contextlib.suppress(Exception):
                self._zmq_ctx.term()  # every socket is closed: returns once flushed (≤ linger)
        if self.owns_process:
            self._take_tree_down()

    def _take_tree_down(self) -> None:
        """Sweep every descendant before exiting (we are a subreaper, so daemons are ours too).

        A worker whose root died ends by killing its own cgroup, itself included: what a descendant
        started from its TERM handler during the sweep (or a pure fork that escaped) dies with it.
        With a live root, the root's ladder does that (and reads the exit code first)."""
        survivors: list[ProcRef] = []
        deadline = time.monotonic() + _SELF_SWEEP_S
        while time.monotonic() < deadline:
            if not has_children():  # we are a subreaper: no child means no descendant at all
                break
            procs = [p for p in snapshot_descendants(os.getpid()) if p not in survivors]
            if not procs:
                break
            survivors += sweep(procs, signal_timeout=self.ctx.descendant_timeout)
            reap(p.pid for p in procs)
        if survivors:
            logger.error("worker {}: {} descendant(s) survived the exit sweep: {}", self.worker_id,
                         len(survivors), [p.pid for p in survivors])  # fmt: skip
        if self.ctx.cgroup is not None and self.ctx.root_pidfd is not None and pidfd_exited(self.ctx.root_pidfd):
            Cgroup(self.ctx.cgroup).kill()


_LOG_FORMAT = "{time:HH:mm:ss.SSS} {level} [{extra[worker]}] {message}"
_log_threshold = [logger.level("INFO").no]
_preconfigured = [False]


def _level_filter(record: Any) -> bool:
    return bool(record["level"].no >= _log_threshold[0])


def preconfigure_logging() -> None:
    """Install the worker log sink once, in the fork server (a loguru `add` costs ~5 ms per call)."""
    logger.remove()
    logger.configure(extra={"worker": "zygote"})
    logger.add(sys.stderr, format=_LOG_FORMAT, level=0, filter=_level_filter, backtrace=False, diagnose=False)
    _preconfigured[0] = True


def _configure_logging(ctx: WorkerContext) -> None:
    """Log to the worker's own file (stderr is redirected there, so C-level output lands too) or stderr."""
    if ctx.log_path:
        fd = os.open(ctx.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        os.dup2(fd, 2)
        os.close(fd)
    sys.stdout.flush()
    os.dup2(2, 1)  # the root's stdout belongs to the CLI (and benches print JSON there): workers log only
    if not _preconfigured[0]:
        preconfigure_logging()
    logger.configure(extra={"worker": ctx.worker_id})
    _log_threshold[0] = logger.level("DEBUG" if ctx.log_path else "INFO").no


def run_worker(ctx: WorkerContext) -> int:
    """The worker process body after fork: returns the process exit code."""
    _configure_logging(ctx)
    try:
        main = load_entry(ctx.entry)
    except EntryError as exc:
        logger.error("{}", exc)
        return EXIT_BAD_ENTRY
    runtime = WorkerRuntime(ctx, owns_process=True)
    return asyncio.run(runtime.run(main))
