"""Restart benchmark: an rpc worker crashes (SIGKILL) -> its supervisor restarts it -> the new worker is ready.

Measures the *first* restart in a supervisor's intensity window (the immediate one; later restarts
back off on purpose). Each sample is a fresh one-member team under a real RootSupervisor (fork
server, ROUTER, ledger file, monitor PUB), so the whole path is timed: pidfd exit -> sweep of the
dead worker's leftovers -> OTP restart decision -> ledger facts -> spawn through the fork server ->
`ready` over the control channel.

The machine's speed varies ±40 % between runs, so what gates (unless `--strict`, which gates the absolute
50 ms too) is the p50's ratio to a bare crash → restart measured in the same run, sample by sample (`_bare.py`):
a single-threaded helper SIGKILLs its forked child, reaps it and forks a replacement that opens its own ZeroMQ
context and sends `ready` to a raw ROUTER on this loop. The absolute p50 is reported against its target.

Prints one JSON object; exits non-zero when a gated check fails. Default = acceptance size;
`--quick` for a small smoke run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _stats
from _bare import BareForkServer

from legion.supervision.child_spec import ChildHandle
from legion.supervision.root import RootSupervisor
from legion.supervision.rpc_child import RpcNode
from legion.supervision.supervisor import Supervisor
from legion.workers.fixture_worker import ENTRY

TARGET_P50_MS = 50.0
# legion's p50 over the bare crash → restart p50 of the same run; measured 6.2-8.9 on the 2-core machine under the
# acceptance test run's load
MAX_RATIO_TO_BARE = 18.0
ABSOLUTE = ("first_restart_p50",)  # gated only with --strict


async def measure(samples: int, warmup: int) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="lgb", dir="/tmp"))
    root = RootSupervisor(base / "run", heartbeat_interval=1.0)
    await root.start()
    assert root.observer is not None
    restarted: dict[str, asyncio.Future[float]] = {}
    original = root.observer.child_started

    def child_started(sup: Supervisor, child_id: str, handle: ChildHandle, *, restart: bool) -> None:
        original(sup, child_id, handle, restart=restart)
        fut = restarted.get(child_id)
        if restart and fut is not None and not fut.done():
            fut.set_result(time.perf_counter())

    root.observer.child_started = child_started
    latencies: list[float] = []
    bare_ms: list[float] = []
    bare = BareForkServer(base)
    try:
        await bare.start()
        for i in range(samples + warmup):
            team_id, worker_id = f"t{i}", f"w{i}"
            node = RpcNode(worker_id, ENTRY, {"mode": "serve"})
            await root.nodes.launch_team(team_id, members=[node], restart="temporary")
            worker = root.nodes.worker(worker_id)
            assert worker is not None and worker.pid is not None
            restarted[worker_id] = asyncio.get_running_loop().create_future()
            t0 = time.perf_counter()
            os.kill(worker.pid, signal.SIGKILL)
            t1 = await asyncio.wait_for(restarted[worker_id], 10)
            if i >= warmup:
                latencies.append((t1 - t0) * 1000)
            await root.nodes.retire(team_id, cause="bench")
            await bare.spawn_ms([worker_id])  # the same machine, right after: the bare baseline
            ms = await bare.crash_restart_ms(worker_id)
            if i >= warmup:
                bare_ms.append(ms)
            await bare.retire_ms([worker_id])
    finally:
        await bare.close()
        await root.stop(force=True)
        shutil.rmtree(base, ignore_errors=True)
    stats = _stats.summary(latencies)
    bare_stats = _stats.summary(bare_ms)
    ratio = stats["median"] / bare_stats["median"]
    return {
        "benchmark": "restart",
        "what": "SIGKILL of an rpc worker -> first restart -> new worker ready (ms)",
        "samples": len(latencies),
        "first_restart_ms": stats,
        "bare_crash_restart_ms": bare_stats,
        "over_bare_p50": round(ratio, 2),
        "target": {"first_restart_p50_ms": TARGET_P50_MS, "over_bare_p50_max": MAX_RATIO_TO_BARE},
        "checks": {"first_restart_p50": stats["median"] <= TARGET_P50_MS, "over_bare_p50": ratio <= MAX_RATIO_TO_BARE},
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="measured restarts (default 200)")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured restarts first (default 5)")
    parser.add_argument("--quick", action="store_true", help="small smoke run (20 samples)")
    parser.add_argument("--strict", action="store_true", help="gate the absolute 50 ms p50 too")
    args = parser.parse_args()
    samples = 20 if args.quick else args.samples
    if samples < 1:
        parser.error("--samples must be >= 1")
    result = asyncio.run(measure(samples, args.warmup))
    checks = result["checks"]
    result["gated"] = sorted(k for k in checks if args.strict or k not in ABSOLUTE)
    result["ok"] = all(checks[k] for k in result["gated"])
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
