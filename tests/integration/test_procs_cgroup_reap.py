"""A retire's reap of its cgroup's re-parented zombies looks at our children only when one has exited (issue 22)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from legion.procs import Cgroup, containment
from legion.procs.cgroup import create_run_cgroup

pytestmark = pytest.mark.timeout(30)
HERE = containment({})
needs_cgroups = pytest.mark.skipif(not HERE.cgroups, reason=f"no cgroup containment here: {HERE.reason}")


@pytest.fixture
def run() -> Iterator[Cgroup]:
    assert HERE.parent is not None
    cg = create_run_cgroup(HERE.parent)
    yield cg
    cg.kill_and_remove(5.0)


# the scenario runs in a fresh interpreter: the peek asks whether *any* child of this process has exited, and the
# test process may still hold another test's unwaited child
SCENARIO = """
import json, os, subprocess, sys, time
import legion.procs.cgroup as cgroup_mod
from legion.procs import Cgroup
from legion.procs.cgroup import reap_members

looks = []
real = cgroup_mod.own_children
cgroup_mod.own_children = lambda: looks.append(1) or real()
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
