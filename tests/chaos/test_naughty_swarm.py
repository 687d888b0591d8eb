"""A swarm of naughty workers retired concurrently: every ladder ends, nothing survives, nothing is a zombie."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from legion.procs import RetireTimeouts, retire_worker
from legion.supervision.spawn import DEFAULT_PRELOAD, WorkerSpawner, WorkerStart
from legion.workers.fixture_worker import ENTRY, find_marked

BEHAVIOURS: list[dict[str, Any]] = [
    {},
    {"mode": "busy", "children": 2},
    {"mode": "busy", "ignore_term": True, "setsid_children": 2},
    {"mode": "block", "daemons": 2},
    {"ignore_term": True, "children": 2, "setsid_children": 1, "daemons": 1},
    {"mode": "block", "ignore_term": True, "children": 3},
]


@pytest.mark.timeout(60)
async def test_concurrent_retire_of_a_naughty_swarm(tmp_path: Path) -> None:
    marker = f"swarm-{uuid.uuid4().hex}"
    expected = 0
    spawner = WorkerSpawner(None, preload=(*DEFAULT_PRELOAD, "legion.workers.fixture_worker"))
    spawner.start()
    try:
        procs = []
        for i in range(12):
            args = BEHAVIOURS[i % len(BEHAVIOURS)]
            expected += args.get("children", 0) + args.get("setsid_children", 0) + args.get("daemons", 0)
            procs.append(spawner.spawn(WorkerStart(f"swarm-{i}", ENTRY, {**args, "marker": marker,
                                                                           "ready_file": str(tmp_path / f"r{i}")})))  # fmt: skip
        deadline = time.monotonic() + 30
        while not (all((tmp_path / f"r{i}").exists() for i in range(12)) and len(find_marked(marker)) == expected):
            assert time.monotonic() < deadline, f"swarm never settled: {len(find_marked(marker))}/{expected}"
            await asyncio.sleep(0.02)
        zombies_before = {c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE}
        timeouts = RetireTimeouts(retire=0.5, signal=0.3, kill=1.0)
        t0 = time.monotonic()
        reports = await asyncio.gather(*(retire_worker(p, graceful=i % 2 == 0, timeouts=timeouts)
                                         for i, p in enumerate(procs)))  # fmt: skip
        # concurrent ladders do not queue behind each other: the slowest path is ~0.5 + 0.3 + 0.3 + sweep
        assert time.monotonic() - t0 < 5.0
        assert all(r.survivors == [] for r in reports)
        assert sum(r.descendants for r in reports) == expected
        assert not any(p.is_alive() for p in procs)
        assert find_marked(marker) == []
        zombies = {c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE}
        assert zombies - zombies_before == set()
    finally:
        for pid in find_marked(marker):
            os.kill(pid, signal.SIGKILL)
        spawner.close()
