"""Malformed traffic thrown at a live ROUTER from raw zmq sockets: the server keeps serving a good
client, and its drop counters account for every bad frame by reason (an oracle predicts each one)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from legion.bus.control import ControlServer, SocketTuning, control_endpoint
from legion.bus.protocol import RESPONSE_TYPES, Message, ProtocolError, decode, encode, registered_types
from tests.support import wait_until

LIMIT = 4096
HARD_LIMIT = 1 << 20
pytestmark = pytest.mark.timeout(120)


class LiveServer:
    """A ControlServer on its own event loop in a background thread."""

    def __init__(self, run_dir: Path) -> None:
        self.handled: list[tuple[str, Message]] = []
        self.loop = asyncio.new_event_loop()
        self.server: ControlServer | None = None
        self._run_dir = run_dir
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _on_message(self, worker: str, msg: Message) -> dict[str, Any] | None:
        self.handled.append((worker, msg))
        return {"ok": True, "echo": msg.body.get("x")}

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = ControlServer(
            control_endpoint(self._run_dir),
            on_message=self._on_message,
            max_frame_bytes=LIMIT,
            tuning=SocketTuning(hard_max_bytes=HARD_LIMIT, send_timeout_ms=100),
            context=zmq.asyncio.Context(),
        )
        self.loop.run_until_complete(self.server.start())
        self._ready.set()
        self.loop.run_forever()

    def start(self) -> LiveServer:
        self._thread.start()
        assert self._ready.wait(20)
        return self

    def stop(self) -> None:
        assert self.server is not None
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(20)

    @property
    def drops(self) -> Counter[str]:
        assert self.server is not None
        return Counter(self.server.drops.snapshot())


def dealer(ctx: zmq.Context[Any], endpoint: str, identity: bytes | None) -> zmq.Socket[Any]:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, 5000)
    s.setsockopt(zmq.SNDTIMEO, 5000)
    if identity is not None:
        s.setsockopt(zmq.IDENTITY, identity)
    s.connect(endpoint)
    return s


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, zmq.Context[Any]]]:
    srv = LiveServer(tmp_path_factory.mktemp("fuzz")).start()
    ctx: zmq.Context[Any] = zmq.Context()
    yield srv, ctx
    srv.stop()
    ctx.destroy(linger=0)


@pytest.fixture(scope="module")
def peers(live: tuple[LiveServer, zmq.Context[Any]]) -> Iterator[tuple[zmq.Socket[Any], zmq.Socket[Any]]]:
    """One fuzzing and one well-behaved DEALER for every example: a new connection under an identity that is
    still connected is ignored by the ROUTER (no handover), so an identity must not reconnect per example."""
    srv, ctx = live
    assert srv.server is not None
    fuzzer = dealer(ctx, srv.server.endpoint, b"fuzzer")
    good = dealer(ctx, srv.server.endpoint, b"good")
    yield fuzzer, good
    fuzzer.close()
    good.close()


def good_round_trip(sock: zmq.Socket[Any], n: int) -> None:
    """The good client still gets answers (a full request/reply through the same ROUTER)."""
    sender = sock.getsockopt(zmq.IDENTITY).decode()
    sock.send(encode(Message("request", sender, {"op": "echo", "x": n}, corr=f"g{n}")))
    while True:
        reply = decode(sock.recv())
        if reply.corr == f"g{n}":
            assert reply.type == "reply" and reply.body == {"ok": True, "echo": n}
            return




def oracle(frames: list[bytes], sender: str) -> str | None:
    """The drop reason the server must count for this DEALER message, or None if it is handled."""
    if len(frames) != 1:
        return "multipart"
    try:
        msg = decode(frames[0], max_bytes=LIMIT)
    except ProtocolError as exc:
        return exc.reason
    if msg.sender != sender:
        return "sender_mismatch"
    if msg.type in RESPONSE_TYPES:
        return "late_reply"
    return None


json_leaf = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=12)
json_value = st.recursive(
    json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=8
)
envelope = st.fixed_dictionaries(
    {},
    optional={
        "v": st.sampled_from([1, 1, 1, 2, 0, "1", None, True, 1.0]),
        "t": st.sampled_from(sorted(registered_types())) | st.text(max_size=8) | json_leaf,
        "s": st.sampled_from(["fuzzer", "fuzzer", "someone", ""]) | json_leaf,
        "c": st.none() | st.text(max_size=6) | st.integers(-(2**40), 2**40),
        "b": st.dictionaries(st.sampled_from(["name", "op", "level", "msg", "reason", "x"]), json_value, max_size=4)
        | json_value,
    },
).map(orjson.dumps)
frame = st.one_of(
    st.binary(max_size=64),
    envelope,
    st.integers(LIMIT + 1, LIMIT * 3).map(lambda n: b'{"v":1,"t":"event","s":"fuzzer","c":null,"b":{"x":"' + b"a" * n + b'"}}'),
    json_value.map(orjson.dumps),
)
message = st.lists(frame, min_size=1, max_size=3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(message, min_size=1, max_size=12))
def test_fuzzed_frames_are_all_accounted_for(live: tuple[LiveServer, zmq.Context[Any]],
                                             peers: tuple[zmq.Socket[Any], zmq.Socket[Any]],
                                             batch: list[list[bytes]]) -> None:
    srv, _ = live
    fuzzer, good = peers
    before_drops, before_handled = srv.drops, len(srv.handled)
    expected: Counter[str] = Counter()
    handled = 0
    for frames in batch:
        fuzzer.send_multipart(frames)
        reason = oracle(frames, "fuzzer")
        if reason is None:
            handled += 1
        else:
            expected[reason] += 1
    wait_until(
        lambda: sum((srv.drops - before_drops).values()) >= sum(expected.values())
        and len(srv.handled) - before_handled >= handled,
        message="every fuzzed frame accounted for", deadline=20.0,
    )
    good_round_trip(good, len(srv.handled))
    assert srv.drops - before_drops == expected


def test_framing_abuse_and_huge_frames_do_not_stop_the_server(live: tuple[LiveServer, zmq.Context[Any]]) -> None:
    srv, ctx = live
    assert srv.server is not None
    endpoint = srv.server.endpoint
    before = srv.drops
    good = dealer(ctx, endpoint, b"good2")
    # A REQ socket adds an empty delimiter frame: the ROUTER sees three frames.
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.setsockopt(zmq.IDENTITY, b"req-client")
    req.connect(endpoint)
    req.send(encode(Message("heartbeat", "req-client", {})))
    # An identity that is not UTF-8, and an anonymous peer (libzmq picks a binary identity).
    binary = dealer(ctx, endpoint, b"\xff\xfe\x01")
    binary.send(encode(Message("heartbeat", "x", {})))
    anon = dealer(ctx, endpoint, None)
    anon.send(encode(Message("heartbeat", "anon", {})))
    # Oversized (counted) and beyond libzmq's hard cap (peer disconnected before we ever see it).
    fat = dealer(ctx, endpoint, b"fat")
    fat.send(b"x" * (LIMIT + 1))
    fat.send(b"y" * (HARD_LIMIT + 10))
    # Garbage multipart from a well-named DEALER.
    multi = dealer(ctx, endpoint, b"multi")
    multi.send_multipart([b"\x00", b"{}", b"\xff" * 100])
    expected = Counter({"multipart": 2, "sender_mismatch": 2, "oversized": 1})
    wait_until(lambda: srv.drops - before == expected, message=f"drops {expected}", deadline=20.0)
    for i in range(3):
        good_round_trip(good, 1000 + i)
    assert "fat" not in srv.server.known_workers and "req-client" not in srv.server.known_workers
    for s in (good, req, binary, anon, fat, multi):
        s.close()
