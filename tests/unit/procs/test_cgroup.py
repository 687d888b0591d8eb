"""cgroup v2 containment: discovery from mountinfo, the decision and its reason, and a cgroup's life."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from legion.procs import Cgroup, ProcRef, containment, remove_dead_runs
from legion.procs.cgroup import cgroup2_mount, create_run_cgroup, reap_members, run_cgroup_name, run_owner

pytestmark = pytest.mark.timeout(30)
HERE = containment({})
needs_cgroups = pytest.mark.skipif(not HERE.cgroups, reason=f"no cgroup containment here: {HERE.reason}")

MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_the_cgroup2_mount_is_found_in_mountinfo_among_v1_ones(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    assert cgroup2_mount(str(info)) == (Path("/sys/fs/cgroup/unified"), "/")
    info.write_text(MOUNTINFO.splitlines()[0] + "\n")
    assert cgroup2_mount(str(info)) is None
    assert cgroup2_mount(str(tmp_path / "missing")) is None


def test_legion_cgroups_0_forces_containment_off() -> None:
    for value in ("0", "off", "no"):
        decision = containment({"LEGION_CGROUPS": value})
        assert not decision.cgroups and f"LEGION_CGROUPS={value} forces cgroups off" == decision.reason


def test_run_cgroup_names_carry_their_owner() -> None:
    me = ProcRef.from_pid(os.getpid())
    assert me is not None
    name = run_cgroup_name(me, 3)
    pid, ticks = run_owner(name) or (0, 0)
    assert pid == os.getpid() and ticks > 0
    assert run_owner("w123.4") is None and run_owner("legion-x.1.2") is None and run_owner("system.slice") is None


@pytest.fixture
def run() -> Iterator[Cgroup]:
    assert HERE.parent is not None
    cg = create_run_cgroup(HERE.parent)
    yield cg
    cg.kill_and_remove(5.0)


@needs_cgroups
def test_members_kill_and_populated_0(run: Cgroup) -> None:
    worker = run.child("w1")
    assert worker.procs() == [] and not worker.populated() and worker.wait_empty(0)
    # a process that escapes by setsid and double fork, and one that forks without exec: all stay in
    script = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(100)\n    os._exit(0)\nos.fork(); time.sleep(100)\n"
    proc = subprocess.Popen([sys.executable, "-c", script], preexec_fn=lambda: worker.join())
    deadline = time.monotonic() + 10
    while len(worker.procs()) < 3:
        assert time.monotonic() < deadline, worker.procs()
        time.sleep(0.01)
    assert proc.pid in worker.procs() and worker.populated() and run.populated()
    assert len(run.procs(recursive=True)) == 3 and run.procs() == []
    assert {r.pid for r in worker.refs()} == set(worker.procs())
    assert not worker.wait_empty(0.05)
    t0 = time.monotonic()
    worker.kill()
    assert worker.wait_empty(5.0)  # woken by cgroup.events, not by a poll interval
    assert time.monotonic() - t0 < 1.0
    assert proc.wait(5) == -signal.SIGKILL
    assert worker.remove() and not worker.path.exists()


@needs_cgroups
def test_a_populated_cgroup_is_never_removed_and_our_zombies_in_it_are_reaped(run: Cgroup) -> None:
    worker = run.child("w2")
    proc = subprocess.Popen(["sleep", "100"], preexec_fn=lambda: worker.join())
    try:
        assert not worker.remove() and worker.path.exists()
    finally:
        proc.kill()
    while worker.populated():
        time.sleep(0.01)
    assert reap_members(worker, exclude=set()) == {proc.pid: -signal.SIGKILL}  # a zombie is no member
    assert worker.remove()


@needs_cgroups
def test_only_the_runs_of_dead_owners_are_removed(run: Cgroup) -> None:
    parent = run.child("parent")  # a stand-in for the cgroup runs are made under
    gone = subprocess.Popen(["true"])
    gone.wait()
    ghost = ProcRef(pid=gone.pid, pgid=0, create_time=time.time() - 5)
    me = ProcRef.from_pid(os.getpid())
    assert me is not None
    dead, live, other = parent.child(run_cgroup_name(ghost, 1)), parent.child(run_cgroup_name(me, 1)), parent.child("x")
    assert remove_dead_runs(parent.path) == [str(dead.path)]
    assert not dead.path.exists() and live.path.exists() and other.path.exists()
