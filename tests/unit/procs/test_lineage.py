"""`own_children` on a kernel without /proc/PID/task/TID/children: a process-table scan, shared by a retire round."""

from __future__ import annotations

import subprocess

import pytest

from legion.procs import lineage
from legion.procs.table import ProcStat


@pytest.fixture
def no_children_file(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Pretend the kernel lacks the children file; count the process-table scans."""
    scans: list[int] = []
    real = lineage.proc_table

    def counted() -> dict[int, ProcStat]:
        scans.append(1)
        return real()

    monkeypatch.setattr(lineage, "_CHILDREN", "/proc/self/task/{}/no-such-file")
    monkeypatch.setattr(lineage, "proc_table", counted)
    monkeypatch.setattr(lineage, "_scan", [])
    return scans


def test_a_round_shares_one_scan_and_a_fresh_look_scans_again(no_children_file: list[int]) -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert child.pid in lineage.own_children(max_age=60.0)
        assert child.pid in lineage.own_children(max_age=60.0)
        assert len(no_children_file) == 1  # the second look reused the round's scan
        assert child.pid in lineage.own_children()  # no max_age: always a scan of its own
        assert len(no_children_file) == 2
    finally:
        child.kill()
        child.wait()
    assert child.pid not in lineage.own_children()


def test_a_stale_round_is_scanned_again(no_children_file: list[int]) -> None:
    lineage.own_children(max_age=60.0)
    lineage._scan[0] = (lineage._scan[0][0] - 120.0, lineage._scan[0][1])  # the round is two minutes old
    lineage.own_children(max_age=60.0)
    assert len(no_children_file) == 2
