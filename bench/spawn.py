"""Spawn benchmark: WorkerSpawner.spawn() -> `ready` received over the control channel (ROUTER).

Two figures: one worker at a time (target p50 ≤ 30 ms) and a burst of 60 spawned back to back
(target: all 60 ready ≤ 2 s, every repetition). Workers are the fixture worker in `serve` mode,
forked by the preloaded fork server; each is retired gracefully (not timed) after its sample.

The machine's speed varies ±40 % between runs, so what gates (unless `--strict`, which gates the absolute
targets too) is each figure's ratio to a bare baseline measured in the same run, interleaved sample by sample
(`_bare.py`): a single-threaded helper forks a child that opens its own ZeroMQ context and sends `ready` from a
DEALER to a raw ROUTER on this loop — the least a spawn → ready over ZeroMQ costs, without legion's code. The
absolute p50 and burst figures are reported against their targets.

Prints one JSON object; exits non-zero when a gated check fails. Default = acceptance size;
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
from _bare import BareForkServer

from legion.bus.control import ControlServer
from legion.bus.protocol import Message
from legion.procs import RetireTimeouts, retire_worker
from legion.supervision.spawn import DEFAULT_PRELOAD, WorkerProcess, WorkerSpawner, WorkerStart
from legion.workers.fixture_worker import ENTRY

TARGET_P50_MS = 30.0
TARGET_BURST_MS = 2000.0
BURST = 60
# legion over the bare baseline of the same run (p50 / p50; burst: median / median); measured 4.8-8.3 (single) and
# 3.9-8.4 (burst) on the 2-core machine under the acceptance test run's load
MAX_RATIO_SINGLE = 17.0
MAX_RATIO_BURST = 17.0
ABSOLUTE = ("single_p50", "burst_all_ready")  # gated only with --strict


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
    bare = BareForkServer(run_dir)
    single: list[float] = []
    uss_mb = 0.0
    burst_ms: list[float] = []
    bare_single: list[float] = []
    bare_burst: list[float] = []
    try:
        await bare.start()
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
            ms = await bare.spawn_ms([wid])  # the same machine, right after: the bare baseline
            if i >= warmup:
                bare_single.append(ms)
            await bare.retire_ms([wid])
        for b in range(bursts):
            ids = [f"b{b}-{i}" for i in range(BURST)]
            futs = [watch.expect(w) for w in ids]
            t0 = time.perf_counter()
            procs = [spawner.spawn(WorkerStart(w, ENTRY, {})) for w in ids]
            done = await asyncio.wait_for(asyncio.gather(*futs), 30)
            burst_ms.append((max(done) - t0) * 1000)
            await retire_all(procs)
            bare_burst.append(await bare.spawn_ms(ids))
            await bare.retire_ms(ids)
    finally:
        await bare.close()
        spawner.close()
        await server.close()
        shutil.rmtree(run_dir, ignore_errors=True)
    single_s = _stats.summary(single, count=True)
    bare_s = _stats.summary(bare_single, count=True)
    burst_s = _stats.summary(burst_ms, count=True)
    bare_burst_s = _stats.summary(bare_burst, count=True)
    ratio_single = single_s["median"] / bare_s["median"]
    ratio_burst = burst_s["median"] / bare_burst_s["median"]
    checks = {"single_over_bare": ratio_single <= MAX_RATIO_SINGLE, "burst_over_bare": ratio_burst <= MAX_RATIO_BURST,
              "single_p50": single_s["median"] <= TARGET_P50_MS, "burst_all_ready": max(burst_ms) <= TARGET_BURST_MS}
    return {
        "bench": "spawn",
        "spawn_to_ready_ms": single_s,
        "bare_spawn_to_ready_ms": bare_s,
        "single_over_bare_p50": round(ratio_single, 2),
        "target_p50_ms": TARGET_P50_MS,
        "burst": {"workers": BURST, "all_ready_ms": burst_s, "bare_all_ready_ms": bare_burst_s,
                  "over_bare_p50": round(ratio_burst, 2), "target_all_ready_ms": TARGET_BURST_MS},
        "targets": {"single_p50_ms": TARGET_P50_MS, "burst_all_ready_ms": TARGET_BURST_MS,
                    "single_over_bare_max": MAX_RATIO_SINGLE, "burst_over_bare_max": MAX_RATIO_BURST},
        "checks": checks,
        "loadavg_1m_before": None,
        "cpus": os.cpu_count(),
        "ready_worker_uss_mb": round(uss_mb, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100, help="single-spawn samples (default 100)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--bursts", type=int, default=5, help="bursts of 60 (default 5)")
    parser.add_argument("--quick", action="store_true", help="20 samples, 1 burst")
    parser.add_argument("--strict", action="store_true", help="gate the absolute p50 and burst targets too")
    opts = parser.parse_args()
    if opts.quick:
        opts.samples, opts.warmup, opts.bursts = 20, 2, 1
    load = os.getloadavg()[0]
    result = asyncio.run(measure(opts.samples, opts.warmup, opts.bursts))
    result["loadavg_1m_before"] = round(load, 2)
    result["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    checks = result["checks"]
    result["gated"] = sorted(k for k in checks if opts.strict or k not in ABSOLUTE)
    result["ok"] = all(checks[k] for k in result["gated"])
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
