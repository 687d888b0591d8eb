"""The tcp monitor relay over real sockets: the stream and snapshots end to end through it, its budgets and
pre-authentication deadline, and, under a real root, a relay that dies is restarted on the same ports
without touching the run's tree."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from legion.bus.monitor import (
    MonitorClient,
    MonitorEvent,
    MonitorPublisher,
    MonitorRefused,
    Snapshot,
    monitor_endpoints,
)
from legion.bus.relay import MonitorRelay, RelayLimits
from legion.bus.security import CurveClientConfig, CurveServerConfig, generate_certificates
from legion.supervision.relay_child import RELAY_ID
from legion.supervision.root import RootSupervisor
from tests.support import poller

pytestmark = pytest.mark.timeout(90)
until = poller(15.0, 0.02)


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lrl", dir="/tmp"))  # ipc:// paths are short
    os.chmod(path, 0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _keys(base: Path, allowed_ips: tuple[str, ...] = ()) -> tuple[CurveServerConfig, CurveClientConfig,
                                                                   CurveClientConfig]:  # fmt: skip
    keys = base / "keys"
    _, server_secret = generate_certificates(keys, "server")
    ok_public, ok_secret = generate_certificates(keys, "ok")
    _, bad_secret = generate_certificates(keys, "bad")
    return (CurveServerConfig.from_certificates(server_secret, [ok_public], allowed_ips=allowed_ips),
            CurveClientConfig.from_certificates(ok_secret, keys / "server.key"),
            CurveClientConfig.from_certificates(bad_secret, keys / "server.key"))


def _port(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def _raw(src: str, port: int) -> socket.socket:
    s = socket.socket()
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s


def _closed_within(s: socket.socket, timeout: float) -> float | None:
    """Seconds until the peer closed `s` (EOF or reset), None if still open after `timeout`."""
    t0 = time.monotonic()
    while (left := timeout - (time.monotonic() - t0)) > 0:
        s.settimeout(left)
        try:
            if not s.recv(4096):  # the relay's side may speak first (a ZMTP greeting): read on to the close
                return time.monotonic() - t0
        except TimeoutError:
            return None
        except OSError:
            return time.monotonic() - t0
    return None


async def test_the_relay_serves_snapshot_and_events_end_to_end_with_curve(base: Path) -> None:
    state: dict[str, Any] = {"n": 0}
    pub = MonitorPublisher(base, provider=lambda: dict(state), tick_interval=0.05)
    await pub.start()
    server, ok, bad = _keys(base)
    relay = MonitorRelay(monitor_endpoints(base), ("tcp://127.0.0.1:0", "tcp://127.0.0.1:0"), base, server)
    ep, snap_ep = await relay.start()
    try:
        state["n"] = 1
        pub.publish("e", {"n": 1})
        cli = MonitorClient(ep, snapshot_endpoint=snap_ep, curve=ok)
        snap = await cli.attach()
        assert snap.seq == 1 and snap.state == {"n": 1}
        for n in range(2, 52):
            state["n"] = n
            pub.publish("e", {"n": n})
        got = []
        while len(got) < 50:
            item = await cli.next(timeout=10)
            assert isinstance(item, MonitorEvent), item
            got.append(item.seq)
        assert got == list(range(2, 52)) and cli.gaps == 0  # the root's seq, unchanged, gap-free
        intruder = MonitorClient(ep, snapshot_endpoint=snap_ep, curve=bad, warmup_timeout=0.3, snapshot_timeout=0.5)
        with pytest.raises(MonitorRefused, match="not on the run's allow-list"):  # told at once (bus/handshake.py)
            await intruder.attach()
        await cli.close()
    finally:
        await relay.close()
        await pub.close()


async def test_the_relay_refuses_over_budget_and_silent_connections_and_counts_them(base: Path) -> None:
    pub = MonitorPublisher(base, provider=dict, tick_interval=0.05)
    await pub.start()
    server, ok, _ = _keys(base)
    limits = RelayLimits(per_peer=4, total=64, handshake_ivl=0.5, report_every=0.2)
    relay = MonitorRelay(monitor_endpoints(base), ("tcp://127.0.0.1:0", "tcp://127.0.0.1:0"), base, server,
                         limits=limits)  # fmt: skip
    ep, snap_ep = await relay.start()
    try:
        port = _port(ep)
        flood = await asyncio.to_thread(lambda: [_raw("127.0.0.2", port) for _ in range(10)])
        # four are admitted (then dropped for silence), six refused at once
        closes = await asyncio.gather(*(asyncio.to_thread(_closed_within, s, 5.0) for s in flood))
        assert all(c is not None for c in closes), closes
        assert sum(1 for c in closes if c is not None and c < 0.4) >= 6, closes
        assert sum(1 for c in closes if c is not None and c >= 0.4) == 4, closes  # ~handshake_ivl
        await until(lambda: relay.budget.refused["silent"] == 4 and relay.budget.open == 0, message="silent drops")
        assert relay.budget.refused["per_peer"] == 6
        for s in flood:
            s.close()
        # an allowed client from another address is served meanwhile, and a connection that speaks but
        # never completes the CurveZMQ handshake is dropped by ZMQ_HANDSHAKE_IVL
        cli = MonitorClient(ep, snapshot_endpoint=snap_ep, curve=ok)
        assert isinstance(await cli.attach(), Snapshot)
        await cli.close()
        garbage = await asyncio.to_thread(_raw, "127.0.0.3", port)
        garbage.sendall(b"\xff" + b"\x00" * 8 + b"\x7f\x03")  # a ZMTP signature, then nothing
        closed = await asyncio.to_thread(_closed_within, garbage, 5.0)
        assert closed is not None and closed < 3.0, closed
        garbage.close()
    finally:
        await relay.close()
        await pub.close()


async def test_the_relay_enforces_the_ip_allow_list_at_accept(base: Path) -> None:
    pub = MonitorPublisher(base, provider=dict, tick_interval=0.05)
    await pub.start()
    server, ok, _ = _keys(base, allowed_ips=("127.0.0.1",))
    relay = MonitorRelay(monitor_endpoints(base), ("tcp://127.0.0.1:0", "tcp://127.0.0.1:0"), base, server)
    ep, snap_ep = await relay.start()
    try:
        stranger = await asyncio.to_thread(_raw, "127.0.0.4", _port(ep))
        closed = await asyncio.to_thread(_closed_within, stranger, 2.0)
        assert closed is not None and closed < 0.5
        stranger.close()
        assert relay.budget.refused["ip_not_allowed"] == 1
        cli = MonitorClient(ep, snapshot_endpoint=snap_ep, curve=ok)
        assert isinstance(await cli.attach(), Snapshot)
        await cli.close()
    finally:
        await relay.close()
        await pub.close()


async def _until_covered(cli: MonitorClient, seq: int, what: str, *, event: bool = False) -> None:
    deadline = time.monotonic() + 20
    while True:
        item = await cli.next(timeout=max(0.1, deadline - time.monotonic()))
        assert item is not None, f"the client got nothing up to seq {seq} after {what}"
        if isinstance(item, MonitorEvent) and item.seq == seq:
            return
        assert not (event and isinstance(item, Snapshot)), f"a re-snapshot where event {seq} was due ({what})"
        if isinstance(item, Snapshot) and item.seq >= seq:
            return


@pytest.mark.timeout(150)
async def test_a_killed_relay_is_restarted_on_its_ports_outside_the_trees_restart_intensity(base: Path) -> None:
    server, ok, _ = _keys(base)
    root = RootSupervisor(base / "run", heartbeat_interval=0.5, max_restarts=3, restart_period=60.0,
                          monitor_tcp=("tcp://127.0.0.1:0", "tcp://127.0.0.1:0"), curve=server)  # fmt: skip
    await root.start()
    try:
        assert root.relay is not None and root.relay.endpoints is not None
        ep, snap_ep = root.relay.endpoints
        assert _port(ep) != 0 and _port(snap_ep) != 0
        for conn in psutil.Process().net_connections("tcp"):  # the root itself listens on no tcp port
            assert conn.status != psutil.CONN_LISTEN, conn
        cli = MonitorClient(ep, snapshot_endpoint=snap_ep, curve=ok)
        await cli.attach()
        kills = root.max_restarts + 1  # more than the tree would tolerate from one of its children
        for n in range(kills):
            handle = root.registry.handle(RELAY_ID)
            assert handle is not None and handle.pid is not None
            old = handle.pid
            os.kill(old, signal.SIGKILL)
            await until(lambda o=old: (h := root.registry.handle(RELAY_ID)) is not None and h.pid not in (None, o)
                        and h.ready_body is not None, deadline=40, message=f"relay restart {n + 1}")  # fmt: skip
            assert root.relay.endpoints == (ep, snap_ep)
            assert root.monitor is not None
            seq = root.monitor.publish("probe", {"n": n})
            # the restart is a gap for the client: it re-snapshots (a snapshot at or past the probe covers it)
            # or the probe arrives; either way the next event then arrives as an event, in order
            await _until_covered(cli, seq, f"relay restart {n + 1}")
            seq = root.monitor.publish("probe", {"n": n, "after": True})
            await _until_covered(cli, seq, f"relay restart {n + 1}", event=True)
        assert root.supervisor is not None and root.supervisor.state == "running"
        assert root.supervisor.restarts_in_window() == 0
        assert root.relay.incarnations == kills + 1
        await cli.close()
    finally:
        relay_pid = root.registry.handle(RELAY_ID).pid if root.registry.handle(RELAY_ID) else None
        await root.stop()
    assert relay_pid is None or not psutil.pid_exists(relay_pid) or \
        psutil.Process(relay_pid).status() == psutil.STATUS_ZOMBIE


async def test_a_relay_past_its_own_intensity_comes_back_after_the_cooldown(base: Path) -> None:
    from legion.supervision.relay_child import MonitorRelayChild

    server, ok, _ = _keys(base)
    root = RootSupervisor(base / "run", heartbeat_interval=0.5)
    await root.start()
    published: list[dict[str, Any]] = []
    relay = MonitorRelayChild(root, root.run_dir, ("tcp://127.0.0.1:0", "tcp://127.0.0.1:0"), server,
                              publish=lambda type, body: published.append({"type": type, **body}),
                              max_restarts=1, restart_period=60.0, cooldown=0.5)  # fmt: skip
    try:
        ep, snap_ep = await relay.start()
        first = relay.supervisor
        for n in range(2):  # the second restart in the window is one too many for max_restarts=1
            await until(lambda: (h := root.registry.handle(RELAY_ID)) is not None and h.ready_body is not None,
                        deadline=40, message=f"relay {n + 1} up")  # fmt: skip
            handle = root.registry.handle(RELAY_ID)
            assert handle is not None and handle.pid is not None
            os.kill(handle.pid, signal.SIGKILL)
            await until(lambda p=handle.pid: (h := root.registry.handle(RELAY_ID)) is None or h.pid != p,
                        deadline=40, message=f"relay {n + 1} gone")  # fmt: skip
        await until(lambda: any(p["type"] == "monitor_relay" and p.get("state") == "down" for p in published),
                    deadline=40, message="the relay supervisor giving up")  # fmt: skip
        await until(lambda: relay.supervisor is not first and (h := root.registry.handle(RELAY_ID)) is not None
                    and h.ready_body is not None, deadline=40, message="a new relay after the cooldown")  # fmt: skip
        cli = MonitorClient(ep, snapshot_endpoint=snap_ep, curve=ok, snapshot_timeout=10)
        assert isinstance(await cli.attach(), Snapshot)  # on the same ports
        await cli.close()
        assert root.supervisor is not None and root.supervisor.state == "running"
    finally:
        await relay.close()
        await root.stop()
