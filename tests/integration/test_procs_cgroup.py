"""A cgroup's life with real processes in it: members, kill, populated 0, removal, dead owners' runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from legion.procs import Cgroup, ProcRef, containment, remove_dead_runs
from legion.procs.cgroup import create_run_cgroup, reap_members, run_cgroup_name
from tests.support import wait_until

pytestmark = pytest.mark.timeout(30)
HERE = containment({})
needs_cgroups = pytest.mark.skipif(not HERE.cgroups, reason=f"no cgroup containment here: {HERE.reason}")


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
    # (the escaper's middle process is reaped before the plain fork, so exactly 3 stay once the third appears)
    script = ("import os, time\npid = os.fork()\nif pid == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              "        time.sleep(100)\n    os._exit(0)\nos.waitpid(pid, 0)\nos.fork(); time.sleep(100)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], preexec_fn=lambda: worker.join())
    wait_until(lambda: len(worker.procs()) >= 3, 10, "the 3 processes in the worker cgroup", interval=0.01)
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
    wait_until(lambda: not worker.populated(), 10, "the killed member to leave the cgroup", interval=0.01)
    assert reap_members(worker, exclude=set()) == {proc.pid: -signal.SIGKILL}  # a zombie is no member
    assert worker.remove()


@needs_cgroups
def test_removal_goes_down_a_tree_of_cgroups_and_stops_at_a_populated_one(run: Cgroup) -> None:
    top = run.child("tree")
    middle, empty = top.child("middle"), top.child("empty")
    leaf = middle.child("leaf")
    proc = subprocess.Popen(["sleep", "100"], preexec_fn=lambda: leaf.join())
    try:
        wait_until(lambda: leaf.procs() == [proc.pid], 10, "the member in the leaf cgroup", interval=0.01)
        assert run.procs(recursive=True) == [proc.pid]
        assert not top.remove()  # the empty sibling goes; the populated branch stays whole
        assert not empty.path.exists() and leaf.path.exists() and middle.path.exists() and top.path.exists()
    finally:
        proc.kill()
        proc.wait(5)
    wait_until(lambda: not leaf.populated(), 10, "the killed member to leave the cgroup", interval=0.01)
    assert top.remove() and not top.path.exists()


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


# the scenario runs in a fresh interpreter: the peek asks whether *any* child of this process has exited, and the
# test process may still hold another test's unwaited child
SCENARIO = """
import json, os, subprocess, sys, time
import legion.procs.cgroup as cgroup_mod
from legion.procs import Cgroup
from legion.procs.cgroup import reap_members

looks = []
real = cgroup_mod.own_children
cgroup_mod.own_children = lambda **kw: looks.append(1) or real(**kw)
worker = Cgroup(sys.argv[1]).child("w3")
proc = subprocess.Popen(["sleep", "100"], preexec_fn=lambda: worker.join())
proc.kill()
proc.wait()  # reaped by its parent: nothing of ours is left to reap
assert worker.wait_empty(5.0)
first = (reap_members(worker, exclude=set()), list(looks))
# an exited child outside the cgroup: the look happens, and that child's status is left to its owner
other = subprocess.Popen(["true"])
deadline = time.monotonic() + 10
while os.waitid(os.P_PID, other.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
    assert time.monotonic() < deadline, "`true` did not exit"
    time.sleep(0.01)
second = (reap_members(worker, exclude=set()), list(looks))
print(json.dumps({"first": first, "second": second, "other": other.wait(5), "removed": worker.remove()}))
"""


@needs_cgroups
def test_reaping_a_retired_cgroup_looks_at_our_children_only_when_one_has_exited(run: Cgroup) -> None:
    """Each retire's reap listed our children: a scan of every process where the kernel has no
    /proc/PID/task/TID/children, so shutting down many workers was quadratic. It peeks (WNOWAIT) first."""
    out = subprocess.run([sys.executable, "-c", SCENARIO, str(run.path)], capture_output=True, text=True, timeout=25)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["first"] == [{}, []], result  # nothing of ours had exited: no look at our children
    assert result["second"] == [{}, [1]], result  # one had: the look happens, and the child is left to its owner
    assert result["other"] == 0 and result["removed"], result
