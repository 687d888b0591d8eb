"""Retire benchmark: the verified ladder (legion.procs.ladder.retire_worker) against real worker trees.

Figures:
- graceful retire of a ready worker (lifeline EOF -> exit observed via pidfd -> sweep check), target p50 ≤ 20 ms;
- forced retire (`stop --force`: SIGTERM, no graceful step) of a worker with 0, 10 and 100 descendants,
  a mix of same-group children, `setsid` escapees and double-forked daemons; target for 100: p50 ≤ 150 ms;
- a leak count over N spawn -> ready -> retire cycles (alternating graceful and forced, each worker with a
  same-group child, a setsid escapee, a double-forked daemon and a shell that answers the sweep's TERM
  by starting one more setsid escapee): processes left with the bench's marker (stopped ones included),
  children of the root other than the fork server (zombies included), and file descriptors of the root;
  target 0 leaked processes.

Prints one JSON object; exits non-zero when a target is missed. Default = acceptance size
(`--cycles 1000`); `--quick` for a small smoke run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _stats
import psutil

from legion.bus.control import ControlServer
from legion.bus.protocol import Message
from legion.procs import RetireTimeouts, retire_worker
from legion.supervision.spawn import DEFAULT_PRELOAD, WorkerProcess, WorkerSpawner, WorkerStart
from legion.workers.fixture_worker import ENTRY, find_marked

TARGET_GRACEFUL_P50_MS = 20.0
TARGET_FORCED_100_P50_MS = 150.0
TARGET_LEAKS = 0
TREES = {0: {}, 10: {"children": 4, "setsid_children": 4, "daemons": 2},
         100: {"children": 40, "setsid_children": 40, "daemons": 20}}  # fmt: skip
# every kind of descendant per leak cycle: same group, setsid escapee, double-forked daemon, and a
# shell that answers the sweep's TERM by starting one more setsid escapee (a stray of the sweep)
LEAK_TREE = {"children": 1, "setsid_children": 1, "daemons": 1, "term_spawners": 1}


class Bench:
    def __init__(self, spawner: WorkerSpawner, marker: str) -> None:
        self.spawner = spawner
        self.marker = marker
        self.waiting: dict[str, asyncio.Future[None]] = {}
        self.seq = 0

    async def on_message(self, worker_id: str, msg: Message) -> dict[str, Any] | None:
        if msg.type == "ready":
            fut = self.waiting.pop(worker_id, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        return None

    async def ready_worker(self, args: dict[str, Any]) -> WorkerProcess:
        self.seq += 1
        wid = f"r{self.seq}"
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting[wid] = fut
        proc = self.spawner.spawn(WorkerStart(wid, ENTRY, {"marker": self.marker, **args}))
        await asyncio.wait_for(fut, 30)
        return proc

    async def retire_ms(self, args: dict[str, Any], *, graceful: bool, expect: int | None = None) -> float:
        proc = await self.ready_worker(args)
        if expect:  # daemons are forked by a shell that exits at once; wait until they all exist
            deadline = time.monotonic() + 10
            while len(find_marked(self.marker)) < expect:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {len(find_marked(self.marker))} of {expect} descendants appeared")
                await asyncio.sleep(0.005)
        t0 = time.perf_counter()
        report = await retire_worker(proc, graceful=graceful, timeouts=RetireTimeouts())
        ms = (time.perf_counter() - t0) * 1000
        if expect is not None and report.descendants != expect:
            raise RuntimeError(f"snapshot saw {report.descendants} descendants, expected {expect}")
        return ms


def _root_state(zygote_pid: int | None) -> tuple[int, int]:
    me = psutil.Process()
    children = [c for c in me.children() if c.pid != zygote_pid]
    return len(children), len(os.listdir("/proc/self/fd"))


async def measure(samples: int, forced_samples: int, cycles: int) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="lgr", dir="/tmp"))
    marker = f"bench-retire-{uuid.uuid4().hex}"
    spawner = WorkerSpawner(None, preload=(*DEFAULT_PRELOAD, "legion.workers.fixture_worker"))
    bench = Bench(spawner, marker)
    server = ControlServer(f"ipc://{run_dir}/ctl.sock", on_message=bench.on_message)
    spawner.control_endpoint = await server.start()
    spawner.start()
    out: dict[str, Any] = {"bench": "retire"}
    try:
        for _ in range(3):  # warm-up
            await bench.retire_ms({}, graceful=True)
        graceful = [await bench.retire_ms({}, graceful=True) for _ in range(samples)]
        out["graceful_ms"] = _stats.summary(graceful, count=True)
        out["graceful_target_p50_ms"] = TARGET_GRACEFUL_P50_MS
        forced: dict[str, Any] = {}
        for n, tree in TREES.items():
            forced[str(n)] = _stats.summary([await bench.retire_ms(tree, graceful=False, expect=n) for _ in range(forced_samples)], count=True)
        out["forced_ms_by_descendants"] = forced
        out["forced_100_target_p50_ms"] = TARGET_FORCED_100_P50_MS
        before = _root_state(spawner.zygote_pid)
        t0 = time.perf_counter()
        for i in range(cycles):
            await bench.retire_ms(LEAK_TREE, graceful=i % 2 == 0)
        elapsed = time.perf_counter() - t0
        await asyncio.sleep(0.2)
        after = _root_state(spawner.zygote_pid)
        leaked_marked = len(find_marked(marker))
        out["leak"] = {
            "cycles": cycles,
            "seconds": round(elapsed, 2),
            "leaked_processes": leaked_marked + max(0, after[0] - before[0]),
            "marked_survivors": leaked_marked,
            "extra_root_children": after[0] - before[0],
            "extra_root_fds": after[1] - before[1],
            "target_leaked_processes": TARGET_LEAKS,
        }
    finally:
        spawner.close()
        await server.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    out["ok"] = (
        out["graceful_ms"]["median"] <= TARGET_GRACEFUL_P50_MS
        and out["forced_ms_by_descendants"]["100"]["median"] <= TARGET_FORCED_100_P50_MS
        and out["leak"]["leaked_processes"] <= TARGET_LEAKS
        and out["leak"]["extra_root_fds"] <= 0
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100, help="graceful retire samples (default 100)")
    parser.add_argument("--forced-samples", type=int, default=20, help="forced samples per tree size (default 20)")
    parser.add_argument("--cycles", type=int, default=None, help="spawn/retire cycles for the leak count (default 1000)")
    parser.add_argument("--quick", action="store_true", help="20 graceful, 5 forced per size, 50 cycles (unless --cycles)")
    opts = parser.parse_args()
    if opts.quick:
        opts.samples, opts.forced_samples = 20, 5
    if opts.cycles is None:
        opts.cycles = 50 if opts.quick else 1000
    load = os.getloadavg()[0]
    result = asyncio.run(measure(opts.samples, opts.forced_samples, opts.cycles))
    result["loadavg_1m_before"] = round(load, 2)
    result["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    result["cpus"] = os.cpu_count()
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
