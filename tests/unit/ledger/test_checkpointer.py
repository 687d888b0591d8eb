"""The background checkpoint policy: when each process asks for a PASSIVE checkpoint."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from legion.ledger import open_ledger
from legion.ledger.checkpointer import stagger
from legion.ledger.constants import CHECKPOINT_EVERY_COMMITS

pytestmark = [pytest.mark.timeout(30), pytest.mark.sqlite_only]  # SQLite's own machinery


def _largest_gap(offsets: list[int], period: int) -> int:
    ordered = sorted(offsets)
    gaps = [b - a for a, b in itertools.pairwise(ordered)]
    return max([*gaps, ordered[0] + period - ordered[-1]])


@pytest.mark.parametrize("first_pid", [300, 12340, 32707])
def test_writers_forked_together_spread_their_checkpoints_over_the_period(first_pid: int) -> None:
    # 60 consecutive pids (a bench or a supervisor forking its workers): pid % 100 leaves a gap of
    # 41 commits-per-process in which nobody checkpoints; the spread offsets leave at most a few.
    offsets = [stagger(pid, 100) for pid in range(first_pid, first_pid + 60)]
    assert all(0 <= o < 100 for o in offsets)
    assert _largest_gap(offsets, 100) <= 4
    assert _largest_gap([pid % 100 for pid in range(first_pid, first_pid + 60)], 100) > 30  # what it replaces


def test_stagger_degenerate_periods() -> None:
    assert stagger(1234, 1) == 0 and stagger(1234, 0) == 0
    assert stagger(0, 100) == 0 and stagger(1, 100) == 61


def test_a_new_connection_starts_at_its_spread_offset(tmp_path: Path) -> None:
    led = open_ledger(tmp_path / "legion.db")
    try:
        assert led._db._commits == stagger(os.getpid(), CHECKPOINT_EVERY_COMMITS)
    finally:
        led.close()
