"""The single descendant sweep: snapshot a process tree, then TERM/KILL every group and pid in it.

Used by the rpc retire ladder (`legion.supervision.retire`) and by in-pool session retire for a
session's tool process groups. Rules (DESIGN §3, SEED-SPEC §3.4, regressions 41-42):

- snapshot descendants *before* anything is signalled (after the parent dies the links are gone);
- a zombie counts as dead; a pid whose create_time differs from the snapshot is a different process
  (pid reuse) and is never signalled;
- signals go through pidfds opened after the identity check, so a pid recycled between the check and
  the kill cannot be hit;
- the waits are plain blocking polls; `sweep_async` runs them in a thread and, if its caller is
  cancelled (loop shutdown), finishes the sweep before propagating the cancellation.

Additions to INTERFACES.md: `sweep(..., kill_timeout=None)` (defaults to signal_timeout),
`sweep_async`, `snapshot_tree`, `sweep_groups_async` (in-pool session retire: steps 1 and 5 for a
session's tool process groups), `ProcRef.from_pid`, `pidfd_exited`, `run_to_completion`, `freeze_tree` (SIGSTOP a subreaper
and its descendants to a fixed point, so nothing can be born between the last snapshot and the signal
that ends it), `LINEAGE_ENV`, `lineage_mark` + `strays_of` (processes a retired worker's tree started that re-parented
to us, the subreaper, outside every group and snapshot we know).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import select
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import psutil

__all__ = [
    "LINEAGE_ENV",
    "ProcRef",
    "alive",
    "freeze_tree",
    "group_exists",
    "has_children",
    "lineage_mark",
    "pidfd_exited",
    "reap",
    "run_to_completion",
    "snapshot_descendants",
    "snapshot_groups",
    "snapshot_tree",
    "strays_of",
    "sweep",
    "sweep_async",
    "sweep_groups_async",
]

# create_time is derived from /proc/<pid>/stat starttime (clock ticks since boot) exactly as psutil
# derives it (ticks / CLK_TCK + btime); the same process always compares equal, a recycled pid differs
# by at least one tick.
_CT_TOLERANCE = 1e-3
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_DEAD_STATES = frozenset("ZXx")
T = TypeVar("T")


class _Stat(NamedTuple):
    state: str
    ppid: int
    pgid: int
    create_time: float


def _boot_time() -> float:
    global _BOOT_TIME
    if _BOOT_TIME is None:
        try:
            _BOOT_TIME = float(psutil.boot_time())
        except Exception:  # psutil reads the same /proc/stat btime; fall back to it directly
            with open("/proc/stat", "rb") as fh:
                line = next(raw for raw in fh if raw.startswith(b"btime"))
            _BOOT_TIME = float(line.split()[1])
    return _BOOT_TIME


_BOOT_TIME: float | None = None


def _stat(pid: int) -> _Stat | None:
    """Parse /proc/<pid>/stat with raw syscalls (a full process-table scan is the hot path of retire)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        raw = os.read(fd, 2048)
    except OSError:
        return None
    finally:
        os.close(fd)
    # "pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
    #  cutime cstime priority nice num_threads itrealvalue starttime ..."; comm may contain spaces/")"
    fields = raw[raw.rfind(b")") + 2 :].split(b" ", 20)
    try:
        return _Stat(fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19]) / _CLK_TCK + _boot_time())
    except (IndexError, ValueError):
        return None


def _proc_table() -> dict[int, _Stat]:
    """One pass over /proc: pid -> (state, ppid, pgid, create_time)."""
    table: dict[int, _Stat] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                table[int(name)] = st
    return table


@dataclass(frozen=True)
class ProcRef:
    """One process as seen at snapshot time; create_time guards against pid reuse."""

    pid: int
    pgid: int
    create_time: float

    @classmethod
    def from_pid(cls, pid: int) -> ProcRef | None:
        """Snapshot one pid, or None if it is gone (or a zombie)."""
        st = _stat(pid)
        if st is None or st.state in _DEAD_STATES:
            return None
        return cls(pid=pid, pgid=st.pgid, create_time=st.create_time)


def _live_refs(table: dict[int, _Stat], pids: Iterable[int]) -> list[ProcRef]:
    refs = []
    for pid in pids:
        st = table[pid]
        if st.state not in _DEAD_STATES:
            refs.append(ProcRef(pid=pid, pgid=st.pgid, create_time=st.create_time))
    return refs


def _descendant_pids(table: dict[int, _Stat], roots: Iterable[int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, st in table.items():
        children.setdefault(st.ppid, []).append(pid)
    found: list[int] = []
    seen = set(roots)
    stack = list(seen)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in seen:
                seen.add(child)
                found.append(child)
                stack.append(child)
    return found


def snapshot_descendants(pid: int) -> list[ProcRef]:
    """Every live descendant of `pid` (recursive), taken before anything is signalled."""
    table = _proc_table()
    if pid not in table:
        return []
    return _live_refs(table, _descendant_pids(table, [pid]))


def snapshot_groups(pgids: Iterable[int]) -> list[ProcRef]:
    """Every live process whose process group is one of `pgids`."""
    wanted = {g for g in pgids if g > 1}
    if not wanted:
        return []
    table = _proc_table()
    return _live_refs(table, [pid for pid, st in table.items() if st.pgid in wanted])


def snapshot_tree(pgids: Iterable[int]) -> list[ProcRef]:
    """Every live process in `pgids` plus all their descendants (deduplicated), from one scan."""
    wanted = {g for g in pgids if g > 1}
    if not wanted:
        return []
    table = _proc_table()
    members = [pid for pid, st in table.items() if st.pgid in wanted]
    return _live_refs(table, members + _descendant_pids(table, members))


# Set by the fork server in every rpc worker (`lineage_mark`: its pid and start time), so each process
# its tree execs carries it.
LINEAGE_ENV = "LEGION_WORKER"


def lineage_mark(ref: ProcRef) -> str:
    """`<pid>:<start time in clock ticks>`: names one process for good, even after its pid is reused."""
    return f"{ref.pid}:{round((ref.create_time - _boot_time()) * _CLK_TCK)}"


def _own_children() -> list[int]:
    """Pids of our direct children (every thread's, as orphans re-parent to any live thread of ours)."""
    pids: list[int] = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        tids = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/children", "rb") as fh:
                pids.extend(int(p) for p in fh.read().split())
        except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: one full scan instead
            me = os.getpid()
            return [pid for pid, st in _proc_table().items() if st.ppid == me]
        except OSError:
            continue
    return pids


_EXEC_WAIT = 0.1  # seconds to wait for the environment of a process caught in the middle of execve()


def _carries(pid: int, entry: bytes) -> bool | None:
    """Whether `pid`'s exec-time environment holds `entry`; None while it reads empty (mid-execve)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            environ = fh.read()
    except FileNotFoundError:
        return False
    except OSError:
        return None
    if not environ:
        return None
    return (b"\0" + entry + b"\0") in (b"\0" + environ)


def strays_of(worker: ProcRef) -> list[ProcRef]:
    """Live processes that re-parented to us (we are a subreaper) from `worker`'s tree, with their trees.

    They are found by the `LINEAGE_ENV=<lineage_mark(worker)>` in their exec-time environment and a
    start after the worker's: what a descendant started while being swept (a TERM handler that spawns
    and exits) belongs to no snapshot and no swept group. A process that never exec'd carries no mark."""
    entry = f"{LINEAGE_ENV}={lineage_mark(worker)}".encode()
    found: list[int] = []
    pending: list[int] = []
    for pid in _own_children():
        st = _stat(pid)
        if st is not None and st.state not in _DEAD_STATES and st.create_time >= worker.create_time - _CT_TOLERANCE:
            pending.append(pid)
    deadline = time.monotonic() + _EXEC_WAIT
    while pending:
        unread = []
        for pid in pending:
            mark = _carries(pid, entry)
            if mark:
                found.append(pid)
            elif mark is None:
                unread.append(pid)
        # a process in the middle of execve() reads as an empty environment for a moment
        if not unread or time.monotonic() > deadline:
            break
        pending = unread
        time.sleep(0.001)
    if not found:
        return []
    table = _proc_table()
    return _live_refs(table, [p for p in found if p in table] + _descendant_pids(table, found))


def _is_alive(ref: ProcRef) -> bool:
    st = _stat(ref.pid)
    if st is None or abs(st.create_time - ref.create_time) > _CT_TOLERANCE:
        return False  # gone, or the pid was reused: our process is gone
    return st.state not in _DEAD_STATES


def alive(procs: Iterable[ProcRef]) -> list[ProcRef]:
    """The processes that are still running (zombies and recycled pids count as dead)."""
    return [p for p in procs if _is_alive(p)]


def has_children() -> bool:
    """Whether this process has any child at all (running or zombie), from one waitid syscall."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def group_exists(pgid: int) -> bool:
    """Whether any process (zombies included) is still in process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap(pids: Iterable[int]) -> dict[int, int]:
    """Reap those of `pids` that are our exited children (WNOHANG); returns pid -> exit code.

    Only for pids known to be orphans/ours to collect (sweep lists): never `waitpid(-1)`, which would
    steal exit statuses owned by asyncio, subprocess or multiprocess.
    """
    reaped: dict[int, int] = {}
    for pid in pids:
        if pid <= 0 or pid == os.getpid():
            continue
        with contextlib.suppress(ChildProcessError, OSError):
            got, status = os.waitpid(pid, os.WNOHANG)
            if got == pid:
                reaped[pid] = os.waitstatus_to_exitcode(status)
    return reaped


_POLL_MAX_MS = 2**31 - 1  # poll() takes a C int; longer waits are simply re-polled by the callers


def _poll_ms(seconds: float | None) -> int | None:
    """poll() timeout: None blocks; otherwise whole ms, rounded up so short waits do not spin."""
    return None if seconds is None else min(_POLL_MAX_MS, max(0, math.ceil(seconds * 1000)))


def pidfd_exited(fd: int, timeout: float | None = 0.0) -> bool:
    """True once the process behind pidfd `fd` has exited (pidfds poll readable on exit).

    `timeout` seconds to wait for it (None = until it exits)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(_poll_ms(timeout)))


def _open_pidfds(procs: Sequence[ProcRef]) -> dict[ProcRef, int]:
    """Pin each still-live process with a pidfd; the identity check comes after the open."""
    fds: dict[ProcRef, int] = {}
    for ref in procs:
        try:
            fd = os.pidfd_open(ref.pid)
        except (ProcessLookupError, OSError):
            continue
        if _is_alive(ref):
            fds[ref] = fd
        else:
            os.close(fd)
    return fds


def _stopped(pid: int) -> bool:
    """Every thread of `pid` is stopped, gone, or in uninterruptible sleep: it can no longer fork.

    A task in `D` state runs no user code before its pending SIGSTOP takes effect (signals are handled
    on the way back to user space); the common case is a parent blocked in vfork() whose child we
    stopped before it exec'd, which stays in `D` for as long as the child is stopped."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        if raw[raw.rfind(b")") + 2 : raw.rfind(b")") + 3] not in (b"T", b"t", b"D", b"Z", b"X", b"x"):
            return False
    return True


def freeze_tree(root: ProcRef, timeout: float) -> list[ProcRef]:
    """SIGSTOP `root` and every descendant until a snapshot finds nothing new and all are stopped.

    `root` should be a child subreaper (every rpc worker is): its tree's orphans stay under it, so once
    the fixed point is reached the returned descendants are all there is, and nothing can spawn more
    before the signal that ends `root`. Stopped processes still die of SIGKILL (and of a default-action
    SIGTERM); the sweep continues them after its TERM. Bounded by `timeout` (an uninterruptible
    process never stops); returns every descendant seen.
    """
    deadline = time.monotonic() + timeout
    seen: dict[tuple[int, float], ProcRef] = {}
    unstoppable: set[ProcRef] = set()  # another user's (setuid) process: waiting cannot help

    def stop(ref: ProcRef, fd: int) -> None:
        try:
            signal.pidfd_send_signal(fd, signal.SIGSTOP)
        except PermissionError:
            unstoppable.add(ref)
        except OSError:  # gone meanwhile
            pass

    pinned = _open_pidfds([root])
    try:
        for ref, fd in pinned.items():
            stop(ref, fd)
        while True:
            fresh = [r for r in snapshot_descendants(root.pid) if (r.pid, r.create_time) not in seen]
            fds = _open_pidfds([r for r in fresh if r.pid != os.getpid()])
            for ref, fd in fds.items():
                seen[(ref.pid, ref.create_time)] = ref
                stop(ref, fd)
                os.close(fd)
            held = [r for r in [root, *seen.values()] if r not in unstoppable and _is_alive(r)]
            settled = not fresh and all(_stopped(r.pid) for r in held)
            if settled or time.monotonic() > deadline:
                return list(seen.values())
            if not fresh:
                time.sleep(0.001)  # signals in flight: let the stops land before checking again
    finally:
        for fd in pinned.values():
            os.close(fd)


def _signal_all(fds: dict[ProcRef, int], sig: int, own_pgid: int) -> None:
    """Signal every process group that still holds one of our processes, then every pid."""
    own_pid = os.getpid()
    groups = set()
    for ref, fd in fds.items():
        if ref.pgid in (own_pgid, 0, 1) or pidfd_exited(fd):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            # a group is only signalled while a member we pinned is still in it (pgid reuse guard)
            if os.getpgid(ref.pid) == ref.pgid:
                groups.add(ref.pgid)
    for pgid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for ref, fd in fds.items():
        if ref.pid == own_pid:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
            signal.pidfd_send_signal(fd, sig)


def _wait_exit(fds: dict[ProcRef, int], timeout: float) -> list[ProcRef]:
    """Block until every pinned process exited or `timeout` passed; returns the ones still running."""
    deadline = time.monotonic() + timeout
    pending = dict(fds)
    while pending:
        poller = select.poll()
        for fd in pending.values():
            poller.register(fd, select.POLLIN)
        remaining = deadline - time.monotonic()
        ready = {fd for fd, _ in poller.poll(_poll_ms(remaining))} if remaining > 0 else set()
        pending = {r: fd for r, fd in pending.items() if fd not in ready}
        if remaining <= 0:
            break
    return list(pending)


def sweep(
    procs: Sequence[ProcRef],
    *,
    signal_timeout: float = 1.0,
    kill_timeout: float | None = None,
    own_pgid: int | None = None,
) -> list[ProcRef]:
    """TERM every group and pid of `procs` (skipping `own_pgid`), wait, KILL survivors (and what they
    spawned during the wait), wait.

    Returns the processes still alive afterwards; an empty list is success.
    """
    own = os.getpgrp() if own_pgid is None else own_pgid
    own_pid = os.getpid()
    fds = _open_pidfds([p for p in procs if p.pid != own_pid])
    try:
        if not fds:
            return []
        _signal_all(fds, signal.SIGTERM, own)
        _signal_all(fds, signal.SIGCONT, own)  # a stopped process only acts on TERM once continued
        left = _wait_exit(fds, signal_timeout)
        if left:
            rest = {r: fds[r] for r in left}
            # what ignored TERM may have spawned meanwhile (e.g. setsid children) is killed with it
            table = _proc_table()
            known = {(r.pid, r.create_time) for r in fds}
            born = [r for r in _live_refs(table, _descendant_pids(table, [r.pid for r in left]))
                    if (r.pid, r.create_time) not in known and r.pid != own_pid]  # fmt: skip
            extra = _open_pidfds(born)
            fds.update(extra)
            rest.update(extra)
            _signal_all(rest, signal.SIGKILL, own)
            left = _wait_exit(rest, signal_timeout if kill_timeout is None else kill_timeout)
        # a pidfd is readable once the process is a zombie; re-check the stragglers the slow way
        return alive(left)
    finally:
        for fd in fds.values():
            os.close(fd)


# sweeps mostly block in poll(); enough threads that concurrent retires never queue behind each other
_EXECUTOR = ThreadPoolExecutor(max_workers=32, thread_name_prefix="proc-sweep")


async def run_to_completion(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a bounded blocking step off the event loop; a cancelled caller waits for it to finish
    before the cancellation propagates (a half-done sweep or freeze would leak processes)."""
    future = _EXECUTOR.submit(fn, *args, **kwargs)
    try:
        return await asyncio.shield(asyncio.wrap_future(future))
    except asyncio.CancelledError:
        future.result()
        raise


async def sweep_async(
    procs: Sequence[ProcRef],
    *,
    signal_timeout: float = 1.0,
    kill_timeout: float | None = None,
    own_pgid: int | None = None,
) -> list[ProcRef]:
    """`sweep` off the event loop; a cancelled caller still gets a finished sweep (regression 42)."""
    return await run_to_completion(
        sweep, procs, signal_timeout=signal_timeout, kill_timeout=kill_timeout, own_pgid=own_pgid
    )


async def sweep_groups_async(
    pgids: Iterable[int], *, signal_timeout: float = 1.0, kill_timeout: float | None = None
) -> list[ProcRef]:
    """Snapshot `pgids` and their descendants first, then sweep them; returns survivors."""
    own = os.getpgrp()
    procs = snapshot_tree(g for g in pgids if g != own)
    return await sweep_async(procs, signal_timeout=signal_timeout, kill_timeout=kill_timeout)
