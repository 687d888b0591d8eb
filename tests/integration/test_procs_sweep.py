"""legion.procs sweep: snapshot before signalling, zombies dead, pid reuse guarded, own pgid skipped, survivors reported."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from legion.procs import (
    ProcRef,
    alive,
    lineage,
    snapshot_descendants,
    snapshot_groups,
    snapshot_tree,
    sweep,
    sweep_async,
    sweep_groups_async,
)
from legion.procs import sweeper as sweep_mod
from tests.support import wait_until

pytestmark = pytest.mark.timeout(30)

IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ok', flush=True); time.sleep(1000)"




@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        descendants: list[psutil.Process] = []
        if p.poll() is None:  # its descendants too: killing the leader alone orphans them to init
            with contextlib.suppress(psutil.NoSuchProcess):
                descendants = psutil.Process(p.pid).children(recursive=True)
            p.kill()
        p.wait()
        for d in descendants:
            with contextlib.suppress(psutil.NoSuchProcess):
                d.kill()
        psutil.wait_procs(descendants, timeout=5)


def _popen(started: list[subprocess.Popen[bytes]], args: list[str], **kw: object) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, **kw)  # type: ignore[call-overload]
    started.append(p)
    return p


def _tree(started: list[subprocess.Popen[bytes]]) -> tuple[subprocess.Popen[bytes], list[ProcRef]]:
    """A group leader with 2 children in its group and 1 that setsid'd away; waits until all exist."""
    script = "sleep 1000 & sleep 1000 & setsid sleep 1000 & echo started; wait"
    leader = _popen(started, ["bash", "-c", script], start_new_session=True)
    assert leader.stdout is not None
    assert leader.stdout.readline() == b"started\n"
    # settled: 3 descendants, and the escapee has called setsid() (until then it is in our group)
    wait_until(lambda: sorted(p.pgid == leader.pid for p in snapshot_descendants(leader.pid)) == [False, True, True], deadline=5.0)
    return leader, snapshot_descendants(leader.pid)


def test_snapshot_is_recursive_and_records_groups(procs: list[subprocess.Popen[bytes]]) -> None:
    leader, snap = _tree(procs)
    groups = sorted(p.pgid for p in snap)
    assert groups.count(leader.pid) == 2  # same group as the leader
    assert len(set(groups)) == 2  # the setsid one leads its own group
    assert {p.pid for p in snapshot_groups([leader.pid])} == {leader.pid} | {p.pid for p in snap if p.pgid == leader.pid}
    assert {p.pid for p in snapshot_tree([leader.pid])} == {leader.pid} | {p.pid for p in snap}


def test_sweep_kills_every_group_and_pid_after_the_parent_is_gone(procs: list[subprocess.Popen[bytes]]) -> None:
    leader, snap = _tree(procs)
    leader.kill()  # the /proc links die with the parent; the snapshot still knows the tree
    leader.wait()
    assert sweep(snap, signal_timeout=1.0) == []
    assert alive(snap) == []


def test_zombie_counts_as_dead(procs: list[subprocess.Popen[bytes]]) -> None:
    child = _popen(procs, ["sleep", "1000"])
    ref = ProcRef.from_pid(child.pid)
    assert ref is not None and alive([ref]) == [ref]
    os.kill(child.pid, signal.SIGKILL)
    wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, deadline=5.0)
    assert alive([ref]) == []  # still in the process table, but dead
    assert sweep([ref]) == []


def test_pid_reuse_is_never_signalled(procs: list[subprocess.Popen[bytes]]) -> None:
    child = _popen(procs, ["sleep", "1000"])
    ref = ProcRef.from_pid(child.pid)
    assert ref is not None
    recycled = ProcRef(pid=ref.pid, pgid=ref.pgid, create_time=ref.create_time - 5.0)
    assert alive([recycled]) == []
    assert sweep([recycled], signal_timeout=0.2) == []
    time.sleep(0.05)
    assert child.poll() is None  # the "recycled" pid belongs to another process: untouched


def test_term_ignoring_process_is_killed(procs: list[subprocess.Popen[bytes]]) -> None:
    child = _popen(procs, [sys.executable, "-c", IGNORE_TERM], start_new_session=True)
    assert child.stdout is not None and child.stdout.readline() == b"ok\n"
    ref = ProcRef.from_pid(child.pid)
    assert ref is not None
    t0 = time.monotonic()
    assert sweep([ref], signal_timeout=0.3, kill_timeout=2.0) == []
    assert time.monotonic() - t0 >= 0.25  # TERM was tried first and waited for
    assert child.wait(2) == -signal.SIGKILL


def test_own_pgid_is_skipped(procs: list[subprocess.Popen[bytes]]) -> None:
    listed = _popen(procs, ["sleep", "1000"])  # both stay in our own process group
    bystander = _popen(procs, ["sleep", "1000"])
    ref = ProcRef.from_pid(listed.pid)
    assert ref is not None and ref.pgid == os.getpgrp()
    assert sweep([ref], signal_timeout=1.0) == []
    assert listed.wait(2) == -signal.SIGTERM  # killed by pid
    assert bystander.poll() is None  # our group was never signalled


def test_group_signal_reaches_unlisted_members_unless_it_is_own_pgid(procs: list[subprocess.Popen[bytes]]) -> None:
    for own_pgid, bystander_dies in ((None, True), ("group", False)):
        leader = _popen(procs, ["sleep", "1000"], process_group=0)
        member = _popen(procs, ["sleep", "1000"], process_group=leader.pid)
        ref = ProcRef.from_pid(leader.pid)
        assert ref is not None
        sweep([ref], signal_timeout=1.0, own_pgid=leader.pid if own_pgid else None)
        assert leader.wait(2) == -signal.SIGTERM
        if bystander_dies:
            assert member.wait(2) == -signal.SIGTERM
        else:
            time.sleep(0.05)
            assert member.poll() is None


def test_unkillable_survivor_is_reported(procs: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Root can kill anything here, so the unkillable process is simulated by dropping its signals."""
    child = _popen(procs, ["sleep", "1000"], start_new_session=True)
    ref = ProcRef.from_pid(child.pid)
    assert ref is not None
    real = sweep_mod._signal_all

    def deaf(fds: dict[ProcRef, int], sig: int, own_pgid: int) -> None:
        real({r: fd for r, fd in fds.items() if r.pid != child.pid}, sig, own_pgid)

    monkeypatch.setattr(sweep_mod, "_signal_all", deaf)
    assert sweep([ref], signal_timeout=0.05, kill_timeout=0.05) == [ref]


async def test_sweep_async_finishes_even_when_the_caller_is_cancelled(procs: list[subprocess.Popen[bytes]]) -> None:
    child = _popen(procs, [sys.executable, "-c", IGNORE_TERM], start_new_session=True)
    assert child.stdout is not None and child.stdout.readline() == b"ok\n"
    ref = ProcRef.from_pid(child.pid)
    assert ref is not None
    task = asyncio.ensure_future(sweep_async([ref], signal_timeout=0.5, kill_timeout=2.0))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert alive([ref]) == []  # the sweep completed before the cancellation propagated


async def test_sweep_groups_async_takes_the_escapees_too(procs: list[subprocess.Popen[bytes]]) -> None:
    leader, snap = _tree(procs)
    assert await sweep_groups_async([leader.pid, os.getpgrp()], signal_timeout=1.0) == []
    assert leader.wait(2) < 0
    assert alive(snap) == []


def test_has_children_and_group_exists_are_exact() -> None:
    code = (
        "import os, subprocess\n"
        "from legion.procs import has_children, group_exists\n"
        "r = [has_children()]\n"
        "p = subprocess.Popen(['sleep', '1000'], process_group=0)\n"
        "r += [has_children(), group_exists(p.pid)]\n"
        "p.kill(); os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)\n"
        "r += [has_children(), group_exists(p.pid)]  # a zombie is still a child and a group member\n"
        "p.wait(); r += [has_children(), group_exists(p.pid)]\n"
        "print(r)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "[False, True, True, True, True, False, False]", out.stderr


SPAWN_ON_TERM = (
    "import signal, subprocess, sys, time\n"
    "def on_term(*_):\n"
    "    p = subprocess.Popen(['sleep', '1000'], start_new_session=True)\n"
    "    print(p.pid, flush=True)\n"
    "signal.signal(signal.SIGTERM, on_term)\n"
    "print('ok', flush=True)\n"
    "while True: time.sleep(1)\n"
)


def test_what_a_term_ignorer_spawns_during_the_wait_is_killed_too(procs: list[subprocess.Popen[bytes]]) -> None:
    child = _popen(procs, [sys.executable, "-c", SPAWN_ON_TERM], start_new_session=True)
    assert child.stdout is not None and child.stdout.readline() == b"ok\n"
    ref = ProcRef.from_pid(child.pid)
    assert ref is not None
    assert sweep([ref], signal_timeout=0.5, kill_timeout=2.0) == []
    late_pid = int(child.stdout.readline())  # spawned by the TERM handler, in a new session
    late = ProcRef.from_pid(late_pid)
    try:
        assert late is None  # gone (or a zombie): the KILL round included it
    finally:
        if late is not None:
            os.kill(late_pid, signal.SIGKILL)


def test_stopped_process_gets_its_term(procs: list[subprocess.Popen[bytes]]) -> None:
    child = _popen(procs, ["sleep", "1000"], start_new_session=True)
    os.kill(child.pid, signal.SIGSTOP)
    wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_STOPPED, deadline=5.0)
    ref = ProcRef.from_pid(child.pid)
    assert ref is not None
    assert sweep([ref], signal_timeout=2.0) == []
    assert child.wait(2) == -signal.SIGTERM  # continued, so TERM acted before any KILL was needed


SPAWN_FOREVER = (
    "import subprocess, time\n"
    "print('ok', flush=True)\n"
    "while True:\n"
    "    subprocess.Popen(['sleep', '1000'], start_new_session=True, stdout=subprocess.DEVNULL)\n"
    "    time.sleep(0.002)\n"
)


def test_freeze_tree_stops_a_spawning_tree_at_a_fixed_point(procs: list[subprocess.Popen[bytes]]) -> None:
    child = _popen(procs, [sys.executable, "-c", SPAWN_FOREVER], start_new_session=True)
    assert child.stdout is not None and child.stdout.readline() == b"ok\n"
    ref = ProcRef.from_pid(child.pid)
    assert ref is not None
    wait_until(lambda: len(snapshot_descendants(child.pid)) >= 3, deadline=5.0)
    frozen = sweep_mod.freeze_tree(ref, timeout=2.0)
    try:
        # a parent caught in vfork() waits in D (uninterruptible) for its stopped child: frozen too
        frozen_states = {psutil.STATUS_STOPPED, psutil.STATUS_DISK_SLEEP}
        assert psutil.Process(child.pid).status() in frozen_states
        assert {p.status() for p in map(psutil.Process, (r.pid for r in frozen))} <= frozen_states
        time.sleep(0.05)  # a stopped tree spawns nothing more: the snapshot is the whole tree
        assert {(r.pid, r.create_time) for r in snapshot_descendants(child.pid)} == {(r.pid, r.create_time) for r in frozen}
    finally:
        assert sweep([ref, *frozen], signal_timeout=1.0) == []


def test_freeze_tree_does_not_wait_for_a_process_it_may_not_stop(procs: list[subprocess.Popen[bytes]],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Another user's (setuid) descendant refuses SIGSTOP with EPERM: waiting for it to stop cannot help."""
    leader, snap = _tree(procs)
    foreign = snap[0]
    real = signal.pidfd_send_signal
    pids_by_fd: dict[int, int] = {}
    real_open = os.pidfd_open

    def pidfd_open(pid: int, flags: int = 0) -> int:
        fd = real_open(pid, flags)
        pids_by_fd[fd] = pid
        return fd

    def send(fd: int, sig: int, *args: object) -> None:
        if pids_by_fd.get(fd) == foreign.pid and sig == signal.SIGSTOP:
            raise PermissionError(1, "Operation not permitted")
        real(fd, sig, *args)

    monkeypatch.setattr(sweep_mod.os, "pidfd_open", pidfd_open)
    monkeypatch.setattr(sweep_mod.signal, "pidfd_send_signal", send)
    ref = ProcRef.from_pid(leader.pid)
    assert ref is not None
    t0 = time.monotonic()
    frozen = sweep_mod.freeze_tree(ref, timeout=5.0)
    assert time.monotonic() - t0 < 2.0  # settled without the foreign process, long before the bound
    assert {(r.pid, r.create_time) for r in frozen} == {(r.pid, r.create_time) for r in snap}
    assert psutil.Process(foreign.pid).status() != psutil.STATUS_STOPPED
    monkeypatch.undo()
    assert sweep([ref, *frozen], signal_timeout=1.0) == []


def test_strays_of_finds_marked_children_even_mid_exec(procs: list[subprocess.Popen[bytes]],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Our children carrying a worker's lineage mark are its strays; one caught mid-execve reads empty first."""
    me = ProcRef.from_pid(os.getpid())
    assert me is not None
    mark = lineage.lineage_mark(me)
    ours = _popen(procs, ["sleep", "1000"], env={**os.environ, lineage.LINEAGE_ENV: mark})
    other = _popen(procs, ["sleep", "1000"], env={**os.environ, lineage.LINEAGE_ENV: "1:1"})
    unmarked = _popen(procs, ["sleep", "1000"])
    wait_until(lambda: all(len(psutil.Process(p.pid).environ()) > 0 for p in (ours, other, unmarked)), deadline=5.0)
    assert [r.pid for r in lineage.strays_of(me)] == [ours.pid]
    real = lineage._carries
    reads: list[int] = []

    def mid_exec(pid: int, entry: bytes) -> bool | None:
        reads.append(pid)
        return None if reads.count(pid) <= 3 else real(pid, entry)  # empty environ, as during execve()

    monkeypatch.setattr(lineage, "_carries", mid_exec)
    assert [r.pid for r in lineage.strays_of(me)] == [ours.pid]
    assert reads.count(ours.pid) == 4
