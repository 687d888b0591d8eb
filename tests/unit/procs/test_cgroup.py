"""cgroup v2 containment: discovery from mountinfo, the decision and its reason, run cgroup names (no
processes: a cgroup's life is in tests/integration/test_procs_cgroup.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from legion.procs import ProcRef, containment
from legion.procs.cgroup import cgroup2_mount, run_cgroup_name, run_owner

pytestmark = pytest.mark.timeout(30)

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


