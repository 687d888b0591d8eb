"""Chaos (issue 19 item 1): a flood of raw tcp connections to the monitor ports cannot touch the run.

`legion run --monitor tcp://127.0.0.1:PORT` starts with a soft descriptor limit of 256 (hard 4096), and its
tcp monitor relay is held at 256 (`LEGION_RELAY_NOFILE`). Five times during the run, 400 raw connections
from 127.0.0.2 and 127.0.0.3 (more than the relay's descriptor limit, far more than its per-peer budget),
never sending a byte and re-opened as soon as they are dropped, flood both ports. While each flood lasts:
an allow-listed CurveZMQ client attaches from 127.0.0.1 and gets the snapshot and then the events of a
child the root launches (`forceRpc`: a real worker process spawn, which connects to the root's ipc
control socket); `legion steer` and `legion status` answer through op.sock. The run ends with exit 0 and
run.json "settled"; the relay was never restarted, and it logged what it refused.

Before the relay existed the root listened on the ports itself: the flood used up its descriptors and the
next ipc accept (the spawn, or the steer) made libzmq abort the root.
"""

from __future__ import annotations

import os
import resource
import select
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from legion.bus.monitor import MonitorEvent, MonitorStream, Snapshot
from legion.bus.security import CurveClientConfig, generate_certificates
from tests.e2e.harness import LEGION, Project, kill_tree, launch, project, tools
from tests.support import wait_until

WAVES = 5
FLOOD = 400  # raw connections held open during each wave (the relay's RLIMIT_NOFILE is 256)
FLOOD_FROM = ("127.0.0.2", "127.0.0.3")
RELAY_NOFILE = 256


def _free_port_pair() -> int:
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = int(a.getsockname()[1])
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise AssertionError("no two adjacent free ports")


class Flood:
    """`n` raw connections from several loopback addresses to both ports, re-opened as they are dropped."""

    def __init__(self, port: int, n: int) -> None:
        self.targets = [(FLOOD_FROM[i % len(FLOOD_FROM)], port + (i // len(FLOOD_FROM)) % 2) for i in range(n)]
        self.socks: list[socket.socket | None] = [None] * n
        self.opened = self.dropped = self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Flood:
        self._fill()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for s in self.socks:
            if s is not None:
                s.close()

    def _open(self, i: int) -> None:
        src, port = self.targets[i]
        s = socket.socket()
        try:
            s.bind((src, 0))
            s.settimeout(1.0)
            s.connect(("127.0.0.1", port))
            s.setblocking(False)
        except OSError:
            s.close()
            self.failed += 1
            return
        self.socks[i] = s
        self.opened += 1

    def _fill(self) -> None:
        for i, s in enumerate(self.socks):
            if s is None:
                self._open(i)

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            live = [s for s in self.socks if s is not None]
            readable, _, _ = select.select(live, [], [], 0) if live else ([], [], [])
            for s in readable:  # readable: the relay closed it (EOF or reset); we never expect data
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    i = self.socks.index(s)
                    s.close()
                    self.socks[i] = None
                    self.dropped += 1
            self._fill()


def _root_script(proj: Project, base: Path) -> str:
    turns: list[Any] = []
    for i in range(1, WAVES + 1):
        gate = base / f"gate{i}"
        turns.append(tools({"name": "bash", "arguments": {"command": f"while [ ! -e {gate} ]; do sleep 0.05; done"}}))
        turns.append(launch({"name": f"w{i}", "agent": "worker", "task": f"wave {i}",
                             "model": proj.script(f"w{i}", default={"text": f"w{i} ok"})}))
    turns.append(tools({"name": "subagent", "arguments": {"action": "wait"}}))
    turns.append({"text": "root done"})
    return proj.script("root", *turns, default={"text": "noted"})


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))  # the root starts as a 1024-default root would


def _watch_wave(stream: MonitorStream, node: str, timeout: float) -> list[str]:
    """Events (type:node) until `node` settled; fails when the stream goes quiet first."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        item = stream.next(timeout=max(0.1, deadline - time.monotonic()))
        if isinstance(item, MonitorEvent):
            seen.append(f"{item.type}:{item.body.get('node_id')}")
            if item.type == "node_settled" and item.body.get("node_id") == node:
                return seen
    raise AssertionError(f"no node_settled for {node} on the tcp monitor within {timeout}s; saw {seen[-30:]}")


@pytest.mark.timeout(300)
def test_a_connection_flood_on_the_tcp_monitor_touches_neither_the_root_nor_the_run() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"needs a hard RLIMIT_NOFILE of at least 4096 (have {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))  # the flood's own sockets
    with project() as proj:
        proj.settings({"supervision": {"forceRpc": True}})
        keys = proj.dir / "keys"
        generate_certificates(keys, "server")
        generate_certificates(keys, "alice")
        (proj.dir / "allow.txt").write_text(f"{keys / 'alice.key'}\n")
        port = _free_port_pair()
        endpoint, snapshot = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"
        curve = CurveClientConfig.from_certificates(keys / "alice.key_secret", keys / "server.key")
        run_id = "flood"
        run = proj.run_path(run_id)
        proc = subprocess.Popen(
            [LEGION, "run", "flood the monitor", "--run-id", run_id, "--model", _root_script(proj, proj.dir),
             "--timeout", "240", "--monitor", endpoint, "--monitor-key", str(keys / "server.key_secret"),
             "--monitor-allow", str(proj.dir / "allow.txt")],
            cwd=proj.dir, env={**os.environ, **proj.env, "LEGION_RELAY_NOFILE": str(RELAY_NOFILE)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
            preexec_fn=_low_nofile,
        )  # fmt: skip
        floods: list[dict[str, int]] = []
        try:
            wait_until(lambda: "monitor" in _run_json(run), 60, "the tcp monitor in run.json")
            assert _run_json(run)["monitor"]["pub"] == endpoint
            for i in range(1, WAVES + 1):
                with Flood(port, FLOOD) as flood:
                    wait_until(lambda f=flood: f.dropped >= 50, 30, f"wave {i}: the relay refusing the flood")
                    assert proc.poll() is None, f"wave {i}: the run died under the flood ({proc.poll()})"
                    with MonitorStream(endpoint, snapshot_endpoint=snapshot, curve=curve,
                                       snapshot_timeout=10) as alice:  # fmt: skip
                        first = alice.next(timeout=1)
                        assert isinstance(first, Snapshot) and "nodes" in first.state, first
                        assert "root" in first.state["nodes"]
                        steer = proj.cli("steer", run_id, "root", f"flood wave {i}: carry on")  # through op.sock
                        assert steer.returncode == 0, f"wave {i}: steer: {steer.stdout}{steer.stderr}"
                        status = proj.cli("status", run_id, "--json")
                        assert status.returncode == 0, f"wave {i}: status: {status.stderr}"
                        (proj.dir / f"gate{i}").touch()  # the root launches w{i}: a worker process spawn
                        seen = _watch_wave(alice, f"w{i}", 60)
                        assert f"agent_launched:w{i}" in seen, seen
                        assert alice.gaps == 0
                    assert proc.poll() is None, f"wave {i}: the run died under the flood ({proc.poll()})"
                    floods.append({"opened": flood.opened, "dropped": flood.dropped, "failed": flood.failed})
            _, stderr = proc.communicate(timeout=120)
        finally:
            kill_tree(proc)
        log = (run / "legion.log").read_text(errors="replace") if (run / "legion.log").exists() else ""
        assert proc.returncode == 0, f"exit {proc.returncode}\n{stderr[-3000:]}\n{log[-3000:]}"
        assert _run_json(run)["status"] == "settled"
        relay_log = (run / "monitor-relay.log").read_text(errors="replace")
        assert relay_log.count("monitor relay up") == 1, relay_log[-3000:]  # never restarted
        assert "refused" in relay_log and "per_peer" in relay_log
        summaries = [line for line in relay_log.splitlines() if "totals" in line]
        print(orjson.dumps({"waves": floods, "relay": summaries[-1] if summaries else None}).decode())


def _run_json(run: Path) -> dict[str, Any]:
    try:
        data = orjson.loads((run / "run.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
