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
session's tool process groups), `ProcRef.from_pid`, `pidfd_exited`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psutil

__all__ = [
    "ProcRef",
    "alive",
    "pidfd_exited",
    "reap",
    "snapshot_descendants",
    "snapshot_groups",
    "snapshot_tree",
    "sweep",
    "sweep_async",
    "sweep_groups_async",
]

# create_time from psutil is derived from /proc/<pid>/stat starttime (clock ticks); equal snapshots of
# the same process compare equal, a recycled pid differs by at least one tick.
_CT_TOLERANCE = 1e-3


@dataclass(frozen=True)
class ProcRef:
    """One process as seen at snapshot time; create_time guards against pid reuse."""

    pid: int
    pgid: int
    create_time: float

    @classmethod
    def from_pid(cls, pid: int) -> ProcRef | None:
        """Snapshot one pid, or None if it is gone (or a zombie)."""
        try:
            return _ref(psutil.Process(pid))
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            return None


def _ref(proc: psutil.Process) -> ProcRef | None:
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return ProcRef(pid=proc.pid, pgid=os.getpgid(proc.pid), create_time=proc.create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError, PermissionError):
        return None


def snapshot_descendants(pid: int) -> list[ProcRef]:
    """Every live descendant of `pid` (recursive), taken before anything is signalled."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
    refs = (_ref(c) for c in children)
    return [r for r in refs if r is not None]


def snapshot_groups(pgids: Iterable[int]) -> list[ProcRef]:
    """Every live process whose process group is one of `pgids`."""
    wanted = {g for g in pgids if g > 1}
    if not wanted:
        return []
    found: list[ProcRef] = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) not in wanted:
                continue
        except (ProcessLookupError, PermissionError):
            continue
        ref = ProcRef.from_pid(pid)
        if ref is not None and ref.pgid in wanted:
            found.append(ref)
    return found


def snapshot_tree(pgids: Iterable[int]) -> list[ProcRef]:
    """Every live process in `pgids` plus all their descendants (deduplicated)."""
    members = snapshot_groups(pgids)
    seen = {(p.pid, p.create_time) for p in members}
    tree = list(members)
    for member in members:
        for ref in snapshot_descendants(member.pid):
            if (ref.pid, ref.create_time) not in seen:
                seen.add((ref.pid, ref.create_time))
                tree.append(ref)
    return tree


def _is_alive(ref: ProcRef) -> bool:
    try:
        proc = psutil.Process(ref.pid)
        if abs(proc.create_time() - ref.create_time) > _CT_TOLERANCE:
            return False  # the pid was reused: our process is gone
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, ProcessLookupError):
        return False
    except psutil.AccessDenied:
        return True  # exists, not ours to inspect: assume alive rather than report a false success


def alive(procs: Iterable[ProcRef]) -> list[ProcRef]:
    """The processes that are still running (zombies and recycled pids count as dead)."""
    return [p for p in procs if _is_alive(p)]


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


def pidfd_exited(fd: int, timeout: float = 0.0) -> bool:
    """True once the process behind pidfd `fd` has exited (pidfds poll readable on exit)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout * 1000))))


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
        ready = {fd for fd, _ in poller.poll(max(0, int(remaining * 1000)))} if remaining > 0 else set()
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
    """TERM every group and pid of `procs` (skipping `own_pgid`), wait, KILL survivors, wait.

    Returns the processes still alive afterwards; an empty list is success.
    """
    own = os.getpgrp() if own_pgid is None else own_pgid
    own_pid = os.getpid()
    fds = _open_pidfds([p for p in procs if p.pid != own_pid])
    try:
        if not fds:
            return []
        _signal_all(fds, signal.SIGTERM, own)
        left = _wait_exit(fds, signal_timeout)
        if left:
            rest = {r: fds[r] for r in left}
            _signal_all(rest, signal.SIGKILL, own)
            left = _wait_exit(rest, signal_timeout if kill_timeout is None else kill_timeout)
        # a pidfd is readable once the process is a zombie; re-check the stragglers the slow way
        return alive(left)
    finally:
        for fd in fds.values():
            os.close(fd)


_EXECUTOR = ThreadPoolExecutor(max_workers=4, thread_name_prefix="proc-sweep")


async def sweep_async(
    procs: Sequence[ProcRef],
    *,
    signal_timeout: float = 1.0,
    kill_timeout: float | None = None,
    own_pgid: int | None = None,
) -> list[ProcRef]:
    """`sweep` off the event loop; a cancelled caller still gets a finished sweep (regression 42)."""
    future = _EXECUTOR.submit(
        sweep, procs, signal_timeout=signal_timeout, kill_timeout=kill_timeout, own_pgid=own_pgid
    )
    try:
        return await asyncio.shield(asyncio.wrap_future(future))
    except asyncio.CancelledError:
        future.result()  # bounded by the sweep timeouts; a half-done sweep would leak processes
        raise


async def sweep_groups_async(
    pgids: Iterable[int], *, signal_timeout: float = 1.0, kill_timeout: float | None = None
) -> list[ProcRef]:
    """Snapshot `pgids` and their descendants first, then sweep them; returns survivors."""
    own = os.getpgrp()
    procs = snapshot_tree(g for g in pgids if g != own)
    return await sweep_async(procs, signal_timeout=signal_timeout, kill_timeout=kill_timeout)
