"""The process table, read from /proc: process references with start times and descendant snapshots.

The one reader of the process table in legion (psutil is not used here: one full scan of /proc with
raw syscalls takes ~0.35 ms on the 2-core machine against ~2.1 ms for `psutil.process_iter`, and a
scan is the hot path of every retire). Rules (docs/architecture.md §3, docs/spec-conformance.md §3.4, regressions 41-42):

- a snapshot is taken before anything is signalled (after a parent dies the links are gone);
- a zombie counts as dead; a pid whose start time differs from the snapshot's is a different process
  (pid reuse).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "CT_TOLERANCE",
    "DEAD_STATES",
    "ProcRef",
    "ProcStat",
    "alive",
    "boot_time",
    "descendant_pids",
    "is_alive",
    "live_refs",
    "orphans_of",
    "proc_stat",
    "proc_table",
    "snapshot_descendants",
    "snapshot_groups",
    "snapshot_tree",
    "start_ticks",
]

# create_time is derived from /proc/<pid>/stat starttime (clock ticks since boot) as ticks / CLK_TCK +
# btime (psutil derives it the same way, so older owner records compare equal); the same process
# always compares equal, a recycled pid differs by at least one tick.
CT_TOLERANCE = 1e-3
_CLK_TCK = os.sysconf("SC_CLK_TCK")
DEAD_STATES = frozenset("ZXx")
_BOOT_TIME: float | None = None


class ProcStat(NamedTuple):
    state: str
    ppid: int
    pgid: int
    create_time: float


def boot_time() -> float:
    """Seconds since the epoch at boot (`btime` of /proc/stat)."""
    global _BOOT_TIME
    if _BOOT_TIME is None:
        with open("/proc/stat", "rb") as fh:
            line = next(raw for raw in fh if raw.startswith(b"btime"))
        _BOOT_TIME = float(line.split()[1])
    return _BOOT_TIME


def start_ticks(create_time: float) -> int:
    """A create_time back in clock ticks since boot (the kernel's own unit: exact, unlike seconds)."""
    return round((create_time - boot_time()) * _CLK_TCK)


def proc_stat(pid: int) -> ProcStat | None:
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
        return ProcStat(fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19]) / _CLK_TCK + boot_time())
    except (IndexError, ValueError):
        return None


def proc_table() -> dict[int, ProcStat]:
    """One pass over /proc: pid -> (state, ppid, pgid, create_time)."""
    table: dict[int, ProcStat] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
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
        st = proc_stat(pid)
        if st is None or st.state in DEAD_STATES:
            return None
        return cls(pid=pid, pgid=st.pgid, create_time=st.create_time)


def live_refs(table: dict[int, ProcStat], pids: Iterable[int]) -> list[ProcRef]:
    """ProcRefs of those `pids` (all keys of `table`) that are not zombies."""
    refs = []
    for pid in pids:
        st = table[pid]
        if st.state not in DEAD_STATES:
            refs.append(ProcRef(pid=pid, pgid=st.pgid, create_time=st.create_time))
    return refs


def descendant_pids(table: dict[int, ProcStat], roots: Iterable[int]) -> list[int]:
    """Every descendant of `roots` in `table` (recursive, roots excluded)."""
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
    table = proc_table()
    if pid not in table:
        return []
    return live_refs(table, descendant_pids(table, [pid]))


def snapshot_groups(pgids: Iterable[int]) -> list[ProcRef]:
    """Every live process whose process group is one of `pgids`."""
    wanted = {g for g in pgids if g > 1}
    if not wanted:
        return []
    table = proc_table()
    return live_refs(table, [pid for pid, st in table.items() if st.pgid in wanted])


def snapshot_tree(pgids: Iterable[int]) -> list[ProcRef]:
    """Every live process in `pgids` plus all their descendants (deduplicated), from one scan."""
    wanted = {g for g in pgids if g > 1}
    if not wanted:
        return []
    table = proc_table()
    members = [pid for pid, st in table.items() if st.pgid in wanted]
    return live_refs(table, members + descendant_pids(table, members))


def is_alive(ref: ProcRef) -> bool:
    """Whether `ref` still runs: same pid *and* start time, not a zombie."""
    st = proc_stat(ref.pid)
    if st is None or abs(st.create_time - ref.create_time) > CT_TOLERANCE:
        return False  # gone, or the pid was reused: our process is gone
    return st.state not in DEAD_STATES


def alive(procs: Iterable[ProcRef]) -> list[ProcRef]:
    """The processes that are still running (zombies and recycled pids count as dead)."""
    return [p for p in procs if is_alive(p)]


def orphans_of(procs: Iterable[ProcRef], protected: set[int], max_depth: int = 64) -> list[ProcRef]:
    """Those of `procs` whose parent chain reaches this process without passing through a protected pid
    (they re-parented to us, the subreaper)."""
    me = os.getpid()
    found: list[ProcRef] = []
    for ref in procs:
        pid = ref.pid
        for _ in range(max_depth):
            if pid in protected or pid == me:
                break
            st = proc_stat(pid)
            if st is None:
                break
            if st.ppid == me:
                found.append(ref)
                break
            if st.ppid <= 1:
                break
            pid = st.ppid
    return found
