"""The verified retire ladder, on either containment.

docs/architecture.md §3, docs/spec-conformance.md §3.4, regressions 41-42.

With a cgroup (`legion.procs.cgroup`; the worker and everything it started are its members):

```
1. snapshot = cgroup.procs                               <- before anything is signalled
2. graceful? close the lifeline (EOF), wait `retire`       (default 5 s)
3. alive -> SIGTERM, wait `signal`                          (default 1 s)
4. alive -> SIGKILL, wait `kill`                            (default 1 s)
5. sweep: TERM every member (pidfds), wait `signal` for `populated 0`; cgroup.kill, wait `kill`
6. not `populated 0` -> RetireFailed (never report success that did not happen); else rmdir the cgroup
```

Nothing escapes a cgroup (setsid, double fork, a pure fork, a process started from a TERM handler
during the sweep) and pid reuse does not matter, so there is no freeze and no stray search.

Without one (no delegation, not root, `LEGION_CGROUPS=0`), the pid/pgid ladder:

```
1. snapshot descendants (/proc, recursive)               <- before anything is signalled
2.-4. as above
5. sweep: TERM every descendant pgid and pid, skipping our own pgid; wait `signal`; KILL; wait `kill`;
   then sweep the strays: processes the tree started meanwhile that re-parented to us (`strays_of`)
6. anything still alive -> RetireFailed
```

`graceful=False` (`stop --force`) skips step 2. On the pid/pgid path, before SIGTERM and SIGKILL the
worker's tree is frozen (`freeze_tree`: SIGSTOP the worker and its descendants until a snapshot finds
nothing new; the worker is a child subreaper, so everything its tree spawned is still under it) and
the snapshot extended with it: an escapee created after step 1 is swept too, and nothing can be born
between the last snapshot and the signal that ends the worker (its orphans would re-parent to the
root, outside every known group). SIGTERM is followed by SIGCONT, so a worker that ignores TERM runs
on (and is frozen again before SIGKILL); frozen descendants stay stopped until the sweep's TERM + CONT.
What it cannot contain: a pure `fork()` child that never execs and escapes by setsid from a TERM
handler during the sweep carries no lineage mark, and a pid reused inside the retire window.

The waits on the worker are event-loop waits on its pidfd (no polling delay); the sweep's waits run
in a thread. If the retiring task is cancelled (loop shutdown), the ladder finishes synchronously
with SIGKILL + sweep before the cancellation propagates, so a cancelled retire never leaves a
half-retired tree behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Protocol

from legion.codes import RETIRE_FAILED
from legion.procs.cgroup import Cgroup, pinned_members, reap_members
from legion.procs.lineage import strays_of
from legion.procs.pidfd import wait_exit
from legion.procs.subreaper import reap
from legion.procs.sweeper import freeze_tree, group_exists, run_to_completion, sweep, sweep_async
from legion.procs.table import ProcRef, alive, snapshot_descendants, snapshot_groups

__all__ = ["RETIRE_FAILED", "Retirable", "RetireFailed", "RetireReport", "RetireTimeouts", "retire_worker"]

_STRAY_ROUNDS = 3
_FREEZE_LIMIT = 0.5  # seconds to reach the frozen fixed point; only an uninterruptible process takes long


@dataclass(frozen=True)
class RetireTimeouts:
    """Seconds to wait at each step of the ladder (docs/architecture.md §3: 5 s / 1 s / 1 s).

    The same three numbers are a child's graceful shutdown in the OTP layer (`ChildSpec.shutdown`: one type)."""

    retire: float = 5.0
    signal: float = 1.0
    kill: float = 1.0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        for name in ("retire", "signal", "kill"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{type(self).__name__}.{name} must be a number of seconds >= 0, got {value!r}")


class Retirable(Protocol):
    """What the ladder needs of a worker handle (`legion.supervision.spawn.WorkerProcess`)."""

    worker_id: str
    pid: int
    pgid: int
    create_time: float
    cgroup: Cgroup | None

    @property
    def ref(self) -> ProcRef: ...
    @property
    def returncode(self) -> int | None: ...
    def is_alive(self) -> bool: ...
    def signal(self, sig: int) -> None: ...
    async def wait(self, timeout: float | None = None) -> int | None: ...
    def wait_blocking(self, timeout: float | None = None) -> int | None: ...
    def close_lifeline(self) -> None: ...
    def close(self) -> None: ...


@dataclass
class RetireReport:
    """What the ladder did: which step ended the worker, the sweep, and timings (seconds)."""

    worker_id: str
    pid: int
    graceful: bool
    step: str = "already_exited"  # "graceful" | "term" | "kill" | "already_exited" | "not_dead"
    exit_code: int | None = None
    descendants: int = 0  # processes in the snapshot (step 1, extended before SIGTERM/SIGKILL)
    swept: int = 0  # of those, still alive when the sweep started (step 5)
    survivors: list[ProcRef] = field(default_factory=list)
    containment: str = "pgid"  # "cgroup" | "pgid": which sweep ran
    timings: dict[str, float] = field(default_factory=dict)
    total: float = 0.0


class RetireFailed(RuntimeError):
    """Something survived the whole ladder; the retire did not happen."""

    code = RETIRE_FAILED

    def __init__(self, report: RetireReport) -> None:
        self.report = report
        self.survivors = list(report.survivors)
        pids = ", ".join(str(p.pid) for p in self.survivors[:20])
        super().__init__(
            f"{RETIRE_FAILED}: retiring worker {report.worker_id!r} (pid {report.pid}) left "
            f"{len(self.survivors)} process(es) alive: {pids}; they may be unkillable (uninterruptible "
            "sleep, another user's process) — inspect them with `ps -o pid,stat,user,cmd -p <pid>`"
        )


def _sweep_targets(proc: Retirable, snapshot: list[ProcRef]) -> list[ProcRef]:
    """The snapshot plus anything now in the same process groups (spawned after the snapshot)."""
    own = os.getpgrp()
    pgids = {p.pgid for p in snapshot} | {proc.pgid}
    pgids.discard(own)
    seen = {(p.pid, p.create_time) for p in snapshot}
    pgids = {g for g in pgids if group_exists(g)}  # one syscall each; a full scan only if needed
    extra = [p for p in snapshot_groups(pgids) if (p.pid, p.create_time) not in seen and p.pid != proc.pid]
    return snapshot + extra


def _finish(proc: Retirable, report: RetireReport, targets: list[ProcRef], survivors: list[ProcRef],
            t0: float) -> RetireReport:  # fmt: skip
    reap(p.pid for p in targets)  # orphans that re-parented to us (subreaper) and died
    report.exit_code = proc.returncode
    if proc.is_alive():
        survivors = [proc.ref, *survivors]
        report.step = "not_dead"
    report.survivors = survivors
    report.total = time.monotonic() - t0
    if survivors:
        proc.close_lifeline()
        raise RetireFailed(report)
    proc.close()
    return report


async def retire_worker(
    proc: Retirable, *, graceful: bool = True, timeouts: RetireTimeouts | None = None
) -> RetireReport:
    """Run the ladder on `proc`; returns a report or raises RetireFailed carrying the survivors."""
    timeouts = timeouts or RetireTimeouts()
    timeouts.validate()
    if proc.cgroup is not None:
        return await _retire_in_cgroup(proc, proc.cgroup, graceful, timeouts)
    t0 = time.monotonic()
    report = RetireReport(worker_id=proc.worker_id, pid=proc.pid, graceful=graceful)
    snapshot = snapshot_descendants(proc.pid) if proc.is_alive() else []
    report.descendants = len(snapshot)
    report.timings["snapshot"] = time.monotonic() - t0
    try:
        await _stop_worker(proc, graceful, timeouts, report, snapshot)
        report.descendants = len(snapshot)
        t_sweep = time.monotonic()
        targets = _sweep_targets(proc, snapshot)
        live = alive(targets)
        report.swept = len(live)
        survivors: list[ProcRef] = []
        if live:  # nothing alive = nothing to sweep; skip the hop to the sweep thread
            survivors = await sweep_async(live, signal_timeout=timeouts.signal, kill_timeout=timeouts.kill)
        survivors += await run_to_completion(_sweep_strays, proc, targets, timeouts)
        report.timings["sweep"] = time.monotonic() - t_sweep
    except asyncio.CancelledError:
        _finish_cancelled(proc, snapshot, timeouts)
        raise
    return _finish(proc, report, targets, survivors, t0)


async def _retire_in_cgroup(proc: Retirable, cgroup: Cgroup, graceful: bool, timeouts: RetireTimeouts) -> RetireReport:
    """The ladder on a worker in its own cgroup: the snapshot is cgroup.procs, the last step cgroup.kill."""
    t0 = time.monotonic()
    report = RetireReport(worker_id=proc.worker_id, pid=proc.pid, graceful=graceful, containment="cgroup")
    seen = set(cgroup.procs(recursive=True))
    report.descendants = len(seen - {proc.pid})
    report.timings["snapshot"] = time.monotonic() - t0
    try:
        await _stop_worker(proc, graceful, timeouts, report, None)
        t_sweep = time.monotonic()
        survivors, swept = await run_to_completion(_sweep_cgroup, cgroup, timeouts, seen)
        report.swept = swept
        report.descendants = len(seen - {proc.pid})  # the snapshot extended by what the sweep found
        report.timings["sweep"] = time.monotonic() - t_sweep
    except asyncio.CancelledError:
        proc.signal(signal.SIGKILL)
        cgroup.kill()
        cgroup.wait_empty(timeouts.kill)
        proc.wait_blocking(timeouts.kill)
        reap(seen - {proc.pid})
        reap_members(cgroup, {proc.pid})
        proc.close_lifeline()
        raise
    if proc.returncode is None:  # cgroup.events can report the exit a moment before the pidfd does
        await proc.wait(timeouts.kill)
    reap(seen - {proc.pid})  # orphans that re-parented to us (subreaper) and died
    reap_members(cgroup, {proc.pid})  # and those born and killed between two reads of cgroup.procs
    if not survivors:
        cgroup.remove()
    survivors = [p for p in survivors if p.pid != proc.pid]
    return _finish(proc, report, [], survivors, t0)


def _sweep_cgroup(cgroup: Cgroup, timeouts: RetireTimeouts, seen: set[int]) -> tuple[list[ProcRef], int]:
    """Step 5 on a cgroup: TERM the members, wait (≤ `signal`) for them to exit, cgroup.kill what is
    left (whatever was born meanwhile included), verify `populated 0` (≤ `kill`); returns (survivors,
    members found at the start). `seen` collects every member pid (to reap them)."""
    fds = pinned_members(cgroup, exclude=set())
    found = len(fds)
    seen.update(fds)
    try:
        for sig in (signal.SIGTERM, signal.SIGCONT):  # a stopped process only acts on TERM once continued
            for fd in fds.values():
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, sig)
        wait_exit(list(fds.values()), timeouts.signal)
        late = pinned_members(cgroup, exclude=seen)  # born meanwhile
        seen.update(late)
        fds.update(late)
        cgroup.kill()  # the last step, always: every member at once, whatever was born meanwhile included
        if not cgroup.wait_empty(timeouts.kill):
            return cgroup.refs(), found
        # `populated 0` comes as the last member leaves the cgroup, a step of its exit *before* it turns zombie
        # and hands its orphans to us (its subreaper): wait for that, or the reap that follows can miss a member
        # that is still exiting, and it stays our zombie for good once the cgroup is gone
        wait_exit(list(fds.values()), timeouts.kill)
        return [], found
    finally:
        for fd in fds.values():
            os.close(fd)


def _sweep_strays(proc: Retirable, targets: list[ProcRef], timeouts: RetireTimeouts) -> list[ProcRef]:
    """Step 5b: what the tree started while it was being swept and that re-parented to us; appended
    to `targets` (so they are reaped). A few rounds: each sweep's TERM may start another generation."""
    survivors: list[ProcRef] = []
    for _ in range(_STRAY_ROUNDS):
        known = {(p.pid, p.create_time) for p in targets}
        strays = [p for p in strays_of(proc.ref) if (p.pid, p.create_time) not in known]
        if not strays:
            break
        targets.extend(strays)
        survivors += sweep(strays, signal_timeout=timeouts.signal, kill_timeout=timeouts.kill)
    return survivors


def _freeze_into(snapshot: list[ProcRef], worker: ProcRef, timeout: float) -> None:
    """Freeze the worker's tree and record it (in the thread: a cancelled retire still sweeps it)."""
    _merge(snapshot, freeze_tree(worker, timeout))


def _merge(snapshot: list[ProcRef], more: list[ProcRef]) -> None:
    known = {(p.pid, p.create_time) for p in snapshot}
    snapshot.extend(p for p in more if (p.pid, p.create_time) not in known)


async def _stop_worker(proc: Retirable, graceful: bool, timeouts: RetireTimeouts, report: RetireReport,
                       snapshot: list[ProcRef] | None) -> None:  # fmt: skip
    """Steps 2-4: lifeline EOF, SIGTERM, SIGKILL, each followed by a pidfd wait (and, on the pid/pgid
    path, `snapshot` extended by a freeze before each signal)."""
    if not proc.is_alive():
        return
    steps: list[tuple[str, int | None, float]] = []
    if graceful:
        steps.append(("graceful", None, timeouts.retire))
    steps += [("term", signal.SIGTERM, timeouts.signal), ("kill", signal.SIGKILL, timeouts.kill)]
    for name, sig, wait in steps:
        t = time.monotonic()
        if sig is not None and snapshot is not None and proc.is_alive():
            # the tree may have grown during the wait (the worker is a subreaper, so it is all still
            # under it). Freeze it before the signal that can end the worker: a snapshot alone misses
            # what is born between the scan and the worker's death, and those orphans re-parent to
            # the root outside every group we know. The sweep continues them after its TERM.
            await run_to_completion(_freeze_into, snapshot, proc.ref, min(wait, _FREEZE_LIMIT))
        if sig is None:
            proc.close_lifeline()
        else:
            proc.signal(sig)
            if sig == signal.SIGTERM:
                proc.signal(signal.SIGCONT)  # a stopped worker only acts on TERM once continued
        code = await proc.wait(wait)
        report.timings[name] = time.monotonic() - t
        if code is not None:
            report.step = name
            return
    report.step = "not_dead"


def _finish_cancelled(proc: Retirable, snapshot: list[ProcRef], timeouts: RetireTimeouts) -> None:
    """The retiring task was cancelled: finish hard and synchronously (bounded by the timeouts)."""
    proc.signal(signal.SIGKILL)
    proc.wait_blocking(timeouts.kill)
    targets = _sweep_targets(proc, snapshot)
    sweep(targets, signal_timeout=timeouts.signal, kill_timeout=timeouts.kill)
    _sweep_strays(proc, targets, timeouts)
    reap(p.pid for p in targets)
    proc.close_lifeline()
