"""Lineage marks: recognise the orphans of a worker's tree that re-parented to us (the subreaper).

The fork server sets `LINEAGE_ENV=<lineage_mark(worker)>` in every rpc worker, so each process its
tree execs carries it. A process that never exec'd (a pure fork) carries no mark: only a cgroup
(`legion.procs.cgroup`) contains those.
"""

from __future__ import annotations

import os
import time

from legion.procs.table import (
    CT_TOLERANCE,
    DEAD_STATES,
    ProcRef,
    descendant_pids,
    live_refs,
    proc_stat,
    proc_table,
    start_ticks,
)

__all__ = ["LINEAGE_ENV", "lineage_mark", "own_children", "strays_of"]

LINEAGE_ENV = "LEGION_WORKER"
_EXEC_WAIT = 0.1  # seconds to wait for the environment of a process caught in the middle of execve()
_CHILDREN = "/proc/self/task/{}/children"
# On a kernel without CONFIG_PROC_CHILDREN, a scan of the process table finds our children; while many workers are
# retired at once (a run's end) one scan serves every retire of the same round (`own_children(max_age=)`).
_scan: list[tuple[float, list[int]]] = []  # (when, our children then): the last scan


def lineage_mark(ref: ProcRef) -> str:
    """`<pid>:<start time in clock ticks>`: names one process for good, even after its pid is reused."""
    return f"{ref.pid}:{start_ticks(ref.create_time)}"


def own_children(*, max_age: float = 0.0) -> list[int]:
    """Pids of our direct children (every thread's, as orphans re-parent to any live thread of ours).

    Without `/proc/self/task/*/children` they come from a scan of the whole process table; `max_age` lets a scan up
    to that many seconds old serve instead (for a caller that a child missed now only delays: it finds it later)."""
    pids: list[int] = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        tids = []
    for tid in tids:
        try:
            with open(_CHILDREN.format(tid), "rb") as fh:
                pids.extend(int(p) for p in fh.read().split())
        except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: one full scan instead
            return _scanned_children(max_age)
        except OSError:
            continue
    return pids


def _scanned_children(max_age: float) -> list[int]:
    now = time.monotonic()
    if _scan and max_age > 0 and now - _scan[0][0] <= max_age:
        return list(_scan[0][1])
    me = os.getpid()
    children = [pid for pid, st in proc_table().items() if st.ppid == me]
    _scan[:] = [(now, children)]
    return list(children)


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
    for pid in own_children():
        st = proc_stat(pid)
        if st is not None and st.state not in DEAD_STATES and st.create_time >= worker.create_time - CT_TOLERANCE:
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
    table = proc_table()
    return live_refs(table, [p for p in found if p in table] + descendant_pids(table, found))
