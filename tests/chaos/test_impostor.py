"""Chaos probe (issue 13 item 1): 20 impostors claim a live worker's identity; the root lives, the worker stays.

The root runs in its own process (a libzmq abort must fail this probe, not kill pytest) and writes what it
knows of its worker to a status file; each trial connects a DEALER that claims the worker's node id or its
current incarnation identity, speaks as the worker for longer than the hang limit, and disconnects.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import zmq

from legion.bus.protocol import Message, encode
from legion.workers.fixture_worker import find_marked

ROOT_SCRIPT = r"""
import asyncio, os, sys, time
import orjson
from legion.supervision.child_spec import RetireTimeouts
from legion.supervision.root import RootSupervisor
from legion.supervision.rpc_child import RpcNode
from legion.workers.fixture_worker import ENTRY

marker, run_dir, status = sys.argv[1], sys.argv[2], sys.argv[3]

async def main():
    root = RootSupervisor(run_dir, heartbeat_interval=0.2, hang_misses=5, monitor=False)
    await root.start()
    root.install_signal_handlers()
    await root.nodes.launch(RpcNode("w1", ENTRY, {"marker": marker}, shutdown=RetireTimeouts(retire=1.0, signal=0.5, kill=0.5)))
    while not root._closed.is_set():
        w = root.nodes.worker("w1")
        seen = root.control.last_seen("w1") if root.control is not None else None
        doc = {"endpoint": root.control_endpoint, "pid": w.pid if w else None, "identity": getattr(w, "identity", None),
               "attempt": w.attempt if w else None, "hung": w.hung if w else None,
               "silent": None if seen is None else time.monotonic() - seen,
               "refused": root.control.drops["unknown_peer"] if root.control is not None else None}
        with open(status + ".tmp", "wb") as f:
            f.write(orjson.dumps(doc))
        os.replace(status + ".tmp", status)
        await asyncio.sleep(0.05)
    await root.wait_exit()

asyncio.run(main())
"""
TRIALS = 20
HANG_LIMIT = 1.0  # 5 x 0.2 s


def read_status(path: Path) -> dict[str, Any] | None:
    try:
        doc = orjson.loads(path.read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def pose(ctx: zmq.Context[Any], endpoint: str, identity: bytes, seconds: float) -> None:
    """Speak as w1 under `identity` (ZMTP heartbeats on, like a worker) for `seconds`, then disconnect."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, 100)
    sock.setsockopt(zmq.HEARTBEAT_IVL, 100)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 300)
    sock.setsockopt(zmq.HEARTBEAT_TTL, 300)
    sock.connect(endpoint)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            try:
                sock.send(encode(Message("heartbeat", "w1", {"pid": 1})))
                sock.send(encode(Message("request", "w1", {"op": "who"}, corr=f"imp-{time.monotonic()}")))
            except zmq.Again:
                pass
            time.sleep(0.05)
    finally:
        sock.close(linger=0)


@pytest.mark.timeout(120)
def test_twenty_impostors_never_abort_the_root_nor_evict_the_worker(tmp_path: Path) -> None:
    marker = f"chaos-imp-{uuid.uuid4().hex[:12]}"
    run_dir = Path(f"/tmp/lci-{uuid.uuid4().hex[:8]}")  # ipc:// paths are short
    status = tmp_path / "status.json"
    root = subprocess.Popen([sys.executable, "-c", ROOT_SCRIPT, marker, str(run_dir), str(status)],
                            stdin=subprocess.DEVNULL)  # fmt: skip
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        deadline = time.monotonic() + 30
        while (first := read_status(status)) is None or first["pid"] is None:
            assert root.poll() is None, f"the root died before its worker was up (exit {root.returncode})"
            assert time.monotonic() < deadline, "the root's worker never came up"
            time.sleep(0.05)
        for trial in range(TRIALS):
            identity = b"w1" if trial % 2 == 0 or not first["identity"] else first["identity"].encode()
            pose(ctx, first["endpoint"], identity, seconds=HANG_LIMIT + 0.1)
            time.sleep(0.1)
            now = read_status(status) or {}
            assert root.poll() is None, f"trial {trial}: the root died (exit {root.returncode})"
            assert (now.get("pid"), now.get("attempt"), now.get("hung")) == (first["pid"], 1, False), (
                f"trial {trial} ({identity!r}): the worker was evicted: {now}")
            assert now["silent"] is not None and now["silent"] < HANG_LIMIT, f"trial {trial}: w1 went silent: {now}"
        assert (read_status(status) or {}).get("refused", 0) >= TRIALS // 2  # every node-id impostor was refused
        print(f"{TRIALS} impostor trials: root alive, worker {first['pid']} kept")
        os.kill(root.pid, signal.SIGTERM)
        assert root.wait(timeout=30) == 0
    finally:
        ctx.destroy(linger=0)
        if root.poll() is None:
            root.kill()
            root.wait()
        for pid in find_marked(marker):
            os.kill(pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", str(run_dir)], check=False)
