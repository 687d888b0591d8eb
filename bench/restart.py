"""Restart benchmark: an rpc worker crashes (SIGKILL) -> its supervisor restarts it -> the new worker is ready.

Measures the *first* restart in a supervisor's intensity window (the immediate one; later restarts
back off on purpose). Each sample is a fresh one-member team under a real RootSupervisor (fork
server, ROUTER, ledger file, monitor PUB), so the whole path is timed: pidfd exit -> sweep of the
dead worker's leftovers -> OTP restart decision -> ledger facts -> spawn through the fork server ->
`ready` over the control channel.

Prints one JSON object; exits non-zero when the target is missed. Default = acceptance size;
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

from legion.supervision.child_spec import ChildHandle
from legion.supervision.root import RootSupervisor
from legion.supervision.rpc_child import RpcNode
from legion.supervision.supervisor import Supervisor
from legion.workers.fixture_worker import ENTRY

TARGET_P50_MS = 50.0


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
    try:
        for i in range(samples + warmup):
            team_id, worker_id = f"t{i}", f"w{i}"
            node = RpcNode(worker_id, ENTRY, {"mode": "serve"})
            await root.launch_team(team_id, members=[node], restart="temporary")
            worker = root.worker(worker_id)
            assert worker is not None and worker.pid is not None
            restarted[worker_id] = asyncio.get_running_loop().create_future()
            t0 = time.perf_counter()
            os.kill(worker.pid, signal.SIGKILL)
            t1 = await asyncio.wait_for(restarted[worker_id], 10)
            if i >= warmup:
                latencies.append((t1 - t0) * 1000)
            await root.retire(team_id, cause="bench")
    finally:
        await root.stop(force=True)
        shutil.rmtree(base, ignore_errors=True)
    stats = _stats.summary(latencies)
    return {
        "benchmark": "restart",
        "what": "SIGKILL of an rpc worker -> first restart -> new worker ready (ms)",
        "samples": len(latencies),
        "first_restart_ms": stats,
        "target": {"first_restart_p50_ms": TARGET_P50_MS},
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "ok": stats["median"] <= TARGET_P50_MS,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="measured restarts (default 200)")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured restarts first (default 5)")
    parser.add_argument("--quick", action="store_true", help="small smoke run (20 samples)")
    args = parser.parse_args()
    samples = 20 if args.quick else args.samples
    if samples < 1:
        parser.error("--samples must be >= 1")
    result = asyncio.run(measure(samples, args.warmup))
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
