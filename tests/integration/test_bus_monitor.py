"""Monitor stream over real sockets: late subscribers, induced gaps, stalled subscribers."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from legion.bus.monitor import (
    MonitorClient,
    MonitorError,
    MonitorEvent,
    MonitorItem,
    MonitorPublisher,
    MonitorRefused,
    MonitorStream,
    Snapshot,
    monitor_endpoints,
)
from legion.bus.protocol import ProtocolError
from legion.bus.security import (
    CurveClientConfig,
    CurveServerConfig,
    InsecureEndpointError,
    generate_certificates,
)
from tests.support import poller

pytestmark = pytest.mark.timeout(60)


class Tree:
    """A toy tree state: the publisher's state and a consumer's reconstruction use the same rules."""

    def __init__(self) -> None:
        self.count = 0
        self.last_node = ""

    def apply(self, type_: str, body: dict[str, Any]) -> None:
        self.count += 1
        self.last_node = body["nodeId"]

    def state(self) -> dict[str, Any]:
        return {"count": self.count, "last_node": self.last_node}


class Replica:
    def __init__(self) -> None:
        self.state: dict[str, Any] = {}
        self.items: list[MonitorItem] = []

    def feed(self, item: MonitorItem) -> None:
        self.items.append(item)
        if isinstance(item, Snapshot):
            self.state = dict(item.state)
        else:
            self.state["count"] += 1
            self.state["last_node"] = item.body["nodeId"]


def emit(pub: MonitorPublisher, tree: Tree, i: int, pad: str = "") -> int:
    body = {"nodeId": f"n{i}", "pad": pad}
    tree.apply("node_launched", body)  # state first, then the event (the snapshot invariant)
    return pub.publish("node_launched", body)


until = poller(20.0, 0.005)


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batched"])
async def test_late_subscriber_gets_state_then_live_events_without_gap(tmp_path: Path, batch: bool) -> None:
    tree = Tree()
    # single mode: one frame per event, and the default high-water mark bounds bytes (~256 frames of up to
    # 64 KiB each), less than the bursts of 200 tiny events below; this test is about sequencing
    hwm = None if batch else 20_000
    pub = MonitorPublisher(tmp_path, provider=tree.state, tick_interval=0.05, batch=batch, sndhwm=hwm)
    await pub.start()
    total = 20_000
    for i in range(5_000):
        emit(pub, tree, i)
    await asyncio.sleep(0)

    async def producer() -> None:
        for i in range(5_000, total):
            emit(pub, tree, i)
            if i % 200 == 0:
                await asyncio.sleep(0.001)

    cli = MonitorClient(tmp_path)
    first = await cli.attach()
    task = asyncio.create_task(producer())
    replica = Replica()
    replica.feed(first)
    assert first.seq >= 5_000 and first.state["count"] == first.seq  # state is exactly "as of seq"
    while replica.state["count"] < total:
        item = await cli.next(timeout=10)
        assert item is not None, f"stream stalled at {replica.state}"
        replica.feed(item)
    await task
    seqs = [it.seq for it in replica.items if isinstance(it, MonitorEvent)]
    assert seqs == list(range(first.seq + 1, total + 1))  # no gap, no duplicate
    assert replica.state == tree.state()
    assert cli.gaps == 0 and cli.snapshots == 1
    await cli.close()
    await pub.close()
    await pub.close()


async def test_induced_gap_triggers_a_resnapshot(tmp_path: Path) -> None:
    tree = Tree()
    pub = MonitorPublisher(tmp_path, provider=tree.state, sndhwm=10, tick_interval=0.05)
    await pub.start()
    cli = MonitorClient(tmp_path, rcvhwm=10)
    replica = Replica()
    replica.feed(await cli.attach())
    # The client does not read while 50k fat events flood its tiny queues: most are dropped.
    for i in range(50_000):
        emit(pub, tree, i, pad="x" * 200)
    while replica.state.get("count") != 50_000:
        item = await cli.next(timeout=10)
        assert item is not None
        replica.feed(item)
    assert cli.gaps >= 1 and cli.snapshots >= 2
    assert replica.state == tree.state()
    # Every event delivered after a snapshot continues it without a hole.
    last = None
    for it in replica.items:
        if isinstance(it, Snapshot):
            last = it.seq
        else:
            assert last is not None and it.seq == last + 1
            last = it.seq
    # Once the backlog is drained the stream carries on live after the resync.
    while (extra := await cli.next(timeout=0.3)) is not None:
        replica.feed(extra)
    emit(pub, tree, 50_000)
    item = await cli.next(timeout=10)
    assert isinstance(item, MonitorEvent) and item.seq == 50_001
    await cli.close()
    await pub.close()


async def test_stalled_subscriber_never_blocks_publishing(tmp_path: Path) -> None:
    tree = Tree()
    pub = MonitorPublisher(tmp_path, provider=tree.state, sndhwm=100, tick_interval=0.05)
    await pub.start()
    ctx = zmq.asyncio.Context.instance()
    stalled = ctx.socket(zmq.SUB)
    stalled.setsockopt(zmq.RCVHWM, 1)
    stalled.setsockopt(zmq.LINGER, 0)
    stalled.setsockopt(zmq.SUBSCRIBE, b"")
    stalled.connect(monitor_endpoints(tmp_path)[0])
    await stalled.poll(5000)  # subscription is live (a tick arrived); from now on it never reads
    n = 200_000
    for i in range(n):
        emit(pub, tree, i, pad="y" * 100)  # would hang here if a full queue blocked the publisher
    assert pub.last_seq == n and pub.published == n
    cli = MonitorClient(tmp_path)
    snap = await cli.attach()
    assert snap.seq == n and snap.state["count"] == n
    emit(pub, tree, n)
    item = await cli.next(timeout=10)
    assert isinstance(item, MonitorEvent) and item.seq == n + 1
    stalled.close()
    await cli.close()
    await pub.close()


async def test_blocking_stream_for_the_cli(tmp_path: Path) -> None:
    tree = Tree()
    pub = MonitorPublisher(tmp_path, provider=tree.state, tick_interval=0.05)
    await pub.start()
    for i in range(100):
        emit(pub, tree, i)
    got: list[MonitorItem] = []
    attached = asyncio.Event()
    loop = asyncio.get_running_loop()

    def consume() -> None:
        with MonitorStream(tmp_path, idle_timeout=2.0) as stream:
            loop.call_soon_threadsafe(attached.set)
            for item in stream:
                got.append(item)
                if isinstance(item, MonitorEvent) and item.seq == 300:
                    return

    thread = asyncio.ensure_future(asyncio.to_thread(consume))
    await attached.wait()
    for i in range(100, 300):
        emit(pub, tree, i)
        await asyncio.sleep(0)
    await thread
    assert isinstance(got[0], Snapshot) and got[0].seq >= 100
    assert [it.seq for it in got[1:]] == list(range(got[0].seq + 1, 301))
    await pub.close()


async def test_bad_snapshot_requests_are_counted_and_provider_errors_reported(tmp_path: Path) -> None:
    calls = {"n": 0}

    def flaky() -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("tree unavailable")
        return {"ok": True}

    pub = MonitorPublisher(tmp_path, provider=flaky, tick_interval=0.05)
    await pub.start()
    raw = zmq.asyncio.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(monitor_endpoints(tmp_path)[1])
    for junk in (b"not json", b"[1]", b'{"v": 9, "snap": 1}'):
        await raw.send(junk)
    await raw.send_multipart([b"a", b"b"])
    await until(lambda: pub.drops.total == 4, message="4 bad requests counted")
    assert pub.drops.snapshot() == {"not_json": 1, "bad_request": 2, "multipart": 1}
    with pytest.raises(MonitorError, match="tree unavailable"):
        await MonitorClient(tmp_path, warmup_timeout=0.5).attach()
    cli = MonitorClient(tmp_path, warmup_timeout=0.5)
    assert (await cli.attach()).state == {"ok": True}
    raw.close()
    await cli.close()
    await pub.close()


async def test_no_snapshot_answer_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "mon.sock").touch()
    with pytest.raises(MonitorError, match="no snapshot"):
        await MonitorClient(tmp_path, snapshot_timeout=0.3, warmup_timeout=0.1).attach()
    with pytest.raises(MonitorError, match="does not exist"):
        MonitorClient(tmp_path / "missing")


async def test_tcp_monitor_requires_curve(tmp_path: Path) -> None:
    pub = MonitorPublisher(
        tmp_path, provider=dict, tcp_endpoint="tcp://127.0.0.1:0", tcp_snapshot_endpoint="tcp://127.0.0.1:0"
    )
    with pytest.raises(InsecureEndpointError, match="CurveZMQ"):
        await pub.start()
    await pub.close()


async def test_tcp_monitor_with_curve_serves_allowed_clients_only(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    _, server_secret = generate_certificates(keys, "server")
    ok_public, ok_secret = generate_certificates(keys, "ok")
    _, bad_secret = generate_certificates(keys, "bad")
    tree = Tree()
    pub = MonitorPublisher(
        tmp_path,
        provider=tree.state,
        tcp_endpoint="tcp://127.0.0.1:0",
        tcp_snapshot_endpoint="tcp://127.0.0.1:0",
        curve=CurveServerConfig.from_certificates(server_secret, [ok_public], allowed_ips=("127.0.0.1",)),
        tick_interval=0.05,
    )
    await pub.start()
    assert pub.tcp_endpoint is not None and pub.tcp_snapshot_endpoint is not None
    emit(pub, tree, 0)
    ok = MonitorClient(
        pub.tcp_endpoint,
        snapshot_endpoint=pub.tcp_snapshot_endpoint,
        curve=CurveClientConfig.from_certificates(ok_secret, keys / "server.key"),
    )
    snap = await ok.attach()
    assert snap.seq == 1 and snap.state["count"] == 1
    emit(pub, tree, 1)
    item = await ok.next(timeout=10)
    assert isinstance(item, MonitorEvent) and item.seq == 2
    bad = MonitorClient(
        pub.tcp_endpoint,
        snapshot_endpoint=pub.tcp_snapshot_endpoint,
        curve=CurveClientConfig.from_certificates(bad_secret, keys / "server.key"),
        warmup_timeout=0.3,
        snapshot_timeout=0.5,
    )
    with pytest.raises(MonitorRefused, match="not on the run's allow-list"):  # told at once (bus/handshake.py)
        await bad.attach()
    await ok.close()
    await pub.close()


async def test_unencodable_body_single_raises_batched_becomes_a_healed_gap(tmp_path: Path) -> None:
    tree = Tree()
    single = MonitorPublisher(tmp_path / "a", provider=tree.state, batch=False)
    (tmp_path / "a").mkdir(mode=0o700)
    await single.start()
    with pytest.raises(ProtocolError, match="unencodable"):
        single.publish("node_launched", {"bad": object()})
    assert single.last_seq == 0  # the seq was not consumed
    await single.close()

    pub = MonitorPublisher(tmp_path, provider=tree.state, tick_interval=0.05)
    await pub.start()
    cli = MonitorClient(tmp_path)
    replica = Replica()
    replica.feed(await cli.attach())
    emit(pub, tree, 0)
    tree.apply("node_launched", {"nodeId": "odd"})
    pub.publish("node_launched", {"nodeId": "odd", "bad": object()})  # lost at flush time
    emit(pub, tree, 2)
    while replica.state.get("count") != 3:
        item = await cli.next(timeout=10)
        assert item is not None
        replica.feed(item)
    assert pub.drops["unencodable"] == 1
    assert cli.gaps == 1 and cli.snapshots == 2 and replica.state == tree.state()
    await cli.close()
    await pub.close()


async def test_client_follows_a_restarted_publisher(tmp_path: Path) -> None:
    """A restarted root numbers events from 1 again; the client notices the new epoch and re-snapshots."""
    old_tree = Tree()
    old = MonitorPublisher(tmp_path, provider=old_tree.state, tick_interval=0.05)
    await old.start()
    for i in range(50):
        emit(old, old_tree, i)
    cli = MonitorClient(tmp_path)
    replica = Replica()
    replica.feed(await cli.attach())
    assert replica.state["count"] == 50
    await old.close()
    new_tree = Tree()
    new = MonitorPublisher(tmp_path, provider=new_tree.state, tick_interval=0.05)
    await new.start()
    emit(new, new_tree, 1000)
    while not (isinstance(replica.items[-1], Snapshot) and replica.items[-1].state["last_node"] == "n1000"):
        item = await cli.next(timeout=10)
        assert item is not None, "the client never re-synchronised with the new publisher"
        replica.feed(item)
    assert cli.restarts >= 1 and replica.state == new_tree.state()
    emit(new, new_tree, 1001)
    item = await cli.next(timeout=10)
    assert isinstance(item, MonitorEvent) and item.seq == 2 and item.body["nodeId"] == "n1001"
    await cli.close()
    await new.close()


async def test_blocking_stream_resyncs_after_a_gap(tmp_path: Path) -> None:
    tree = Tree()
    pub = MonitorPublisher(tmp_path, provider=tree.state, sndhwm=10, tick_interval=0.05)
    await pub.start()
    loop = asyncio.get_running_loop()
    attached, flooded = asyncio.Event(), threading.Event()
    result: dict[str, Any] = {}

    def consume() -> None:
        with MonitorStream(tmp_path, rcvhwm=10, idle_timeout=5.0) as stream:
            loop.call_soon_threadsafe(attached.set)
            assert flooded.wait(20)
            state: dict[str, Any] = {}
            for item in stream:
                if isinstance(item, Snapshot):
                    state = dict(item.state)
                else:
                    state["count"] += 1
                if state.get("count") == 30_000:
                    break
            result.update(state=state, gaps=stream.gaps, snapshots=stream.snapshots)

    worker = asyncio.ensure_future(asyncio.to_thread(consume))
    await attached.wait()
    for i in range(30_000):
        emit(pub, tree, i, pad="p" * 200)
    await asyncio.sleep(0)
    flooded.set()
    await worker
    assert result["gaps"] >= 1 and result["snapshots"] >= 2
    assert result["state"]["count"] == 30_000
    await pub.close()


async def test_async_iteration(tmp_path: Path) -> None:
    tree = Tree()
    pub = MonitorPublisher(tmp_path, provider=tree.state, tick_interval=0.05)
    await pub.start()
    cli = MonitorClient(tmp_path)
    await cli.attach()
    for i in range(10):
        emit(pub, tree, i)
    seen = []
    async for item in cli:
        assert isinstance(item, MonitorEvent)
        seen.append(item.seq)
        if item.seq == 10:
            break
    assert seen == list(range(1, 11))
    await cli.close()
    await pub.close()


async def test_an_oversized_event_reaches_subscribers_truncated_and_marked(tmp_path: Path) -> None:
    """Issue 13 item 5: a 900 KB payload is cut to max_event_bytes before it is published, and says so."""
    tree = Tree()
    pub = MonitorPublisher(tmp_path, provider=tree.state, tick_interval=0.05)
    await pub.start()
    cli = MonitorClient(tmp_path)
    await cli.attach()
    pub.publish("worker_event", {"node_id": "w1", "name": "blob", "data": {"text": "x" * 900_000}})
    item = await cli.next(timeout=10)
    assert isinstance(item, MonitorEvent) and item.type == "worker_event"
    assert item.body["node_id"] == "w1" and item.body["name"] == "blob"
    assert item.body["truncated"]["limit"] == pub.max_event_bytes and item.body["truncated"]["bytes"] > 900_000
    assert len(item.body["data"]["text"]) < pub.max_event_bytes and pub.truncated == 1
    await cli.close()
    await pub.close()


async def test_the_publisher_stops_listening_at_max_connections_and_listens_again(tmp_path: Path) -> None:
    """The root's descriptor reserve: a local connection flood on mon.sock is capped, not accepted without bound."""
    import contextlib
    import socket

    pub = MonitorPublisher(tmp_path, provider=dict, tick_interval=0.05, max_connections=20)
    await pub.start()
    path = pub.endpoint.removeprefix("ipc://")
    flood: list[socket.socket] = []
    refused = 0
    try:
        for _ in range(200):
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
            except OSError:
                s.close()
                refused += 1
                await asyncio.sleep(0.005)
                continue
            flood.append(s)
            await asyncio.sleep(0.005)  # let the guard see the accepts (a burst may overshoot by what is in flight)
        assert pub.paused >= 1 and refused > 0
        # the accepted ones were closed with the endpoint: the root holds none of them any more
        for s in flood[:25]:
            s.settimeout(5)
            with contextlib.suppress(OSError):
                while s.recv(4096):
                    pass
        assert pub.connections["pub"] <= 20, pub.connections
        cli = MonitorClient(tmp_path, snapshot_timeout=10)  # listening again after the pause
        snap = await cli.attach()
        assert snap.seq == 0
        await cli.close()
    finally:
        for s in flood:
            s.close()
        await pub.close()
