"""Spawn benchmark: WorkerSpawner.spawn() -> `ready` received over the control channel (ROUTER).

Two figures: one worker at a time (target p50 ≤ 30 ms) and a burst of 60 spawned back to back
(target: all 60 ready ≤ 2 s, every repetition). Workers are the fixture worker in `serve` mode,
forked by the preloaded fork server; each is retired gracefully (not timed) after its sample.

Prints one JSON object; exits non-zero when a target is missed. Default = acceptance size;
`--quick` for a small smoke run.
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
from pathlib import Path
from typing import Any

import _stats
import psutil

from legion.bus.control import ControlServer
from legion.bus.protocol import Message
from legion.procs import RetireTimeouts, retire_worker
from legion.supervision.spawn import DEFAULT_PRELOAD, WorkerProcess, WorkerSpawner, WorkerStart
from legion.workers.fixture_worker import ENTRY

TARGET_P50_MS = 30.0
TARGET_BURST_MS = 2000.0
BURST = 60


class ReadyWatch:
    """on_message handler: resolves a future per worker id when its `ready` arrives."""

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[float]] = {}

    def expect(self, worker_id: str) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[worker_id] = fut
        return fut

    async def __call__(self, worker_id: str, msg: Message) -> dict[str, Any] | None:
        if msg.type == "ready":
            fut = self.waiting.pop(worker_id, None)
            if fut is not None and not fut.done():
                fut.set_result(time.perf_counter())
        return None


async def retire_all(procs: list[WorkerProcess]) -> None:
    timeouts = RetireTimeouts(retire=5.0, signal=1.0, kill=1.0)
    await asyncio.gather(*(retire_worker(p, timeouts=timeouts) for p in procs))


async def measure(samples: int, warmup: int, bursts: int) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="lgs", dir="/tmp"))
    watch = ReadyWatch()
    server = ControlServer(f"ipc://{run_dir}/ctl.sock", on_message=watch)
    endpoint = await server.start()
    spawner = WorkerSpawner(endpoint, preload=(*DEFAULT_PRELOAD, "legion.workers.fixture_worker"))
    spawner.start()
    single: list[float] = []
    uss_mb = 0.0
    burst_ms: list[float] = []
    try:
        for i in range(warmup + samples):
            wid = f"s{i}"
            fut = watch.expect(wid)
            t0 = time.perf_counter()
            proc = spawner.spawn(WorkerStart(wid, ENTRY, {}))
            t_ready = await asyncio.wait_for(fut, 10)
            if i >= warmup:
                single.append((t_ready - t0) * 1000)
            if i == warmup:
                uss_mb = psutil.Process(proc.pid).memory_full_info().uss / 1e6  # pages not shared with the zygote
            await retire_all([proc])
        for b in range(bursts):
            ids = [f"b{b}-{i}" for i in range(BURST)]
            futs = [watch.expect(w) for w in ids]
            t0 = time.perf_counter()
            procs = [spawner.spawn(WorkerStart(w, ENTRY, {})) for w in ids]
            done = await asyncio.wait_for(asyncio.gather(*futs), 30)
            burst_ms.append((max(done) - t0) * 1000)
            await retire_all(procs)
    finally:
        spawner.close()
        await server.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    single_s = _stats.summary(single, count=True)
    ok_single = single_s["median"] <= TARGET_P50_MS
    ok_burst = max(burst_ms) <= TARGET_BURST_MS
    return {
        "bench": "spawn",
        "spawn_to_ready_ms": single_s,
        "target_p50_ms": TARGET_P50_MS,
        "burst": {"workers": BURST, "all_ready_ms": _stats.summary(burst_ms, count=True), "target_all_ready_ms": TARGET_BURST_MS},
        "loadavg_1m_before": None,
        "cpus": os.cpu_count(),
        "ready_worker_uss_mb": round(uss_mb, 2),
        "ok": ok_single and ok_burst,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100, help="single-spawn samples (default 100)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--bursts", type=int, default=5, help="bursts of 60 (default 5)")
    parser.add_argument("--quick", action="store_true", help="20 samples, 1 burst")
    opts = parser.parse_args()
    if opts.quick:
        opts.samples, opts.warmup, opts.bursts = 20, 2, 1
    load = os.getloadavg()[0]
    result = asyncio.run(measure(opts.samples, opts.warmup, opts.bursts))
    result["loadavg_1m_before"] = round(load, 2)
    result["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
