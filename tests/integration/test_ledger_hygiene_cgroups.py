"""Hygiene with real cgroups: the cgroups of dead runs are killed and removed, live ones kept."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from legion.ledger.hygiene import run_hygiene
from legion.ledger.owner import owner_record
from legion.procs import Cgroup, ProcRef, containment
from legion.procs.cgroup import run_cgroup_name

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def dead_owner() -> dict[str, Any]:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        record = owner_record(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    return record


@pytest.mark.skipif(not containment({}).cgroups, reason="no cgroup containment on this machine")
def test_the_cgroups_of_dead_runs_are_killed_and_removed_live_ones_kept(tmp_path: Path,
                                                                       dead_owner: dict[str, Any]) -> None:  # fmt: skip
    parent_dir = containment({}).parent
    assert parent_dir is not None
    parent = Cgroup(parent_dir).child(f"hygiene-test-{os.getpid()}-{time.monotonic_ns()}")
    me = ProcRef.from_pid(os.getpid())
    ghost = ProcRef(pid=dead_owner["pid"], pgid=0, create_time=dead_owner["create_time"])
    assert me is not None
    dead = parent.child(run_cgroup_name(ghost, 1)).child("w1")  # a leftover worker cgroup, still populated
    live = parent.child(run_cgroup_name(me, 99))
    leftover = subprocess.Popen(["sleep", "1000"])
    try:
        dead.join(leftover.pid)
        report = run_hygiene(None, tmp_path / "runs", cgroup_parent=parent.path)
        assert report.cgroups_removed == [str(dead.path.parent)] and report.errors == []
        assert leftover.wait(5) == -9  # the dead run's process went with its cgroup
        assert not dead.path.parent.exists() and live.path.exists()
    finally:
        leftover.kill()
        leftover.wait()
        parent.kill_and_remove(5.0)
