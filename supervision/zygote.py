"""The fork server (zygote): a preloaded process that forks rpc workers on request.

Started once by `WorkerSpawner.start()` as a child of the root. It imports the heavy modules workers
need (sqlalchemy, zmq, orjson, psutil, loguru, legion worker modules), runs their lazy per-process
setup once (`_warm`: an in-memory ledger opened and closed, an event loop run), freezes the GC, and
then serves spawn requests over a SOCK_SEQPACKET socketpair: one orjson request + the lifeline read
end (SCM_RIGHTS) in, one orjson reply with the worker pid out. No zmq context is ever opened here and
no DB connection kept; workers open their own after the fork.

Each worker is double-forked so it re-parents to the root (a child subreaper): the root then owns
the worker's exit status (pidfd + waitid). The worker calls `setsid()` (leads its own process group
and session), marks itself a child subreaper (its orphaned descendants stay enumerable under it),
sets `LINEAGE_ENV` to its `lineage_mark` (pid and start time) (so the root can recognise orphans of its tree), applies cwd/env
overrides, and runs `legion.workers.runtime.run_worker`.

Late preload: a module named `~name` in `--preload` (the provider SDKs: `import anthropic` takes ~1 s) is
imported only after the fork server has signalled ready, once it has been idle for `LATE_PRELOAD_IDLE_S`,
so neither its own start nor the first spawn (the pool, requested at once) waits for it; workers forked
after it inherit the module (a standby forked before is replaced). A request that arrives during the
import waits for it. A worker that did not inherit a module imports it off its event loop itself (the
providers do: `workers/providers/pool.py`).

The intermediate is forked ahead of its request (a *standby*, kept ready while the fork server is
idle): it waits on its own socketpair for one request + lifeline, forks the worker, sends its pid and
exits. So a spawn request costs the worker's fork only, not also a fork of the fork server and a
cgroup move. With cgroup containment (`--cgroup <run cgroup>`), each worker gets its own cgroup under
the run's: the standby joins it before it waits, so the worker is born in it and runs no code outside
it; the reply names it. The worker connects to the root only once the standby has exited (it is a member
of that cgroup until then). A standby that died meanwhile is replaced by a fresh one for that request.

The zygote dies with the root: EOF on its socket (the root exited or was SIGKILLed) makes it give the
live workers `grace` seconds to leave on their own lifeline EOF, then sweep every worker and the
descendants it snapshotted (TERM, then KILL), and exit; with a run cgroup, what is left after the
grace is ended by one cgroup.kill of the run cgroup, which is then removed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import os
import select
import signal
import socket
import sys
import time
import traceback
from typing import Any

import orjson

from legion.procs import (
    LINEAGE_ENV,
    Cgroup,
    ProcRef,
    alive,
    is_child_subreaper,
    lineage_mark,
    raise_nofile,
    set_child_subreaper,
    snapshot_descendants,
    sweep,
)

MAX_REQUEST_BYTES = 256 * 1024
EXIT_CHILD_SETUP_FAILED = 70
EXIT_CGROUP_JOIN_FAILED = 72
# A cgroup move waits for an RCU grace period, and every clone() on the machine (a new worker starting its
# threads) stalls behind it meanwhile (cgroup_threadgroup_rwsem): a standby joins once the fork server was
# quiet this long, or when its request arrives, whichever comes first.
STANDBY_JOIN_DELAY_S = 0.05
LATE = "~"  # a `--preload` name with this prefix is imported after ready, when idle (see the module doc)
LATE_PRELOAD_IDLE_S = 0.3
# the root (our parent), pinned at start: a worker whose root died ends its self-sweep with cgroup.kill
_ROOT_PIDFD: list[int | None] = [None]


def _preload(modules: list[str]) -> dict[str, str]:
    failed: dict[str, str] = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # preload is an optimisation: the worker will report the real error
            failed[name] = f"{type(exc).__name__}: {exc}"
    return failed


async def _noop() -> None:
    return None


def _warm() -> dict[str, str]:
    """Do once here the lazy per-process setup every worker would otherwise repeat after its fork.

    An in-memory ledger opened and closed warms SQLAlchemy (URL parsing, dialect, pool and event setup:
    ~5 ms of a fresh worker's ledger open, measured) and an event loop run once warms asyncio; neither
    leaves a connection, thread or descriptor behind."""
    failed: dict[str, str] = {}
    warmers: list[tuple[str, Any]] = [("asyncio", lambda: asyncio.run(_noop()))]
    if "legion.ledger" in sys.modules:
        warmers.append(("legion.ledger", lambda: sys.modules["legion.ledger"].open_ledger(":memory:").close()))
    for name, warm in warmers:
        try:
            warm()
        except Exception as exc:  # an optimisation only, like the preload
            failed[f"warm:{name}"] = f"{type(exc).__name__}: {exc}"
    return failed


def _worker_child(request: dict[str, Any], lifeline_fd: int, sock_fd: int, cgroup: Cgroup | None = None,
                  standby: int | None = None) -> None:  # fmt: skip
    """Runs in the forked worker (`standby`: the pid of the intermediate that forked it); never returns."""
    code = EXIT_CHILD_SETUP_FAILED
    try:
        os.close(sock_fd)
        os.setsid()
        me = ProcRef.from_pid(os.getpid())
        if me is not None:  # every process the worker's tree execs carries it
            os.environ[LINEAGE_ENV] = lineage_mark(me)
        # SIGPIPE stays ignored (Python's default: a closed pipe is a BrokenPipeError, not a death)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        from legion.workers.runtime import WorkerContext, run_worker

        set_child_subreaper()
        os.set_inheritable(lifeline_fd, False)
        if request.get("cwd"):
            os.chdir(request["cwd"])
        env = request.get("env") or {}
        os.environ.update({str(k): str(v) for k, v in env.items()})
        # the preloaded objects stay frozen: collections never walk (and so never copy) those pages
        ctx = WorkerContext(
            worker_id=request["worker_id"],
            entry=request["entry"],
            lifeline_fd=lifeline_fd,
            args=request.get("args") or {},
            control_endpoint=request.get("control_endpoint"),
            log_path=request.get("log_path"),
            heartbeat_interval=float(request.get("heartbeat_interval", 1.0)),
            identity=request.get("identity") or None,
            cgroup=str(cgroup.path) if cgroup is not None else None,
            root_pidfd=_ROOT_PIDFD[0],
            standby_pid=standby,
        )
        code = run_worker(ctx)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _standby_main(conn: socket.socket, cgroup: Cgroup | None) -> None:
    """Runs in a standby intermediate: join the cgroup, wait for one request, fork its worker; never returns."""
    code = 0
    try:
        if cgroup is not None:
            # not while the worker forked just before us starts up: a request that comes sooner is served at once
            select.select([conn], [], [], STANDBY_JOIN_DELAY_S)
            code = EXIT_CGROUP_JOIN_FAILED
            cgroup.join()
            code = 0
        data, fds, _flags, _addr = socket.recv_fds(conn, MAX_REQUEST_BYTES, 1)
        if data and len(fds) == 1:  # else EOF: the fork server is closing (or gone), no worker
            me = os.getpid()  # not the child's getppid(): we may have exited before it asks
            worker = os.fork()
            if worker == 0:
                _worker_child(orjson.loads(data), fds[0], conn.fileno(), cgroup, me)
            conn.send(worker.to_bytes(8, "little"))
    finally:
        os._exit(code)


class _Standby:
    """An intermediate forked ahead of its request, already in its worker's cgroup, serving one spawn.

    Why ahead: forking the fork server and moving a process into a fresh cgroup (a cgroup v2 migration
    waits for an RCU grace period) took ~5-15 ms of every launch on a loaded 2-core machine; a standby
    pays both while the fork server is idle, and a spawn request costs only the worker's own fork."""

    def __init__(self, run: Cgroup | None, name: str, root_fd: int) -> None:
        self.cgroup = run.child(name) if run is not None else None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            if self.cgroup is not None:
                self.cgroup.remove()
            raise
        if pid == 0:
            os.close(root_fd)  # only the fork server talks to the root
            ours.close()
            _standby_main(theirs, self.cgroup)
        theirs.close()
        self.pid, self.sock = pid, ours

    def status(self) -> int:
        """Wait for this (finished or failed) standby and return its exit code."""
        self.sock.close()
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            return -1
        return os.waitstatus_to_exitcode(status)

    def close(self) -> None:
        """Dismiss an unused standby (EOF makes it exit) and remove its empty cgroup."""
        self.status()
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.remove()


class StandbyLost(OSError):
    """The standby died before it forked the worker (killed, or its fork failed); a fresh one may work."""


def _fork_worker(standby: _Standby, data: bytes, lifeline_fd: int) -> int:
    """Hand one spawn request (+ its lifeline) to `standby`; returns the worker's pid (the standby exits at
    once and is reaped later). The worker is born in the standby's cgroup."""
    try:
        socket.send_fds(standby.sock, [data], [lifeline_fd])
        raw = standby.sock.recv(8)
    except OSError:
        raw = b""
    if len(raw) == 8:
        standby.sock.close()
        return int.from_bytes(raw, "little")
    code = standby.status()
    if standby.cgroup is not None:
        with contextlib.suppress(OSError):
            standby.cgroup.remove()
        if code == EXIT_CGROUP_JOIN_FAILED:
            raise OSError(f"the worker could not join its cgroup {standby.cgroup.path}")
    raise StandbyLost(f"fork of the worker failed in the intermediate process (exit {code})")


class _Intermediates:
    """The fork server's intermediates: one standby kept ready while idle; used ones reaped."""

    def __init__(self, run: Cgroup | None, root_fd: int) -> None:
        self.run, self.root_fd = run, root_fd
        self.standby: _Standby | None = None
        self.used: set[int] = set()
        self.made = 0

    def prepare(self) -> None:
        """Have a standby ready for the next request; a failure here is reported by that request."""
        if self.standby is None:
            with contextlib.suppress(OSError):
                self.standby = self._new()

    def _new(self) -> _Standby:
        self.made += 1
        return _Standby(self.run, f"w{os.getpid()}.{self.made}", self.root_fd)

    def fork_worker(self, data: bytes, lifeline_fd: int) -> tuple[int, Cgroup | None]:
        """Fork the worker of one request through the standby (a fresh one if it was lost)."""
        for attempt in (1, 2):
            standby, self.standby = self.standby or self._new(), None
            try:
                pid = _fork_worker(standby, data, lifeline_fd)
            except StandbyLost:
                if attempt == 2:
                    raise
                continue
            self.used.add(standby.pid)
            return pid, standby.cgroup
        raise AssertionError("unreachable")

    def reap(self) -> None:
        """Collect used standbys that exited (only ours by pid: a live standby keeps its exit status)."""
        for pid in list(self.used):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            self.used.discard(pid)

    def close(self) -> None:
        if self.standby is not None:
            self.standby.close()
            self.standby = None
        self.reap()


def _adopted(request: dict[str, Any]) -> list[ProcRef]:
    """Workers forked by a previous fork server: [[pid, pgid, create_time], ...]."""
    items = request.get("workers")
    if not isinstance(items, list):
        raise ValueError("request.workers must be a list of [pid, pgid, create_time]")
    refs = []
    for item in items:
        if (not isinstance(item, list) or len(item) != 3 or not all(isinstance(v, int | float) for v in item)
                or isinstance(item[0], bool) or int(item[0]) <= 1):  # fmt: skip
            raise ValueError(f"request.workers entry {item!r} is not [pid, pgid, create_time]")
        refs.append(ProcRef(pid=int(item[0]), pgid=int(item[1]), create_time=float(item[2])))
    return refs


def _validate(request: Any) -> dict[str, Any]:
    if not isinstance(request, dict):
        raise ValueError("request must be a JSON object")
    if request.get("op") in ("ping", "adopt"):
        return request
    for key in ("worker_id", "entry"):
        if not isinstance(request.get(key), str) or not request[key]:
            raise ValueError(f"request.{key} must be a non-empty string")
    if not isinstance(request.get("args", {}), dict):
        raise ValueError("request.args must be an object")
    if not isinstance(request.get("identity") or "", str):
        raise ValueError("request.identity must be a string or null")
    return request


def _shutdown(workers: list[ProcRef], grace: float, signal_timeout: float, run: Cgroup | None = None) -> None:
    """The root is gone: let workers leave on lifeline EOF, then sweep whatever is left.

    With a run cgroup, what is left after the grace is ended by one cgroup.kill, and the cgroups are
    removed once empty."""
    if run is not None:
        deadline = time.monotonic() + grace
        while alive(workers) and time.monotonic() < deadline:
            time.sleep(0.01)
        run.kill_and_remove(signal_timeout + 1.0)
        return
    live = alive(workers)
    snapshot: list[ProcRef] = list(live)
    for ref in live:
        snapshot.extend(snapshot_descendants(ref.pid))
    deadline = time.monotonic() + grace
    while alive(live) and time.monotonic() < deadline:
        time.sleep(0.01)
    sweep(snapshot, signal_timeout=signal_timeout)


def _late_preload(sock: socket.socket, late: list[str], middles: _Intermediates) -> list[str]:
    """Import the late modules once no request has come for LATE_PRELOAD_IDLE_S; returns what is still to do."""
    if not late or select.select([sock], [], [], LATE_PRELOAD_IDLE_S)[0]:
        return late
    gc.unfreeze()
    _preload(late)  # a failure is the worker's to report when it imports the module itself
    gc.collect()
    gc.freeze()
    if middles.standby is not None:  # forked before the import: the next worker gets one that has it
        middles.standby.close()
        middles.standby = None
        middles.prepare()
    return []


def serve(sock: socket.socket, grace: float, signal_timeout: float, run: Cgroup | None = None,
          late: list[str] | None = None) -> None:
    """Serve spawn requests until the root closes its end (each worker in a new cgroup under `run`);
    import the `late` modules when first idle."""
    workers: list[ProcRef] = []
    prune_at = 16
    middles = _Intermediates(run, sock.fileno())
    late = list(late or [])
    while True:
        middles.reap()
        middles.prepare()
        late = _late_preload(sock, late, middles)
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_REQUEST_BYTES, 4)
        except InterruptedError:
            continue
        except OSError:
            data, fds = b"", []
        if not data:
            for fd in fds:
                os.close(fd)
            break
        reply: dict[str, Any]
        try:
            request = _validate(orjson.loads(data))
            if request.get("op") == "ping":
                reply = {"ok": True, "pid": os.getpid()}
            elif request.get("op") == "adopt":  # so they die with the root too, not only by lifeline
                adopted = _adopted(request)
                workers.extend(adopted)
                reply = {"ok": True, "adopted": len(adopted)}
            elif len(fds) != 1:
                raise ValueError(f"a spawn request carries exactly one lifeline fd, got {len(fds)}")
            else:
                pid, cgroup = middles.fork_worker(data, fds[0])
                ref = ProcRef.from_pid(pid)
                if ref is not None:
                    # the worker may not have called setsid() yet; its group is its pid by construction
                    workers.append(ProcRef(pid=pid, pgid=pid, create_time=ref.create_time))
                if len(workers) >= prune_at:  # amortised: a psutil look-up per worker is not free
                    workers = alive(workers)
                    prune_at = 2 * len(workers) + 16
                reply = {"ok": True, "pid": pid}
                if cgroup is not None:
                    reply["cgroup"] = str(cgroup.path)
        except Exception as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        try:
            sock.send(orjson.dumps(reply))
        except OSError:
            break  # the root is gone mid-request: clean up like on EOF
    middles.close()
    _shutdown(workers, grace, signal_timeout, run)


def main(argv: list[str] | None = None) -> None:
    """Entry point: `python -c 'from legion.supervision.zygote import main; main()' --fd N ...`."""
    parser = argparse.ArgumentParser(prog="legion-zygote")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--preload", default="")
    parser.add_argument("--grace", type=float, default=0.5)
    parser.add_argument("--signal-timeout", type=float, default=0.5)
    parser.add_argument("--cgroup", default=None, help="the run cgroup (each worker gets one under it)")
    opts = parser.parse_args(sys.argv[1:] if argv is None else argv)
    raise_nofile()  # workers inherit it (procs/rlimit.py)
    with contextlib.suppress(OSError):
        _ROOT_PIDFD[0] = os.pidfd_open(os.getppid())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the root decides; a terminal ^C must not kill us
    sock = socket.socket(fileno=opts.fd)
    t0 = time.perf_counter()
    names = [m for m in opts.preload.split(",") if m]
    failed = _preload([m for m in names if not m.startswith(LATE)])
    failed.update(_warm())
    from legion.workers.runtime import preconfigure_logging

    preconfigure_logging()
    is_child_subreaper()  # resolves libc's prctl once here, not in every worker
    gc.collect()
    gc.freeze()  # keep preloaded objects out of GC passes so forked pages stay shared
    try:
        sock.send(orjson.dumps({"ok": True, "pid": os.getpid(), "preload_failed": failed,
                                "preload_s": time.perf_counter() - t0}))
    except (BrokenPipeError, ConnectionResetError):
        return  # the root let go of us before we were ready (a prestarted fork server it did not use): no worker
    serve(sock, opts.grace, opts.signal_timeout, Cgroup(opts.cgroup) if opts.cgroup else None,
          late=[m.removeprefix(LATE) for m in names if m.startswith(LATE)])
