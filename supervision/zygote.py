"""The fork server (zygote): a preloaded process that forks rpc workers on request.

Started once by `WorkerSpawner.start()` as a child of the root. It imports the heavy modules workers
need (sqlalchemy, zmq, orjson, psutil, loguru, legion worker modules), freezes the GC, and then
serves spawn requests over a SOCK_SEQPACKET socketpair: one orjson request + the lifeline read end
(SCM_RIGHTS) in, one orjson reply with the worker pid out. No zmq context or DB connection is ever
opened here; workers open their own after the fork.

Each worker is double-forked so it re-parents to the root (a child subreaper): the root then owns
the worker's exit status (pidfd + waitid). The worker calls `setsid()` (leads its own process group
and session), marks itself a child subreaper (its orphaned descendants stay enumerable under it),
sets `LINEAGE_ENV` to its `lineage_mark` (pid and start time) (so the root can recognise orphans of its tree), applies cwd/env
overrides, and runs `legion.workers.runtime.run_worker`.

With cgroup containment (`--cgroup <run cgroup>`), each worker gets its own cgroup under the run's:
the intermediate process joins it before forking the worker, so the worker is born in it and runs
no code outside it; the reply names it.

The zygote dies with the root: EOF on its socket (the root exited or was SIGKILLed) makes it give the
live workers `grace` seconds to leave on their own lifeline EOF, then sweep every worker and the
descendants it snapshotted (TERM, then KILL), and exit; with a run cgroup, what is left after the
grace is ended by one cgroup.kill of the run cgroup, which is then removed.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import os
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
    set_child_subreaper,
    snapshot_descendants,
    sweep,
)

MAX_REQUEST_BYTES = 256 * 1024
EXIT_CHILD_SETUP_FAILED = 70
EXIT_CGROUP_JOIN_FAILED = 72
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


def _worker_child(request: dict[str, Any], lifeline_fd: int, sock_fd: int, cgroup: Cgroup | None = None) -> None:
    """Runs in the forked worker; never returns."""
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


def _reap_middles() -> None:
    """Collect exited intermediate processes (the zygote's only children; workers never are)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _fork_worker(request: dict[str, Any], lifeline_fd: int, sock_fd: int, cgroup: Cgroup | None = None) -> int:
    """Double-fork a worker; returns its pid (the intermediate exits at once and is reaped later).

    With `cgroup`, the intermediate joins it first, so the worker is born in it."""
    rfd, wfd = os.pipe()
    middle = os.fork()
    if middle == 0:
        code = 0
        try:
            os.close(rfd)
            if cgroup is not None:
                code = EXIT_CGROUP_JOIN_FAILED
                cgroup.join()
                code = 0
            worker = os.fork()
            if worker == 0:
                os.close(wfd)
                _worker_child(request, lifeline_fd, sock_fd, cgroup)
            os.write(wfd, worker.to_bytes(8, "little"))
        finally:
            os._exit(code)
    os.close(wfd)
    try:
        raw = b""
        while len(raw) < 8:
            chunk = os.read(rfd, 8 - len(raw))
            if not chunk:
                break
            raw += chunk
    finally:
        os.close(rfd)
    if len(raw) != 8:
        _, status = os.waitpid(middle, 0)
        if cgroup is not None and os.waitstatus_to_exitcode(status) == EXIT_CGROUP_JOIN_FAILED:
            raise OSError(f"the worker could not join its cgroup {cgroup.path}")
        raise OSError("fork of the worker failed in the intermediate process")
    return int.from_bytes(raw, "little")


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


def serve(sock: socket.socket, grace: float, signal_timeout: float, run: Cgroup | None = None) -> None:
    """Serve spawn requests until the root closes its end (each worker in a new cgroup under `run`)."""
    workers: list[ProcRef] = []
    prune_at = 16
    spawned = 0
    while True:
        _reap_middles()
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
                spawned += 1
                cgroup = run.child(f"w{os.getpid()}.{spawned}") if run is not None else None
                try:
                    pid = _fork_worker(request, fds[0], sock.fileno(), cgroup)
                except OSError:
                    if cgroup is not None:
                        cgroup.remove()
                    raise
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
    _reap_middles()
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
    with contextlib.suppress(OSError):
        _ROOT_PIDFD[0] = os.pidfd_open(os.getppid())
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the root decides; a terminal ^C must not kill us
    sock = socket.socket(fileno=opts.fd)
    t0 = time.perf_counter()
    failed = _preload([m for m in opts.preload.split(",") if m])
    from legion.workers.runtime import preconfigure_logging

    preconfigure_logging()
    is_child_subreaper()  # resolves libc's prctl once here, not in every worker
    gc.collect()
    gc.freeze()  # keep preloaded objects out of GC passes so forked pages stay shared
    sock.send(orjson.dumps({"ok": True, "pid": os.getpid(), "preload_failed": failed,
                            "preload_s": time.perf_counter() - t0}))
    serve(sock, opts.grace, opts.signal_timeout, Cgroup(opts.cgroup) if opts.cgroup else None)
