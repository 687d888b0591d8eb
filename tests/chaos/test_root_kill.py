"""Parent death = child death: SIGKILL the root and every worker and grandchild is gone.

On both containments: with cgroups (each worker in its own cgroup; a worker whose root died ends its
self-sweep with cgroup.kill, the fork server kills the run cgroup after its grace) nothing survives
1 s after the root's death, the escape zoo included. Without (`LEGION_CGROUPS=0`), the classic
behaviours are gone within 2 s; of the zoo, a process started from a TERM handler during the fork server's
sweep may escape (documented hole: it re-parents outside every snapshot; a pure fork carries no
lineage mark either).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from legion.procs import ProcRef, alive, containment, reap
from legion.workers.fixture_worker import find_marked, fork_name

ROOT_SCRIPT = r"""
import asyncio, json, sys
from legion.bus.control import ControlServer
from legion.supervision.spawn import DEFAULT_PRELOAD, WorkerSpawner, WorkerStart
from legion.workers.fixture_worker import ENTRY

marker, run_dir, behaviours = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

async def on_message(worker_id, msg):
    return None

async def main():
    server = ControlServer(f"ipc://{run_dir}/ctl.sock", on_message=on_message)
    endpoint = await server.start()
    spawner = WorkerSpawner(endpoint, preload=(*DEFAULT_PRELOAD, "legion.workers.fixture_worker"))
    spawner.start()
    for i, args in enumerate(behaviours):
        spawner.spawn(WorkerStart(f"w{i}", ENTRY, {**args, "marker": marker, "ready_file": f"{run_dir}/ready{i}"}))
    print(spawner.zygote_pid, spawner.run_cgroup.path if spawner.run_cgroup else "-", flush=True)
    await asyncio.sleep(1000)

asyncio.run(main())
"""
CLASSIC: list[dict[str, Any]] = [
    {"children": 2},
    {"setsid_children": 2},
    {"daemons": 2},
    {"mode": "busy", "ignore_term": True, "children": 1},  # cannot react to lifeline EOF at all
    {"mode": "block", "children": 1, "setsid_children": 1},
]
ZOO: list[dict[str, Any]] = [
    {"setsid_children": 1, "daemons": 1, "fork_children": 1, "term_spawners": 1, "term_forkers": 1},
    {"mode": "busy", "ignore_term": True, "fork_children": 1, "term_forkers": 1},
]
KEYS = ("children", "setsid_children", "daemons", "fork_children", "term_spawners", "term_forkers")
CGROUPS = containment({}).cgroups


def _refs(pids: list[int]) -> list[ProcRef]:
    return [r for r in (ProcRef.from_pid(p) for p in pids) if r is not None]


def _kill_root_with(tmp_path: Path, behaviours: list[dict[str, Any]], env: dict[str, str],
                    limit: float) -> tuple[list[int], float]:  # fmt: skip
    """Start a root with `behaviours`, SIGKILL it once all are up; returns (survivors after `limit` s, seconds)."""
    marker = f"chaos-{uuid.uuid4().hex}"
    expected = sum(int(b.get(k, 0)) for b in behaviours for k in KEYS)
    root = subprocess.Popen([sys.executable, "-c", ROOT_SCRIPT, marker, str(tmp_path), json.dumps(behaviours)],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env={**os.environ, **env})  # fmt: skip
    tracked: list[int] = []
    try:
        assert root.stdout is not None
        zygote_pid = int(root.stdout.readline().split()[0])
        deadline = time.monotonic() + 30
        ready = [tmp_path / f"ready{i}" for i in range(len(behaviours))]
        # at least: a TERM-spawning shell's own `sleep 0.02` children come and go
        while not (all(r.exists() for r in ready) and len(find_marked(marker)) >= expected):
            assert root.poll() is None, "the root script died before the workers were up"
            assert time.monotonic() < deadline, f"workers never came up: {find_marked(marker)}"
            time.sleep(0.02)
        worker_pids = [p.pid for p in psutil.Process(root.pid).children() if p.pid != zygote_pid]
        assert len(worker_pids) == len(behaviours)
        tracked = [zygote_pid, *worker_pids, *find_marked(marker)]
        refs = _refs(tracked)
        assert len(refs) >= 1 + len(behaviours) + expected - 1  # one such sleep may just have ended

        os.kill(root.pid, signal.SIGKILL)
        t0 = time.monotonic()
        root.wait()
        while (alive(refs) or find_marked(marker)) and time.monotonic() - t0 < limit:
            time.sleep(0.01)
        elapsed = time.monotonic() - t0
        return [r.pid for r in alive(refs)] + [p for p in find_marked(marker) if p not in tracked], elapsed
    finally:
        if root.poll() is None:
            root.kill()
            root.wait()
        left = find_marked(marker)
        names = {p: psutil.Process(p).name() for p in left if psutil.pid_exists(p)}
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        reap(tracked)  # in case this test process is a subreaper that inherited them
        _kill_root_with.last_left = (names, fork_name(marker))  # type: ignore[attr-defined]


@pytest.mark.timeout(60)
def test_sigkill_of_the_root_takes_every_worker_and_grandchild_down(tmp_path: Path) -> None:
    survivors, _ = _kill_root_with(tmp_path, CLASSIC, {"LEGION_CGROUPS": "0"}, limit=2.0)
    assert survivors == [], f"still alive 2 s after the root died: {survivors}"


@pytest.mark.timeout(90)
@pytest.mark.skipif(not CGROUPS, reason=f"no cgroup containment here: {containment({}).reason}")
@pytest.mark.parametrize("trial", range(3))
def test_with_cgroups_nothing_of_the_zoo_survives_a_root_sigkill_by_1s(tmp_path: Path, trial: int) -> None:
    survivors, elapsed = _kill_root_with(tmp_path, CLASSIC + ZOO, {}, limit=1.0)
    assert survivors == [], f"still alive {elapsed:.2f} s after the root died: {survivors}"


@pytest.mark.timeout(60)
def test_without_cgroups_only_what_term_handlers_start_escapes_a_root_sigkill(tmp_path: Path) -> None:
    """The documented hole of the pid/pgid path: a process a descendant starts from its TERM handler
    while the fork server sweeps a worker that could not sweep itself (here: one in a busy loop) is
    born after the fork server's snapshot and re-parents outside it. Measured: 1 survivor per trial."""
    survivors, _ = _kill_root_with(tmp_path, ZOO, {"LEGION_CGROUPS": "0"}, limit=2.0)
    names, fork = _kill_root_with.last_left  # type: ignore[attr-defined]
    term_spawning = sum(b.get("term_forkers", 0) + b.get("term_spawners", 0) for b in ZOO)
    assert len(survivors) <= term_spawning, survivors
    assert set(names.values()) <= {fork, "sleep"}, names  # a TERM handler's pure fork or `setsid sleep`
