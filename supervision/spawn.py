"""Spawning rpc workers through a preloaded fork server, with a lifeline and an observable exit.

`WorkerSpawner.start()` marks the root a child subreaper and starts the zygote
(`legion.supervision.zygote`), which has the heavy imports loaded once. `spawn(WorkerStart)` sends one
request and returns a `WorkerProcess` as soon as the worker is forked; readiness arrives over the bus
(`ready` on the control channel). Each worker:

- leads its own session and process group (pgid == pid), so a group sweep never hits the root;
- holds the read end of a **lifeline** pipe whose write end only the root holds (never the zygote,
  never another worker): `close_lifeline()` is the graceful-retire signal and the root's death closes
  it too; the zygote also dies with the root and sweeps workers that did not leave within its grace;
- runs in its own cgroup under the run's cgroup where the machine allows it (`cgroups`, see
  `legion.procs.cgroup`; `proc.cgroup`), so the retire ladder can end its whole tree with cgroup.kill;
- is re-parented to the root (double fork + subreaper), so the root observes its exit through a
  pidfd (`await proc.wait()`, woken by the event loop the moment the process exits) and reaps it
  with `waitid(P_PIDFD)` — no polling and no SIGCHLD handler that could steal other exit statuses.

A fork server that dies is replaced at once by a watcher thread (blocked on its pidfd), or at the
next `spawn()` / `ensure_running()`, whichever comes first; the replacement adopts the live workers of
its predecessor, so they still die with the root. `close()` stops the fork server, which takes down any worker still alive after its grace, and
turns the subreaper flag off again when the last spawner closes. The fork server's stdout (and so
every worker's) is the root's stderr: only the root holds its stdout.

Why a zygote and not `multiprocess`'s forkserver: measured here (2 cores, loaded), both start a
preloaded child in ~11-13 ms, but the forkserver's children are *its* children (exit status only via
its sentinel), its fds are inherited wholesale, and it offers no double fork or per-child setsid, so
the lifeline/fd hygiene and the root-owned exit status above would need the same amount of code on
top of it. The zygote is ~200 lines and every fd a worker gets is explicit.

`WorkerStart.identity` is the worker's bus identity for this incarnation (the root makes a fresh,
unguessable one per start); it travels only in the request to the fork server, never in argv or the
environment. `control_endpoint` may be None (workers then run without a bus).
`WorkerProcess` is a `legion.procs.ProcessHandle` (pidfd, exit status, signals) plus the lifeline and
its cgroup (`WorkerProcess.cgroup`, under `WorkerSpawner.run_cgroup`; None without cgroups).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from loguru import logger

from legion.procs import (
    UNKNOWN_EXIT,
    Cgroup,
    ProcessHandle,
    ProcRef,
    alive,
    containment,
    is_child_subreaper,
    set_child_subreaper,
)
from legion.procs.cgroup import create_run_cgroup
from legion.procs.interpreter import boot_command, import_failure

__all__ = [
    "DEFAULT_PRELOAD",
    "MAX_REQUEST_BYTES",
    "UNKNOWN_EXIT",
    "EarlyForkServer",
    "SpawnError",
    "WorkerProcess",
    "WorkerSpawner",
    "WorkerStart",
]

DEFAULT_PRELOAD: tuple[str, ...] = (
    "asyncio",
    "zmq",
    "zmq.asyncio",
    "orjson",
    "psutil",
    "loguru",
    "sqlalchemy",
    "sqlalchemy.dialects.sqlite",
    "legion.bus.protocol",
    "legion.bus.control",
    "legion.ledger",
    "legion.ledger.writer",  # every worker with a ledger starts a LedgerWriter: ~4 ms of import each, paid once here
    "legion.procs",
    "legion.workers.runtime",
)

_ENTRY_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_MAX_REPLY = 64 * 1024
MAX_REQUEST_BYTES = 128 * 1024  # one SOCK_SEQPACKET datagram; the zygote accepts up to twice this
# spawners that turned the subreaper flag on; the last one to close turns it off again, so a test
# process (or a library user) does not keep inheriting every orphan after its spawners are gone
_subreaper_users: list[WorkerSpawner] = []
_subreaper_lock = threading.Lock()


def _stderr_fd() -> int:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by something without a descriptor
        return 2


# Lifeline write ends and fork-server sockets held by this process. A plain fork() of the root (a
# library using multiprocessing's "fork" start method, say) would copy them into a child that keeps
# every lifeline, and the fork server's connection, open after the root dies; the child closes its
# copies at once.
_LIFELINES: set[int] = set()


def _close_lifelines_in_child() -> None:
    for fd in list(_LIFELINES):
        with contextlib.suppress(OSError):
            os.close(fd)
    _LIFELINES.clear()


os.register_at_fork(after_in_child=_close_lifelines_in_child)


class SpawnError(RuntimeError):
    """A worker could not be spawned (bad start spec, or the fork server failed)."""


class EarlyForkServer:
    """A fork server started ahead of its spawner, still loading its preload (`legion run`'s head start).

    `EarlyForkServer.start(preload)` starts it and returns at once: its imports (~0.35 s) then run on another core
    while the caller imports and prepares the rest of the run (`legion run`: about a third of its startup). The
    caller hands it to the run's `WorkerSpawner` (through `RootSupervisor`), which adopts it if it fits: the same
    settings, environment and working directory (else it stops it and starts its own). One that is never handed
    over is stopped at the process's exit."""

    def __init__(self, key: tuple[object, ...], proc: subprocess.Popen[bytes], sock: socket.socket,
                 run_cgroup: Cgroup | None, containment_reason: str) -> None:
        self.key = key  # the spawner settings it was started with
        self.proc = proc
        self.sock = sock
        self.run_cgroup = run_cgroup
        self.containment_reason = containment_reason
        self.env = dict(os.environ)  # what it inherited: a process that changed either since starts its own
        self.cwd = os.getcwd()
        self.taken = False
        atexit.register(self.discard)

    @classmethod
    def start(cls, preload: Sequence[str] = DEFAULT_PRELOAD, *, zygote_grace: float = 0.5,
              zygote_signal_timeout: float = 0.5, cgroups: bool | None = None) -> EarlyForkServer:
        """Start it; the arguments are `WorkerSpawner`'s, which must match for the spawner to adopt it."""
        run_cgroup, reason = _run_cgroup(cgroups)
        try:
            proc, sock = _launch_zygote(preload, zygote_grace, zygote_signal_timeout, run_cgroup)
        except BaseException:
            if run_cgroup is not None:
                run_cgroup.kill_and_remove(1.0)
            raise
        return cls(_spawner_key(preload, zygote_grace, zygote_signal_timeout, cgroups), proc, sock, run_cgroup, reason)

    def take(self, key: tuple[object, ...]) -> bool:
        """Hand it over to a spawner with settings `key`: True if it fits (it is the spawner's now), else it is
        stopped (and False). Only once."""
        if self.taken:
            return False
        misfit = [what for what, same in (("settings", self.key == key), ("environment", self.env == dict(os.environ)),
                                          ("working directory", self.cwd == os.getcwd())) if not same]
        if misfit:
            logger.debug("the fork server {} started ahead differs in its {}: stopped, a fresh one starts",
                         self.proc.pid, " and ".join(misfit))
            self.discard()
            return False
        self.taken = True
        atexit.unregister(self.discard)
        logger.debug("adopting the fork server {} started ahead of the run", self.proc.pid)
        return True

    def discard(self) -> None:
        """Stop it unused, at once: it has no worker, and waiting for its imports to end would hold up the exit of
        a run that was refused. SIGTERM to its group (it and its one forked-ahead intermediate); its empty run
        cgroup goes too."""
        if self.taken:
            return
        self.taken = True
        atexit.unregister(self.discard)
        _LIFELINES.discard(self.sock.fileno())
        self.sock.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=2.0)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.run_cgroup is not None:
            self.run_cgroup.kill_and_remove(1.0)


def _spawner_key(preload: Sequence[str], grace: float, signal_timeout: float, cgroups: bool | None) -> tuple[object, ...]:
    return tuple(preload), grace, signal_timeout, cgroups


def _run_cgroup(cgroups: bool | None) -> tuple[Cgroup | None, str]:
    """The run's cgroup where the machine allows it (and why not, else): the pid/pgid ladder is the path then."""
    decision = containment({} if cgroups else None)
    reason = decision.reason
    if decision.cgroups and decision.parent is not None:
        try:
            return create_run_cgroup(decision.parent), reason
        except OSError as exc:
            reason = f"creating a run cgroup under {decision.parent} failed: {exc}"
    if cgroups:
        logger.warning("cgroup containment unavailable ({}); using the pid/pgid retire ladder", reason)
    return None, reason


def _launch_zygote(preload: Sequence[str], grace: float, signal_timeout: float,
                   run_cgroup: Cgroup | None) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """Start a fork server; returns it and our end of its socket, on which its hello comes once it is ready."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    # python -P (legion.procs.interpreter): the user's project is our cwd and must not shadow our imports
    cmd = [
        *boot_command("legion.supervision.zygote"),
        "--fd", str(theirs.fileno()), "--preload", ",".join(preload),
        "--grace", str(grace), "--signal-timeout", str(signal_timeout),
    ]  # fmt: skip
    if run_cgroup is not None:
        cmd += ["--cgroup", str(run_cgroup.path)]
    try:
        # stdout -> our stderr: the root's stdout belongs to the CLI, and a reader waiting for its
        # EOF must not wait for the fork server (or a worker) to exit as well
        proc = subprocess.Popen(cmd, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=_stderr_fd(),
                                process_group=0)  # fmt: skip
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    _LIFELINES.add(ours.fileno())
    return proc, ours


@dataclass
class WorkerStart:
    """What to run in a new worker process."""

    worker_id: str
    entry: str  # "legion.workers.fixture_worker:main"
    args: dict[str, Any]
    cwd: str | None = None
    env: dict[str, str] | None = None
    log_path: str | None = None
    heartbeat_interval: float = 1.0
    identity: str | None = None  # bus identity of this incarnation (default: worker_id); never in argv/env

    def validate(self) -> None:
        """Raise SpawnError naming the bad field and how to fix it."""
        if not isinstance(self.worker_id, str) or not self.worker_id or len(self.worker_id.encode()) > 255:
            raise SpawnError(f"WorkerStart.worker_id must be a non-empty string of ≤ 255 bytes, got {self.worker_id!r}")
        if self.worker_id.startswith("\0"):
            raise SpawnError("WorkerStart.worker_id must not start with NUL (reserved by ZeroMQ identities)")
        if self.identity is not None and (not isinstance(self.identity, str) or not self.identity
                                          or len(self.identity.encode()) > 255 or self.identity.startswith("\0")):
            raise SpawnError(f"WorkerStart.identity must be None or 1–255 bytes not starting with NUL, got {self.identity!r}")
        if not isinstance(self.entry, str) or not _ENTRY_RE.match(self.entry):
            raise SpawnError(f"WorkerStart.entry must look like 'package.module:function', got {self.entry!r}")
        if not isinstance(self.args, dict):
            raise SpawnError(f"WorkerStart.args must be a dict, got {type(self.args).__name__}")
        if self.cwd is not None and not os.path.isdir(self.cwd):
            raise SpawnError(f"WorkerStart.cwd {self.cwd!r} is not a directory")
        if self.env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()):
            raise SpawnError("WorkerStart.env must map str to str")
        if not self.heartbeat_interval > 0:
            raise SpawnError("WorkerStart.heartbeat_interval must be > 0 seconds")


class WorkerProcess(ProcessHandle):
    """Root-side handle of one worker: the process (pidfd, exit status; `legion.procs.ProcessHandle`),
    its lifeline write end and its cgroup (None without cgroup containment)."""

    def __init__(self, worker_id: str, pid: int, lifeline_w: int, pidfd: int | None, create_time: float,
                 cgroup: Cgroup | None = None) -> None:  # fmt: skip
        super().__init__(pid, pidfd, create_time)
        self.worker_id = worker_id
        self.cgroup = cgroup
        self._lifeline_w: int | None = lifeline_w
        _LIFELINES.add(lifeline_w)

    def __repr__(self) -> str:
        return f"WorkerProcess({self.worker_id!r}, pid={self.pid}, returncode={self._returncode})"

    @property
    def lifeline_open(self) -> bool:
        return self._lifeline_w is not None

    def close_lifeline(self) -> None:
        """Close the lifeline's write end: EOF in the worker is the graceful-stop signal."""
        fd, self._lifeline_w = self._lifeline_w, None
        if fd is not None:
            _LIFELINES.discard(fd)
            os.close(fd)

    def close(self) -> None:
        """Release the lifeline and the pidfd (call after the worker exited); see `release_pidfd`."""
        self.close_lifeline()
        self.release_pidfd()


class WorkerSpawner:
    """Owns the fork server; spawns workers that report ready over the control channel."""

    def __init__(
        self,
        control_endpoint: str | None,
        *,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        zygote_grace: float = 0.5,
        zygote_signal_timeout: float = 0.5,
        start_timeout: float = 60.0,
        request_timeout: float = 10.0,
        cgroups: bool | None = None,
        early: EarlyForkServer | None = None,
    ) -> None:
        """`cgroups`: contain each worker in its own cgroup (True, falling back with a warning where the
        machine does not allow it), never (False), or where available (None: `legion.procs.containment`).
        `early`: a fork server started ahead of this spawner, adopted by `start()` if it fits these settings."""
        self.control_endpoint = control_endpoint
        self.preload = tuple(preload)
        self.zygote_grace = zygote_grace
        self.zygote_signal_timeout = zygote_signal_timeout
        self.start_timeout = start_timeout
        self.request_timeout = request_timeout
        self.preload_failed: dict[str, str] = {}
        self._sock: socket.socket | None = None
        self._zygote: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._spawned: list[ProcRef] = []  # live workers, for a replacement fork server to adopt
        self._prune_at = 16
        self._watcher: threading.Thread | None = None
        self._wake: tuple[int, int] | None = None  # pipe that wakes the watcher on close()
        self.cgroups = cgroups
        self.run_cgroup: Cgroup | None = None  # each worker gets a cgroup under it (cgroup containment)
        self.containment_reason = ""
        self._early = early

    def __enter__(self) -> WorkerSpawner:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def zygote_pid(self) -> int | None:
        return self._zygote.pid if self._zygote is not None else None

    def start(self) -> None:
        """Become a child subreaper and start the preloaded fork server (blocks until it is ready)."""
        with _subreaper_lock:
            if self not in _subreaper_users and (_subreaper_users or not is_child_subreaper()):
                _subreaper_users.append(self)
            set_child_subreaper()
        with self._lock:
            early, self._early = self._early, None
            key = _spawner_key(self.preload, self.zygote_grace, self.zygote_signal_timeout, self.cgroups)
            if early is not None and (self._zygote is not None or self.run_cgroup is not None or not early.take(key)):
                early.discard()  # a spawner started before keeps its own; a misfit is stopped by take()
                early = None
            if early is not None:
                self.run_cgroup, self.containment_reason = early.run_cgroup, early.containment_reason
                self._await_zygote(early.proc, early.sock)
            else:
                if self.run_cgroup is None and self.cgroups is not False:
                    self._make_run_cgroup()
                if self._zygote is None or self._zygote.poll() is not None:
                    self._start_zygote()
            if self._watcher is None:
                self._wake = os.pipe()
                self._watcher = threading.Thread(target=self._watch, args=(self._wake[0],), daemon=True,
                                                 name="fork-server-watch")  # fmt: skip
                self._watcher.start()

    def _make_run_cgroup(self) -> None:
        """Create the run's cgroup where the machine allows it; otherwise the pid/pgid ladder is the path."""
        self.run_cgroup, self.containment_reason = _run_cgroup(self.cgroups)

    def _watch(self, wake_fd: int) -> None:
        """Replace the fork server the moment it dies, not at the next spawn: workers that cannot react
        to lifeline EOF rely on it to take them down when the root dies."""
        while True:
            with self._lock:
                zygote = self._zygote
            if zygote is None:
                return  # closed
            poller = select.poll()
            poller.register(wake_fd, select.POLLIN)
            pidfd: int | None = None
            with contextlib.suppress(OSError):  # already gone (and reaped): restart at once
                pidfd = os.pidfd_open(zygote.pid)
                poller.register(pidfd, select.POLLIN)
            try:
                events = poller.poll(None if pidfd is not None else 0)
            finally:
                if pidfd is not None:
                    os.close(pidfd)
            if any(fd == wake_fd for fd, _ in events) or sys.is_finalizing():
                return  # closed, or the root is exiting without close(): its fork server goes with it
            try:
                if self.ensure_running():
                    logger.warning("fork server {} died; replaced by {}", zygote.pid, self.zygote_pid)
            except Exception as exc:  # keep watching; the next spawn retries too
                logger.error("replacing the dead fork server {} failed: {!r}", zygote.pid, exc)
                time.sleep(1.0)

    def ensure_running(self) -> bool:
        """Restart a dead fork server now (it adopts the live workers); True if one was restarted.

        The watcher thread does this on its own; calling it from a periodic tick as well is harmless.
        """
        with self._lock:
            if self._zygote is None or self._zygote.poll() is None:
                return False
            self._drop_zygote()
            self._start_zygote()
            return True

    def _start_zygote(self) -> None:
        proc, ours = _launch_zygote(self.preload, self.zygote_grace, self.zygote_signal_timeout, self.run_cgroup)
        self._await_zygote(proc, ours)

    def _await_zygote(self, proc: subprocess.Popen[bytes], ours: socket.socket) -> None:
        """Wait for a started fork server's hello; it is ours from then on (SpawnError: it did not start)."""
        ours.settimeout(self.start_timeout)
        try:
            hello = orjson.loads(ours.recv(_MAX_REPLY) or b"null")
        except (OSError, orjson.JSONDecodeError) as exc:
            hello = {"error": str(exc)}
        if not isinstance(hello, dict) or not hello.get("ok"):
            _LIFELINES.discard(ours.fileno())
            ours.close()
            with contextlib.suppress(Exception):
                proc.kill()
            proc.wait()
            why = import_failure(hello) or repr(hello)
            raise SpawnError(f"fork server failed to start (exit {proc.returncode}): {why}")
        self.preload_failed = dict(hello.get("preload_failed") or {})
        ours.settimeout(self.request_timeout)
        self._sock, self._zygote = ours, proc
        self._spawned = alive(self._spawned)
        if self._spawned:  # a replacement fork server: hand it the live workers of its predecessor
            ours.send(orjson.dumps({"op": "adopt", "workers": [[r.pid, r.pgid, r.create_time] for r in self._spawned]}))
            ours.recv(_MAX_REPLY)

    def spawn(self, start: WorkerStart) -> WorkerProcess:
        """Fork a worker for `start`; returns once it exists (readiness arrives over the bus)."""
        start.validate()
        request = {
            "op": "spawn",
            "worker_id": start.worker_id,
            "entry": start.entry,
            "args": start.args,
            "cwd": start.cwd,
            "env": start.env,
            "log_path": start.log_path,
            "control_endpoint": self.control_endpoint,
            "heartbeat_interval": start.heartbeat_interval,
            "identity": start.identity,
        }
        try:
            payload = orjson.dumps(request)
        except TypeError as exc:
            raise SpawnError(f"WorkerStart.args for {start.worker_id!r} is not JSON-serialisable: {exc}") from exc
        if len(payload) > MAX_REQUEST_BYTES:
            raise SpawnError(
                f"WorkerStart for {start.worker_id!r} is {len(payload)} bytes encoded (limit {MAX_REQUEST_BYTES}); "
                "pass large inputs as a file path in args instead"
            )
        reply, lifeline_w = self._request(payload)
        if not reply.get("ok") or not isinstance(reply.get("pid"), int):
            os.close(lifeline_w)
            raise SpawnError(f"spawning {start.worker_id!r} failed: {reply.get('error', reply)!r}")
        proc = self._handle(start.worker_id, reply["pid"], lifeline_w)
        if isinstance(reply.get("cgroup"), str):
            proc.cgroup = Cgroup(reply["cgroup"])
        with self._lock:
            self._spawned.append(proc.ref)
            if len(self._spawned) >= self._prune_at:
                self._spawned = alive(self._spawned)
                self._prune_at = 2 * len(self._spawned) + 16
        return proc

    def _request(self, payload: bytes) -> tuple[dict[str, Any], int]:
        """Send one spawn request with a fresh lifeline; returns the reply and the lifeline's write end."""
        with self._lock:
            if self._zygote is None:
                raise SpawnError("WorkerSpawner.start() was not called (or close() was)")
            error: object = "EOF"
            for attempt in (1, 2):
                if self._zygote is None or self._zygote.poll() is not None:
                    self._drop_zygote()
                    self._start_zygote()
                assert self._sock is not None
                # a lifeline per attempt: a fork server that died after forking but before replying
                # leaves an untracked worker holding this attempt's read end; closing the write end
                # below makes it leave at once instead of living on beside the retry's worker
                lifeline_r, lifeline_w = os.pipe()
                try:
                    socket.send_fds(self._sock, [payload], [lifeline_r])
                    raw = self._sock.recv(_MAX_REPLY)
                except OSError as exc:
                    raw, error = b"", exc
                except BaseException:
                    os.close(lifeline_w)
                    raise
                else:
                    error = "EOF"
                finally:
                    os.close(lifeline_r)
                if raw:
                    break
                os.close(lifeline_w)
                # the fork server died: start a fresh one and retry once
                self._drop_zygote()
                if attempt == 2:
                    raise SpawnError(f"fork server failed twice in a row: {error}")
                self._start_zygote()
        try:
            reply = orjson.loads(raw)
        except orjson.JSONDecodeError:
            reply = None
        if not isinstance(reply, dict):
            reply = {"ok": False, "error": f"bad reply {raw[:200]!r}"}
        return reply, lifeline_w

    @staticmethod
    def _handle(worker_id: str, pid: int, lifeline_w: int) -> WorkerProcess:
        ref = ProcRef.from_pid(pid)
        try:
            pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:
            pidfd = None
        return WorkerProcess(worker_id, pid, lifeline_w, pidfd, ref.create_time if ref else 0.0)

    def _drop_zygote(self) -> None:
        if self._sock is not None:
            _LIFELINES.discard(self._sock.fileno())
            self._sock.close()
            self._sock = None
        if self._zygote is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._zygote.wait(timeout=self.zygote_grace + 2 * self.zygote_signal_timeout + 2.0)
            if self._zygote.poll() is None:
                self._zygote.kill()
                self._zygote.wait()
            self._zygote = None

    def close(self) -> None:
        """Stop the fork server (it sweeps any worker still alive after its grace)."""
        with self._lock:
            early, self._early = self._early, None
            if early is not None:  # never started
                early.discard()
            self._drop_zygote()
            watcher, self._watcher = self._watcher, None
            wake, self._wake = self._wake, None
        if wake is not None:
            os.write(wake[1], b"x")
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join()
        if wake is not None:
            os.close(wake[0])
            os.close(wake[1])
        run, self.run_cgroup = self.run_cgroup, None
        if run is not None and not run.kill_and_remove(self.zygote_signal_timeout + 1.0):
            logger.error("the run cgroup {} is still populated after cgroup.kill", run.path)
        with _subreaper_lock:
            if self in _subreaper_users:
                _subreaper_users.remove(self)
                if not _subreaper_users:
                    set_child_subreaper(False)
