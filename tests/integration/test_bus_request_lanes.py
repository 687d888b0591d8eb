"""ControlServer's request lanes over real ipc sockets: a per-client in-flight cap, the shared cap, the reserved lane
beyond both, and the cancellation of a client's requests when its connection closes (socket monitor + SRCFD)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from legion.bus.control import ControlClient, ControlServer, RemoteError, SocketTuning
from legion.bus.protocol import Message
from tests.support import poller

pytestmark = pytest.mark.timeout(60)

until = poller(10.0, 0.01)




class Blocking:
    """Handler: "hold" requests block until released (counting cancellations); others answer at once."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0
        self.cancelled = 0

    async def __call__(self, peer: str, msg: Message) -> dict[str, Any] | None:
        if msg.body.get("op") != "hold":
            return {"ok": True, "op": msg.body.get("op")}
        self.started += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return {"ok": True}


def _reserved(msg: Message) -> bool:
    return msg.body.get("op") == "stop"


async def _server(tmp_path: Path, handler: Blocking, **tuning: int) -> ControlServer:
    server = ControlServer(f"ipc://{tmp_path}/lanes.sock", on_message=handler, name="op",
                           tuning=SocketTuning(**tuning), reserved=_reserved, cancel_on_disconnect=True)
    await server.start()
    return server


async def _client(server: ControlServer, name: str) -> ControlClient:
    client = ControlClient(server.endpoint, name)
    await client.connect()
    return client


def _hold(client: ControlClient) -> asyncio.Task[Message]:
    return asyncio.ensure_future(client.request("request", {"op": "hold"}, 30))


async def test_per_client_and_shared_caps_leave_the_reserved_lane_open(tmp_path: Path) -> None:
    handler = Blocking()
    server = await _server(tmp_path, handler, max_inflight_requests=4, max_inflight_per_peer=2)
    a, b, c = [await _client(server, n) for n in ("a", "b", "c")]
    try:
        holds = [_hold(a), _hold(a), _hold(b), _hold(b)]
        await until(lambda: handler.started == 4, message="4 held requests")
        with pytest.raises(RemoteError) as mine:
            await a.request("request", {"op": "hold"}, 10)
        assert mine.value.reason == "overload"
        assert "alive but busy: 2 requests in flight from your client (a), at most 2 per client" in mine.value.detail
        with pytest.raises(RemoteError) as shared:  # c has none in flight, but the shared cap is full
            await c.request("request", {"op": "echo"}, 10)
        assert "4 requests in flight from all clients" in shared.value.detail and "0 of them from your client (c)" \
            in shared.value.detail
        stop = await c.request("request", {"op": "stop"}, 10)  # the reserved lane: beyond both caps
        assert stop.body == {"ok": True, "op": "stop"}
        also = await a.request("request", {"op": "stop"}, 10)  # even for the client at its own cap
        assert also.body["op"] == "stop"
        handler.release.set()
        assert all(r.body == {"ok": True} for r in await asyncio.gather(*holds))
    finally:
        for client in (a, b, c):
            await client.close()
        await server.close()


async def test_a_disconnected_clients_requests_are_cancelled_and_others_are_not(tmp_path: Path) -> None:
    handler = Blocking()
    server = await _server(tmp_path, handler, max_inflight_per_peer=8)
    gone, stays = await _client(server, "gone"), await _client(server, "stays")
    try:
        gone_holds = [_hold(gone) for _ in range(5)]
        stays_holds = [_hold(stays) for _ in range(3)]
        await until(lambda: handler.started == 8, message="8 held requests")
        assert server.inflight("gone") == 5 and server.inflight("stays") == 3
        await gone.close()
        for t in gone_holds:
            with pytest.raises(Exception):  # noqa: B017 - closed under the request: ChannelClosed
                await t
        await until(lambda: handler.cancelled == 5, message="the gone client's 5 requests cancelled in the root")
        assert server.cancelled_on_disconnect == 5 and server.inflight("gone") == 0
        assert server.inflight("stays") == 3
        handler.release.set()
        assert len(await asyncio.gather(*stays_holds)) == 3
        # a new connection (the fd may be reused) is served normally
        again = await _client(server, "again")
        try:
            assert (await again.request("request", {"op": "echo"}, 10)).body["op"] == "echo"
        finally:
            await again.close()
    finally:
        await stays.close()
        await server.close()
