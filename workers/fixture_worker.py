"""TEST/BENCHMARK FIXTURE — a worker whose (mis)behaviour is chosen by its args. Not a real session.

Entry: `legion.workers.fixture_worker:main`. Args (all optional):

- `mode`: `serve` (default: run until the lifeline closes), `exit` (return `code`, default 0, after
  `exit_after` s), `crash` (raise after `exit_after` s), `busy` (pure-Python busy loop holding the GIL,
  never yields), `block` (block the event loop with a sleep: stops answering without exiting);
- `ignore_term`: ignore SIGTERM (the worker and every descendant it spawns);
- `start_delay`: seconds before reporting ready (slow start);
- `children`: N grandchildren in the worker's process group;
- `setsid_children`: N grandchildren that `setsid` away into their own session/group;
- `daemons`: N double-forked daemons (orphaned at once, so they re-parent away from the worker);
- `late_setsid_children`: N more `setsid` escapees spawned from a thread `late_after` seconds after
  ready (while a retire may already be waiting: they do not exist at the ladder's first snapshot);
- `term_spawners`: N grandchildren (shells) that answer SIGTERM by starting a `setsid` escapee and
  exiting at once (what a sweep's TERM leaves behind, re-parented away from every swept process);
- `fork_children`: N pure `fork()` children that never exec: they `setsid` away and sleep (no
  environment of their own: `find_marked` recognises them by a name derived from the marker);
- `term_forkers`: N pure forks that answer SIGTERM by forking one more pure fork that `setsid`s away,
  and exiting at once (the escape no lineage mark can follow);
- `term_chain`: N, one pure fork whose TERM handler forks the next, N generations deep (each sweep
  round ends one generation: a sweep bounded by rounds leaves the rest);
- `spawn_forever`: seconds between `setsid` escapees spawned from a thread until the worker dies (a
  TERM-ignoring worker that keeps spawning while it is being retired);
- `marker`: a string put in every descendant's environ (`LEGION_FIXTURE_MARKER`), so tests can scan
  the process table for survivors with `find_marked(marker)`;
- `ready_file`: path written (atomically, JSON with pids) once the behaviour is set up;
- `report_env`: names of environment variables whose values go into the ready file (with the cwd).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
import psutil

from legion.procs.durable import replace_file

if TYPE_CHECKING:
    from legion.workers.runtime import WorkerRuntime

__all__ = ["ENTRY", "MARKER_ENV", "MODES", "find_marked", "fork_name", "main"]

ENTRY = "legion.workers.fixture_worker:main"
MARKER_ENV = "LEGION_FIXTURE_MARKER"
MODES = ("serve", "exit", "crash", "busy", "block")
_SLEEP = "sleep"
_LONG = "100000"


class FixtureCrash(RuntimeError):
    """The deliberate crash of mode=crash."""


def fork_name(marker: str) -> str:
    """The process name (comm, 14 bytes: psutil reads a 15-byte one from the cmdline) of the pure forks of `marker`: they carry no environ of their own."""
    return "lgf" + hashlib.sha1(marker.encode()).hexdigest()[:11]


def find_marked(marker: str) -> list[int]:
    """Pids of live (non-zombie) processes whose environ carries `marker` (or pure forks named for it)."""
    found = []
    name = fork_name(marker)
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.name() == name or proc.environ().get(MARKER_ENV) == marker:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _pure_fork(name: str, on_term: Callable[[], None] | None = None) -> int:
    """fork() without exec: the child setsids away, takes `name` and sleeps until a signal ends it."""
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setsid()
        with open("/proc/self/comm", "w") as fh:
            fh.write(name)
        if on_term is not None:
            signal.signal(signal.SIGTERM, lambda *_: on_term())
        elif callable(signal.getsignal(signal.SIGTERM)):  # forked from a TERM handler: one generation only
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        while True:
            time.sleep(1)
    finally:
        os._exit(0)


def _fork_on_term(name: str, generations: int = 1) -> None:
    """A TERM handler: start one more pure fork that escapes (itself doing the same for `generations` - 1
    more generations), then leave at once."""
    _pure_fork(name, (lambda: _fork_on_term(name, generations - 1)) if generations > 1 else None)
    os._exit(0)


def _quiet(args: dict[str, Any]) -> dict[str, Any]:
    env = dict(os.environ)
    env[MARKER_ENV] = str(args.get("marker", ""))
    return {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env}


def _spawn_late(args: dict[str, Any]) -> None:
    """From a thread, so it happens even while the event loop is blocked or spinning."""
    count = int(args.get("late_setsid_children", 0))
    if not count:
        return

    def spawn() -> None:
        for _ in range(count):
            subprocess.Popen([_SLEEP, _LONG], start_new_session=True, **_quiet(args))

    timer = threading.Timer(float(args.get("late_after", 0.2)), spawn)
    timer.daemon = True
    timer.start()


def _spawn_forever(args: dict[str, Any]) -> None:
    """From a thread: keep spawning `setsid` escapees until the process dies."""
    if args.get("spawn_forever") is None:
        return
    interval = float(args["spawn_forever"])

    def spawn() -> None:
        while True:
            with contextlib.suppress(OSError):
                subprocess.Popen([_SLEEP, _LONG], start_new_session=True, **_quiet(args))
            time.sleep(interval)

    threading.Thread(target=spawn, daemon=True, name="spawn-forever").start()


def _spawn_descendants(args: dict[str, Any]) -> list[subprocess.Popen[bytes] | _Forked]:
    quiet = _quiet(args)
    procs: list[subprocess.Popen[bytes] | _Forked] = []
    for _ in range(int(args.get("children", 0))):
        procs.append(subprocess.Popen([_SLEEP, _LONG], **quiet))
    for _ in range(int(args.get("setsid_children", 0))):
        procs.append(subprocess.Popen([_SLEEP, _LONG], start_new_session=True, **quiet))
    escape_on_term = f"trap 'setsid {_SLEEP} {_LONG} </dev/null >/dev/null 2>&1 & exit 0' TERM; while :; do sleep 0.02; done"
    for _ in range(int(args.get("term_spawners", 0))):
        procs.append(subprocess.Popen(["sh", "-c", escape_on_term], start_new_session=True, **quiet))
    name = fork_name(str(args.get("marker", "")))
    forked = [_pure_fork(name) for _ in range(int(args.get("fork_children", 0)))]
    forked += [_pure_fork(name, lambda: _fork_on_term(name)) for _ in range(int(args.get("term_forkers", 0)))]
    chain = int(args.get("term_chain", 0))
    if chain:
        forked.append(_pure_fork(name, lambda: _fork_on_term(name, chain)))
    procs += [_Forked(pid) for pid in forked]
    daemons = int(args.get("daemons", 0))
    if daemons:
        # sh backgrounds `setsid sleep` and exits: each sleep is orphaned (a classic double fork)
        script = " ".join(["setsid sleep " + _LONG + " &"] * daemons)
        subprocess.run(["sh", "-c", script], check=True, **quiet)
    return procs


class _Forked:
    """A pure fork child, listed with the Popen children (only `.pid` is used)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid


def _write_ready_file(path: str, body: dict[str, Any]) -> None:
    replace_file(path, orjson.dumps(body), durable=False)


async def main(rt: WorkerRuntime) -> int:
    """Behave as the args say (see the module docstring)."""
    args = rt.args
    mode = args.get("mode", "serve")
    if mode not in MODES:
        raise ValueError(f"fixture mode {mode!r} is not one of {MODES}")
    if args.get("ignore_term"):
        # set before spawning: an ignored disposition is inherited across fork and exec
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.get("start_delay"):
        await asyncio.sleep(float(args["start_delay"]))
    procs = _spawn_descendants(args)
    await rt.ready({"children": [p.pid for p in procs]})
    if args.get("ready_file"):
        env = {str(k): os.environ.get(str(k)) for k in args.get("report_env", [])}
        body = {"pid": os.getpid(), "children": [p.pid for p in procs], "cwd": os.getcwd(), "env": env,
                "standby": rt.ctx.standby_pid}
        _write_ready_file(str(args["ready_file"]), body)
    _spawn_late(args)
    _spawn_forever(args)
    exit_after = float(args.get("exit_after", 0))
    if mode == "exit":
        await asyncio.sleep(exit_after)
        return int(args.get("code", 0))
    if mode == "crash":
        await asyncio.sleep(exit_after)
        raise FixtureCrash("fixture worker crashed on purpose (mode=crash)")
    if mode == "busy":
        n = 0
        while True:  # holds the GIL, never yields to the loop
            n += 1
    if mode == "block":
        time.sleep(1e9)  # blocks the event loop: no heartbeat, no lifeline handling
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.Event().wait()
    return 0


main.auto_ready = False  # type: ignore[attr-defined]  # ready once descendants exist (see start_delay)
