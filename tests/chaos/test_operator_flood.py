"""A flood on the operator socket (op.sock) cannot lock the operator out of a live run.

A raw same-user client sends 1,100 `wait` requests and disconnects without reading a reply. It is held to its own
in-flight cap (the rest are refused with a truthful "overload": the root is alive, this client has N requests in
flight), the root cancels its waits once it is gone, and `legion status`, `legion abort` and `legion stop --all` on
that run answer at once.
"""

from __future__ import annotations

import re
import time

import pytest
import zmq

from legion.bus.protocol import Message, decode, encode
from tests.integration.cli_support import legion, live_run, project, start, stop_process
from tests.support import wait_until

pytestmark = pytest.mark.timeout(180)

FLOOD = 1100


def _flood(endpoint: str) -> list[Message]:
    """Send FLOOD waits from one raw DEALER, read the refusals that come back quickly, and disconnect."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"flooder")
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.connect(endpoint)
    try:
        for i in range(FLOOD):
            body = {"op": "legion.operator", "action": "wait", "args": {"names": ["w1"], "timeoutMs": 600_000}}
            sock.send(encode(Message("request", "flooder", body, f"flood-{i}")))
        replies: list[Message] = []
        # both before and after the fix the root refuses at least 100 of them (cap 1000 shared, or per client)
        while len(replies) < 100 or sock.poll(1000):
            if not sock.poll(30_000):
                break
            replies.append(decode(sock.recv()))
        return replies
    finally:
        sock.close(linger=0)
        ctx.term()


def test_a_disconnected_flood_of_waits_is_cancelled_and_stop_abort_status_answer() -> None:
    with project(worker_sleep=120) as cwd:
        proc = start(cwd, "run", "--model", "scripted/root.yaml", "task")
        try:
            run_dir = live_run(cwd)

            replies = _flood(f"ipc://{run_dir / 'op.sock'}")
            refused = [r for r in replies if r.type == "error" and r.body.get("reason") == "overload"]
            assert len(refused) >= 100, replies[:3]
            detail = str(refused[-1].body.get("detail"))
            assert "alive but busy" in detail and "from your client (flooder)" in detail, detail

            log = run_dir / "legion.log"

            def cancelled() -> int:
                text = log.read_text(errors="replace") if log.exists() else ""
                return sum(int(n) for n in re.findall(r"client flooder disconnected; cancelled its (\d+) request", text))

            n = wait_until(cancelled, deadline=30, message="the root cancelling the flooder's waits")
            assert 0 < n <= 32, n  # its own cap held it to 32 waits in flight; all of them were cancelled

            started = time.monotonic()
            status = legion(cwd, "status", run_dir.name, timeout=30)
            assert status.returncode == 0, status.stderr
            assert "w1" in status.stdout
            abort = legion(cwd, "abort", run_dir.name, "w1", timeout=30)
            assert abort.returncode == 0, abort.stderr + abort.stdout
            stop = legion(cwd, "stop", run_dir.name, "--all", timeout=90)
            assert stop.returncode == 0, stop.stderr + stop.stdout
            assert "paused" in stop.stdout
            assert time.monotonic() - started < 90
            proc.wait(60)
        finally:
            stop_process(proc)
