"""Chaos probe (issue 13 item 5): a worker offers ~1 GB of ~900 KB `event` frames while the one monitor
subscriber is stopped (Ctrl-Z); the root's RSS grows by at most 64 MB and its event loop never stalls for
seconds. Both figures are measured inside the root process and printed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

REPO = Path(__file__).resolve().parents[2]
OFFERED = 1 << 30
FRAME = 900_000
MAX_GROWTH = 64 << 20
MAX_STALL = 1.0

ROOT_SCRIPT = r"""
import asyncio, gc, sys, threading, time
from pathlib import Path
import orjson, psutil
from legion.supervision.root import RootSupervisor
from legion.supervision.rpc_child import RpcNode

run_dir, base, offered, frame = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
me = psutil.Process()

async def main():
    root = RootSupervisor(run_dir, heartbeat_interval=0.5, hang_misses=6)
    await root.start()
    args = {"go_file": str(base / "go"), "done_file": str(base / "done"), "bytes": offered, "frame_bytes": frame}
    child = await root.nodes.launch(RpcNode("flood", "tests.chaos.flood_worker:main", args, start_timeout=30.0))
    print("ready", flush=True)
    while not (base / "sub-ready").exists():
        await asyncio.sleep(0.02)
    gc.collect()
    baseline = peak = me.memory_info().rss
    stall = 0.0
    sampling = True

    def sample():
        nonlocal peak
        while sampling:
            peak = max(peak, me.memory_info().rss)
            time.sleep(0.005)

    async def tick():
        nonlocal stall
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            stall = max(stall, now - last - 0.01)
            last = now

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    ticker = asyncio.ensure_future(tick())
    t0 = time.monotonic()
    (base / "go").touch()
    while not (base / "done").exists():
        await asyncio.sleep(0.05)
    ctl = root.control
    while ctl._ordered.qsize() or getattr(ctl, "_queued_bytes", 0):
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    elapsed = time.monotonic() - t0
    sampling = False
    sampler.join()
    ticker.cancel()
    done = orjson.loads((base / "done").read_bytes())
    print(orjson.dumps({
        "offered_bytes": offered, "frame_bytes": frame, "sent": done["sent"], "send_failed": done["failed"],
        "elapsed_s": round(elapsed, 2), "rss_baseline_mb": round(baseline / 2**20, 1),
        "rss_peak_mb": round(peak / 2**20, 1), "rss_growth_mb": round((peak - baseline) / 2**20, 1),
        "max_loop_stall_s": round(stall, 3), "control_drops": ctl.drops.snapshot(),
        "monitor_published": root.monitor.published, "monitor_truncated": getattr(root.monitor, "truncated", None),
        "worker_alive": child.proc.is_alive(),
    }).decode(), flush=True)
    await root.stop()

asyncio.run(main())
"""

SUBSCRIBER = r"""
import sys, time
from legion.bus.monitor import MonitorStream
stream = MonitorStream(sys.argv[1])
print("attached", flush=True)
time.sleep(1000)
"""


def run_flood(base: Path, offered: int) -> dict[str, Any]:
    """Run the root, attach and stop a subscriber, let the worker flood; the root's measurements."""
    run_dir = base / "run"
    # the flood worker lives in tests/: legion's fork server runs `python -P` (never the cwd's modules), so the
    # repository is put on PYTHONPATH for it explicitly
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    root = subprocess.Popen([sys.executable, "-c", ROOT_SCRIPT, str(run_dir), str(base), str(offered), str(FRAME)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)  # fmt: skip
    sub: subprocess.Popen[bytes] | None = None
    try:
        assert root.stdout is not None
        assert root.stdout.readline().strip() == b"ready", f"the root did not come up (exit {root.poll()})"
        sub = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE,
                               stdin=subprocess.DEVNULL)  # fmt: skip
        assert sub.stdout is not None and sub.stdout.readline().strip() == b"attached"
        os.kill(sub.pid, signal.SIGSTOP)  # Ctrl-Z: it reads nothing from now on, not even in libzmq's thread
        (base / "sub-ready").touch()
        line = root.stdout.readline()
        assert line, f"the root died during the flood (exit {root.wait()})"
        result: dict[str, Any] = orjson.loads(line)
        assert root.wait(timeout=60) == 0
        return result
    finally:
        for proc in (sub, root):
            if proc is not None and proc.poll() is None:
                proc.kill()
                if proc is sub:
                    os.kill(proc.pid, signal.SIGCONT)
                proc.wait()


@pytest.mark.timeout(300)
def test_a_stopped_monitor_and_a_gigabyte_of_events_never_grow_the_root() -> None:
    base = Path(f"/tmp/lmf-{uuid.uuid4().hex[:8]}")  # ipc:// paths are short
    base.mkdir(mode=0o700)
    try:
        result = run_flood(base, OFFERED)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
    print(orjson.dumps(result).decode())
    assert result["worker_alive"], "the flooding worker was killed"
    assert result["rss_growth_mb"] * 2**20 <= MAX_GROWTH, f"root RSS grew {result['rss_growth_mb']} MB"
    assert result["max_loop_stall_s"] < MAX_STALL, f"root loop stalled {result['max_loop_stall_s']} s"
    assert result["monitor_truncated"] and result["monitor_truncated"] >= 1  # oversized payloads were cut
