"""The sweep: TERM then KILL every process group and pid of a snapshot, through pidfds; and the freeze.

Used by the retire ladder (`legion.procs.ladder`), by a worker taking its own tree down, and by in-pool
session retire for a session's tool process groups.
Rules (docs/architecture.md §3, docs/spec-conformance.md §3.4, regressions 41-42):

- signals go through pidfds opened after the identity check, so a pid recycled between the check and
  the kill cannot be hit; our own process group is never signalled;
- the waits are plain blocking polls; `sweep_async` runs them in a thread and, if its caller is
  cancelled (loop shutdown), finishes the sweep before propagating the cancellation;
- `freeze_tree` SIGSTOPs a subreaper and its descendants to a fixed point, so nothing can be born
  between the last snapshot and the signal that ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from legion.procs.pidfd import open_pidfds, pidfd_exited, wait_exit
from legion.procs.table import (
    ProcRef,
    alive,
    descendant_pids,
    is_alive,
    live_refs,
    proc_table,
    snapshot_descendants,
    snapshot_tree,
)

__all__ = [
    "freeze_tree",
    "group_exists",
    "run_to_completion",
    "sweep",
    "sweep_async",
    "sweep_groups_async",
]

T = TypeVar("T")


def group_exists(pgid: int) -> bool:
    """Whether any process (zombies included) is still in process group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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

    pinned = open_pidfds([root])
    try:
        for ref, fd in pinned.items():
            stop(ref, fd)
        while True:
            fresh = [r for r in snapshot_descendants(root.pid) if (r.pid, r.create_time) not in seen]
            fds = open_pidfds([r for r in fresh if r.pid != os.getpid()])
            for ref, fd in fds.items():
                seen[(ref.pid, ref.create_time)] = ref
                stop(ref, fd)
                os.close(fd)
            held = [r for r in [root, *seen.values()] if r not in unstoppable and is_alive(r)]
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
    left = set(wait_exit(list(fds.values()), timeout))
    return [ref for ref, fd in fds.items() if fd in left]


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
    fds = open_pidfds([p for p in procs if p.pid != own_pid])
    try:
        if not fds:
            return []
        _signal_all(fds, signal.SIGTERM, own)
        _signal_all(fds, signal.SIGCONT, own)  # a stopped process only acts on TERM once continued
        left = _wait_exit(fds, signal_timeout)
        if left:
            rest = {r: fds[r] for r in left}
            # what ignored TERM may have spawned meanwhile (e.g. setsid children) is killed with it
            table = proc_table()
            known = {(r.pid, r.create_time) for r in fds}
            born = [r for r in live_refs(table, descendant_pids(table, [r.pid for r in left]))
                    if (r.pid, r.create_time) not in known and r.pid != own_pid]  # fmt: skip
            extra = open_pidfds(born)
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
