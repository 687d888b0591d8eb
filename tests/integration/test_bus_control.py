"""Control channel over real sockets: requests both ways, timeouts, errors, liveness, security checks."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from legion.bus.control import (
    ChannelClosed,
    ControlClient,
    ControlServer,
    PeerUnavailable,
    RemoteError,
    RequestTimeout,
    SocketTuning,
    control_endpoint,
)
from legion.bus.protocol import Message, register_type
from legion.bus.security import InsecureEndpointError
from tests.support import poller

pytestmark = pytest.mark.timeout(60)

until = poller(10.0, 0.01)

register_type("test.spin", {"seconds": (int, float)})




class Recorder:
    """Server-side handler that records messages and answers requests by op."""

    def __init__(self) -> None:
        self.got: list[tuple[str, Message]] = []

    async def __call__(self, worker: str, msg: Message) -> dict[str, Any] | None:
        self.got.append((worker, msg))
        if msg.type == "request":
            op = msg.body["op"]
            if op == "echo":
                return {"echo": msg.body.get("x"), "worker": worker}
            if op == "boom":
                raise RuntimeError("handler exploded")
            if op == "slow":
                await asyncio.sleep(msg.body["delay"])
                return {"slow": True}
        return None


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[ControlServer, Recorder]]:
    rec = Recorder()
    srv = ControlServer(control_endpoint(tmp_path), on_message=rec)
    await srv.start()
    yield srv, rec
    await srv.close()


async def connected(srv: ControlServer, ident: str, on_message: Any = None) -> ControlClient:
    cli = ControlClient(srv.endpoint, ident, on_message=on_message)
    await cli.connect()
    await cli.send("ready", {"pid": os.getpid()})
    await until(lambda: srv.last_seen(ident) is not None, message=f"{ident} ready")
    return cli


async def test_requests_both_ways_and_one_way_messages(server: tuple[ControlServer, Recorder]) -> None:
    srv, rec = server

    async def worker_handler(msg: Message) -> dict[str, Any] | None:
        return {"pong": msg.body.get("n")} if msg.type == "request" else None

    cli = await connected(srv, "w1", worker_handler)
    reply = await cli.request("request", {"op": "echo", "x": 42}, timeout=5)
    assert reply.type == "reply" and reply.body == {"echo": 42, "worker": "w1"} and reply.sender == "root"
    back = await srv.request("w1", "request", {"op": "ping", "n": 7}, timeout=5)
    assert back.body == {"pong": 7} and back.sender == "w1"
    for i in range(50):
        await cli.send("event", {"name": "text_delta", "i": i})
    await until(lambda: sum(1 for _, m in rec.got if m.type == "event") == 50, message="50 events")
    assert [m.body["i"] for _, m in rec.got if m.type == "event"] == list(range(50))  # order kept
    assert srv.known_workers == ["w1"]
    await cli.close()


async def test_handler_exception_becomes_error_reply_and_server_keeps_serving(
    server: tuple[ControlServer, Recorder],
) -> None:
    srv, _ = server
    cli = await connected(srv, "w2")
    with pytest.raises(RemoteError) as err:
        await cli.request("request", {"op": "boom"}, timeout=5)
    assert err.value.reason == "handler_error" and "exploded" in err.value.detail
    assert (await cli.request("request", {"op": "echo", "x": 1}, timeout=5)).body["echo"] == 1
    await cli.close()


async def test_timeout_then_late_reply_is_dropped_and_counted(server: tuple[ControlServer, Recorder]) -> None:
    srv, _ = server
    gate = asyncio.Event()

    async def slow_worker(msg: Message) -> dict[str, Any]:
        await gate.wait()
        return {"late": True}

    cli = await connected(srv, "w3", slow_worker)
    with pytest.raises(RequestTimeout):
        await srv.request("w3", "request", {"op": "x"}, timeout=0.2)
    gate.set()
    await until(lambda: srv.drops["late_reply"] == 1, message="late reply counted")
    # The client side times out too, and the root's late answer is dropped there.
    with pytest.raises(RequestTimeout):
        await cli.request("request", {"op": "slow", "delay": 0.5}, timeout=0.1)
    await until(lambda: cli.drops["late_reply"] == 1, message="client late reply counted")
    await cli.close()


async def test_send_to_unknown_worker_raises_peer_unavailable(server: tuple[ControlServer, Recorder]) -> None:
    srv, _ = server
    with pytest.raises(PeerUnavailable, match="not connected"):
        await srv.send("ghost", "shutdown", {})


async def test_spoofed_sender_is_dropped(server: tuple[ControlServer, Recorder]) -> None:
    srv, rec = server
    cli = await connected(srv, "w4")
    raw = b'{"v":1,"t":"event","s":"someone-else","c":null,"b":{"name":"x"}}'
    assert cli._sock is not None
    await cli._sock.send(raw)
    await until(lambda: srv.drops["sender_mismatch"] == 1, message="spoof counted")
    assert all(m.sender == "w4" for _, m in rec.got)
    await cli.close()


async def test_a_second_connection_never_takes_a_live_identity_over(server: tuple[ControlServer, Recorder]) -> None:
    """No ROUTER_HANDOVER (issue 13 item 1): the first connection keeps the route, the root survives both closing."""
    srv, _ = server
    old = await connected(srv, "w5", on_message=lambda m: _const({"gen": 1}))
    new = ControlClient(srv.endpoint, "w5", on_message=lambda m: _const({"gen": 2}))
    await new.connect()
    await new.send("ready", {})
    for _ in range(5):
        assert (await srv.request("w5", "request", {"op": "gen"}, timeout=5)).body == {"gen": 1}
        await asyncio.sleep(0.05)
    await old.close()
    await new.close()
    fresh = await connected(srv, "w5b")  # still serving
    await fresh.close()


async def test_admission_serves_only_admitted_identities_under_their_peer_name(tmp_path: Path) -> None:
    rec = Recorder()
    srv = ControlServer(control_endpoint(tmp_path), on_message=rec, admission=True)
    await srv.start()
    srv.admit("w1", "w1.1.secret")
    good = ControlClient(srv.endpoint, "w1.1.secret", name="w1", on_message=lambda m: _const({"me": 1}))
    bad = ControlClient(srv.endpoint, "w1", on_message=lambda m: _const({"me": "impostor"}))
    try:
        await good.connect()
        await bad.connect()
        assert (await good.request("request", {"op": "echo", "x": 1}, timeout=5)).body == {"echo": 1, "worker": "w1"}
        with pytest.raises(RemoteError) as err:
            await bad.request("request", {"op": "echo", "x": 2}, timeout=5)
        assert err.value.reason == "unknown_peer" and srv.drops["unknown_peer"] == 1
        assert (await srv.request("w1", "request", {"op": "who"}, timeout=5)).body == {"me": 1}
        assert srv.known_workers == ["w1"]  # the refused identity is not tracked (item 10)
        srv.forget("w1")  # a retired incarnation: its identity is refused from now on
        with pytest.raises(RemoteError, match="unknown_peer"):
            await good.request("request", {"op": "echo"}, timeout=5)
        with pytest.raises(PeerUnavailable, match="no admitted identity"):
            await srv.send("w1", "shutdown", {})
        assert srv.known_workers == [] and srv.last_seen("w1") is None
        srv.admit("w1", "w1.2.other")
        with pytest.raises(ValueError, match="already admitted"):
            srv.admit("w2", "w1.2.other")
    finally:
        await good.close()
        await bad.close()
        await srv.close()


async def test_without_admission_the_book_of_peers_is_bounded(tmp_path: Path) -> None:
    srv = ControlServer(control_endpoint(tmp_path), on_message=Recorder(), tuning=SocketTuning(max_open_peers=3))
    await srv.start()
    clients = [await connected(srv, f"p{i}") for i in range(5)]
    assert srv.known_workers == ["p2", "p3", "p4"]
    for cli in clients:
        await cli.close()
    await srv.close()


async def _const(body: dict[str, Any]) -> dict[str, Any]:
    return body


async def test_close_is_idempotent_and_fails_pending_requests(tmp_path: Path) -> None:
    srv = ControlServer(control_endpoint(tmp_path), on_message=Recorder())
    await srv.start()
    never = asyncio.Event()

    async def stuck(msg: Message) -> dict[str, Any]:
        await never.wait()
        return {}

    cli = await connected(srv, "w6", stuck)
    pending = asyncio.ensure_future(srv.request("w6", "request", {"op": "x"}, timeout=30))
    await asyncio.sleep(0.05)
    await srv.close()
    await srv.close()
    with pytest.raises(ChannelClosed):
        await pending
    await cli.close()
    await cli.close()
    with pytest.raises(ChannelClosed):
        await cli.send("heartbeat", {})


async def test_tcp_bind_without_curve_is_refused_with_a_fix() -> None:
    srv = ControlServer("tcp://127.0.0.1:0", on_message=Recorder())
    with pytest.raises(InsecureEndpointError) as err:
        await srv.start()
    text = str(err.value)
    assert "CurveZMQ" in text and "create_certificates" in text


async def test_ipc_in_an_open_directory_is_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    os.chmod(open_dir, 0o755)
    with pytest.raises(InsecureEndpointError, match="0700"):
        await ControlServer(f"ipc://{open_dir}/ctl.sock", on_message=Recorder()).start()


async def test_heartbeat_payload_and_last_seen(server: tuple[ControlServer, Recorder]) -> None:
    srv, rec = server
    calls = iter(range(1000))

    def payload() -> dict[str, Any]:
        n = next(calls)
        if n == 1:
            raise ValueError("payload bug")  # an empty heartbeat still goes out
        return {"n": n, "tools": []}

    cli = await connected(srv, "w7")
    cli.start_heartbeat(interval=0.05, payload=payload)
    await until(lambda: sum(1 for _, m in rec.got if m.type == "heartbeat") >= 4, message="heartbeats")
    beats = [m.body for _, m in rec.got if m.type == "heartbeat"]
    assert beats[0] == {"n": 0, "tools": []} and beats[1] == {} and beats[2]["n"] == 2
    seen = srv.last_seen("w7")
    assert seen is not None and time.monotonic() - seen < 5
    cli.stop_heartbeat()
    assert srv.silent_workers(now=seen + 0.5, interval=0.1, missed=3) == ["w7"]
    assert srv.silent_workers(now=seen + 0.2, interval=0.1, missed=3) == []
    await cli.close()


SPINNER = textwrap.dedent(
    """
    import asyncio, sys, time
    from legion.bus.control import ControlClient, SocketTuning
    from legion.bus.protocol import register_type
    register_type("test.spin", {"seconds": (int, float)})
    TUNING = SocketTuning(heartbeat_ivl_ms=100, heartbeat_timeout_ms=500, heartbeat_ttl_ms=1000)

    async def main(endpoint: str) -> None:
        done = asyncio.Event()
        cli = None

        async def on_message(msg):
            if msg.type == "test.spin":
                await cli.send("event", {"name": "spinning"})
                end = time.monotonic() + msg.body["seconds"]
                while time.monotonic() < end:  # pure Python: holds the GIL, the loop is stuck
                    pass
                await cli.send("event", {"name": "spun"})
            elif msg.type == "shutdown":
                done.set()
            return None

        cli = ControlClient(endpoint, "spinner", on_message=on_message, tuning=TUNING)
        await cli.connect()
        await cli.send("ready", {})
        cli.start_heartbeat(interval=float(sys.argv[2]))
        await done.wait()
        await cli.close()

    asyncio.run(main(sys.argv[1]))
    """
)


@pytest.mark.timeout(90)
async def test_gil_spinning_worker_keeps_zmtp_alive_but_goes_silent(tmp_path: Path) -> None:
    """Why the app heartbeat exists: ZMTP pings are answered by libzmq's I/O thread even while the
    worker's Python thread spins holding the GIL, so only the app heartbeat notices the hang."""
    interval, spin = 0.25, 2.5
    tuning = SocketTuning(heartbeat_ivl_ms=100, heartbeat_timeout_ms=500, heartbeat_ttl_ms=1000)
    events: list[tuple[float, str]] = []

    async def on_message(worker: str, msg: Message) -> None:
        if msg.type == "event":
            events.append((time.monotonic(), msg.body["name"]))

    srv = ControlServer(control_endpoint(tmp_path), on_message=on_message, tuning=tuning)
    await srv.start()
    assert srv.zmq_socket is not None
    mon = srv.zmq_socket.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPTED)
    proc = subprocess.Popen([sys.executable, "-c", SPINNER, srv.endpoint, str(interval)])
    try:
        await until(lambda: srv.last_seen("spinner") is not None, deadline=30, message="spinner ready")
        # Steady state: heartbeats keep it fresh.
        await asyncio.sleep(interval * 4)
        assert srv.silent_workers(interval=interval) == []
        await srv.send("spinner", "test.spin", {"seconds": spin})
        await until(lambda: any(n == "spinning" for _, n in events), deadline=10, message="spin start")
        spin_start = next(t for t, n in events if n == "spinning")
        await until(lambda: srv.silent_workers(interval=interval) == ["spinner"], deadline=spin, message="silence")
        detected_after = time.monotonic() - spin_start
        print(f"app heartbeat silence detected {detected_after:.3f}s after the spin started")
        await until(lambda: any(n == "spun" for _, n in events), deadline=30, message="spin end")
        await until(lambda: srv.silent_workers(interval=interval) == [], deadline=10, message="recovery")
        # ZMTP never dropped the connection although pings timed out at 0.5 s < spin: libzmq answered.
        disconnects = 0
        while await mon.poll(0):
            ev = parse_monitor_message(await mon.recv_multipart())
            disconnects += ev["event"] == zmq.EVENT_DISCONNECTED
        assert disconnects == 0
        assert detected_after <= 3 * interval + 0.75, f"detected only after {detected_after:.2f}s"
        await srv.send("spinner", "shutdown", {})
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        srv.zmq_socket.disable_monitor()
        mon.close(linger=0)
        await srv.close()


async def test_a_worker_that_stops_reading_makes_sends_fail_instead_of_hanging(tmp_path: Path) -> None:
    tuning = SocketTuning(hwm=2, send_timeout_ms=100)
    srv = ControlServer(control_endpoint(tmp_path), on_message=Recorder(), tuning=tuning)
    await srv.start()
    ctx = zmq.asyncio.Context.instance()
    deaf = ctx.socket(zmq.DEALER)
    deaf.setsockopt(zmq.IDENTITY, b"deaf")
    deaf.setsockopt(zmq.RCVHWM, 1)
    deaf.setsockopt(zmq.LINGER, 0)
    deaf.connect(srv.endpoint)
    await deaf.send(b'{"v":1,"t":"ready","s":"deaf","c":null,"b":{}}')
    await until(lambda: srv.last_seen("deaf") is not None, message="deaf ready")
    big = {"blob": "z" * 200_000}
    with pytest.raises(PeerUnavailable, match="did not take a message"):
        for _ in range(1000):  # kernel buffers absorb a few; then the per-peer queue fills
            await srv.send("deaf", "log", {"level": "info", "msg": "x", **big})
    deaf.close()
    await srv.close()


async def test_a_flood_of_one_way_messages_is_bounded(tmp_path: Path) -> None:
    gate = asyncio.Event()
    handled: list[int] = []

    async def slow(worker: str, msg: Message) -> None:
        await gate.wait()
        if msg.type == "event":
            handled.append(msg.body["i"])

    srv = ControlServer(control_endpoint(tmp_path), on_message=slow, tuning=SocketTuning(max_queued_one_way=5))
    await srv.start()
    cli = ControlClient(srv.endpoint, "flood")
    await cli.connect()
    for i in range(20):
        await cli.send("event", {"name": "text_delta", "i": i})
    await until(lambda: srv.drops["overload"] >= 14, message="overload drops")
    gate.set()
    await until(lambda: len(handled) + srv.drops["overload"] == 20, message="all 20 accounted for")
    assert handled == sorted(handled) and handled[0] == 0
    await cli.close()
    await srv.close()


async def test_a_handler_may_close_its_own_client(server: tuple[ControlServer, Recorder]) -> None:
    srv, _ = server
    holder: dict[str, ControlClient] = {}

    async def closing(msg: Message) -> dict[str, Any]:
        await holder["cli"].close()
        return {"closed": True}

    holder["cli"] = cli = await connected(srv, "w8", closing)
    with pytest.raises(RequestTimeout):  # the reply cannot go out: the channel is already closed
        await srv.request("w8", "shutdown", {}, timeout=0.5)
    assert cli.closed


async def test_too_many_requests_in_flight_get_an_overload_error(tmp_path: Path) -> None:
    gate = asyncio.Event()

    async def blocked(worker: str, msg: Message) -> dict[str, Any]:
        await gate.wait()
        return {"done": True}

    srv = ControlServer(control_endpoint(tmp_path), on_message=blocked, tuning=SocketTuning(max_inflight_requests=2))
    await srv.start()
    cli = ControlClient(srv.endpoint, "eager")
    await cli.connect()
    calls = [asyncio.ensure_future(cli.request("request", {"op": "x"}, timeout=10)) for _ in range(2)]
    await until(lambda: srv.last_seen("eager") is not None, message="first requests arrive")
    with pytest.raises(RemoteError) as err:
        await cli.request("request", {"op": "x"}, timeout=10)
    assert err.value.reason == "overload" and srv.drops["overload"] == 1
    gate.set()
    assert [(await c).body for c in calls] == [{"done": True}, {"done": True}]
    assert (await cli.request("request", {"op": "x"}, timeout=10)).body == {"done": True}
    await cli.close()
    await srv.close()


async def test_queued_one_way_messages_and_requests_in_flight_are_bounded_in_bytes(tmp_path: Path) -> None:
    """Issue 13 item 5: the queues are bounded by bytes, not only by count (a few fat frames used to pile up)."""
    gate = asyncio.Event()
    handled: list[int] = []

    async def slow(worker: str, msg: Message) -> dict[str, Any] | None:
        await gate.wait()
        handled.append(msg.body.get("i", -1))
        return {"ok": True} if msg.corr else None

    tuning = SocketTuning(max_queued_bytes=1 << 20, max_inflight_bytes=1 << 20)
    srv = ControlServer(control_endpoint(tmp_path), on_message=slow, tuning=tuning)
    await srv.start()
    cli = ControlClient(srv.endpoint, "fat")
    await cli.connect()
    blob = "z" * 300_000
    try:
        for i in range(10):  # ~3 MB offered to a 1 MiB queue: the first three fit (the one being handled too)
            await cli.send("event", {"name": "blob", "i": i, "data": blob})
        await until(lambda: srv.drops["overload"] >= 6, message="byte-bound drops")
        calls = [asyncio.ensure_future(cli.request("request", {"op": "x", "data": blob}, timeout=10)) for _ in range(5)]
        await until(lambda: srv.drops["overload"] >= 8, message="requests refused beyond the byte bound")
        gate.set()
        results = await asyncio.gather(*calls, return_exceptions=True)
        refused = [r for r in results if isinstance(r, RemoteError) and r.reason == "overload"]
        assert len(refused) == 2 and sum(isinstance(r, Message) for r in results) == 3
        await until(lambda: len(handled) == 3 + 3, message="the queued ones handled")
        assert [i for i in handled if i >= 0] == [0, 1, 2]
        assert srv._queued_bytes == 0 and srv._inflight_bytes == 0
    finally:
        await cli.close()
        await srv.close()
