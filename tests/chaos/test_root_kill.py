"""Parent death = child death: SIGKILL the root and every worker and grandchild is gone within 2 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from legion.procs import ProcRef, alive, reap
from legion.workers.fixture_worker import find_marked

ROOT_SCRIPT = r"""
import asyncio, sys
from legion.bus.control import ControlServer
from legion.supervision.spawn import DEFAULT_PRELOAD, WorkerSpawner, WorkerStart
from legion.workers.fixture_worker import ENTRY

marker, run_dir = sys.argv[1], sys.argv[2]
BEHAVIOURS = [
    {"children": 2},
    {"setsid_children": 2},
    {"daemons": 2},
    {"mode": "busy", "ignore_term": True, "children": 1},  # cannot react to lifeline EOF at all
    {"mode": "block", "children": 1, "setsid_children": 1},
]

async def on_message(worker_id, msg):
    return None

async def main():
    server = ControlServer(f"ipc://{run_dir}/ctl.sock", on_message=on_message)
    endpoint = await server.start()
    spawner = WorkerSpawner(endpoint, preload=(*DEFAULT_PRELOAD, "legion.workers.fixture_worker"))
    spawner.start()
    for i, args in enumerate(BEHAVIOURS):
        spawner.spawn(WorkerStart(f"w{i}", ENTRY, {**args, "marker": marker, "ready_file": f"{run_dir}/ready{i}"}))
    print(spawner.zygote_pid, flush=True)
    await asyncio.sleep(1000)

asyncio.run(main())
"""
WORKERS = 5
DESCENDANTS = 2 + 2 + 2 + 1 + 2


def _refs(pids: list[int]) -> list[ProcRef]:
    return [r for r in (ProcRef.from_pid(p) for p in pids) if r is not None]


@pytest.mark.timeout(60)
def test_sigkill_of_the_root_takes_every_worker_and_grandchild_down(tmp_path: Path) -> None:
    marker = f"chaos-{uuid.uuid4().hex}"
    root = subprocess.Popen([sys.executable, "-c", ROOT_SCRIPT, marker, str(tmp_path)],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)  # fmt: skip
    tracked: list[int] = []
    try:
        assert root.stdout is not None
        zygote_pid = int(root.stdout.readline())
        deadline = time.monotonic() + 30
        ready = [tmp_path / f"ready{i}" for i in range(WORKERS)]
        while not (all(r.exists() for r in ready) and len(find_marked(marker)) == DESCENDANTS):
            assert root.poll() is None, "the root script died before the workers were up"
            assert time.monotonic() < deadline, f"workers never came up: {find_marked(marker)}"
            time.sleep(0.02)
        workers = [psutil.Process(root.pid).children()]  # the workers are the root's children
        worker_pids = [p.pid for p in workers[0] if p.pid != zygote_pid]
        assert len(worker_pids) == WORKERS
        tracked = [zygote_pid, *worker_pids, *find_marked(marker)]
        refs = _refs(tracked)
        assert len(refs) == 1 + WORKERS + DESCENDANTS

        os.kill(root.pid, signal.SIGKILL)
        t0 = time.monotonic()
        root.wait()
        while alive(refs) or find_marked(marker):
            assert time.monotonic() - t0 < 2.0, f"still alive 2 s after the root died: {alive(refs)}"
            time.sleep(0.01)
    finally:
        if root.poll() is None:
            root.kill()
            root.wait()
        for pid in find_marked(marker):
            os.kill(pid, signal.SIGKILL)
        reap(tracked)  # in case this test process is a subreaper that inherited them
