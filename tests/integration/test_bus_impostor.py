"""Issue 13 item 1: a connection that claims a live worker's identity never aborts the root nor evicts the worker.

Before the fix the ROUTER used ROUTER_HANDOVER with ZMTP heartbeats and identity = node id: a DEALER
connecting as `w1` took the route over, the real worker went silent, was killed as hung, and libzmq
then aborted the root (`Assertion failed: !_io_error`). Now each incarnation has its own unguessable
identity, there is no handover, and frames from any other identity are refused, counted and logged.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from legion.bus.protocol import Message, decode, encode
from legion.supervision.child_spec import RetireTimeouts
from legion.supervision.root import RootSupervisor
from legion.supervision.rpc_child import RpcChild, RpcNode
from legion.workers.fixture_worker import ENTRY, find_marked
from tests.support import poller

pytestmark = pytest.mark.timeout(60)
until = poller(10.0, 0.02)
INTERVAL = 0.3  # application heartbeat; hung after 3 x 0.3 s of silence


@pytest.fixture
def run_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="lbi", dir="/tmp"))  # ipc:// paths are short
    yield base / "run"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def marker() -> str:
    return f"imp-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def root(run_dir: Path, marker: str) -> AsyncIterator[RootSupervisor]:
    sup = RootSupervisor(run_dir, heartbeat_interval=INTERVAL, hang_misses=3, monitor=False)
    await sup.start()
    yield sup
    if not sup._closed.is_set():
        await sup.stop(force=True)
    await until(lambda: not find_marked(marker), 5, "no marked process after the root stopped")


async def launch_w1(root: RootSupervisor, marker: str) -> RpcChild:
    node = RpcNode("w1", ENTRY, {"marker": marker}, shutdown=RetireTimeouts(retire=2.0, signal=0.5, kill=0.5))
    return await root.nodes.launch(node)


def impostor(ctx: zmq.asyncio.Context, endpoint: str, identity: bytes) -> zmq.asyncio.Socket:
    """A DEALER configured like a worker's (ZMTP heartbeats included), claiming `identity`."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.HEARTBEAT_IVL, 100)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 300)
    sock.setsockopt(zmq.HEARTBEAT_TTL, 300)
    sock.connect(endpoint)
    return sock


async def pose(endpoint: str, identity: bytes, active: float, hold: float) -> list[Message]:
    """Send w1's heartbeats and a request as `identity` for `active` s, stay connected `hold` s more, close."""
    ctx = zmq.asyncio.Context()
    sock = impostor(ctx, endpoint, identity)
    answers: list[Message] = []
    try:
        await sock.send(encode(Message("request", "w1", {"op": "who"}, corr="imp-1")))
        end = time.monotonic() + active
        while time.monotonic() < end:
            await sock.send(encode(Message("heartbeat", "w1", {"pid": 1})))
            while await sock.poll(0):
                answers.append(decode(await sock.recv()))
            await asyncio.sleep(0.05)
        await asyncio.sleep(hold)
        while await sock.poll(0):
            answers.append(decode(await sock.recv()))
    finally:
        sock.close(linger=0)
        ctx.term()
    return answers


def kept(root: RootSupervisor, child: RpcChild) -> bool:
    """The root still runs `child` (same incarnation, alive, not judged hung) and hears it."""
    assert root.control is not None and child.proc is not None
    seen = root.control.last_seen("w1")
    return (root.nodes.worker("w1") is child and child.proc.is_alive() and not child.hung
            and seen is not None and time.monotonic() - seen < 3 * INTERVAL)


@pytest.mark.parametrize("which", ["node id", "current incarnation"])
async def test_an_impostor_with_a_live_workers_identity_is_refused(root: RootSupervisor, marker: str,
                                                                   which: str) -> None:
    child = await launch_w1(root, marker)
    assert root.control is not None and root.control_endpoint is not None
    identity = b"w1" if which == "node id" else child.identity.encode()
    answers = await pose(root.control_endpoint, identity, active=4 * INTERVAL, hold=INTERVAL)
    await asyncio.sleep(2 * INTERVAL)  # a stolen route would make w1 silent for longer than the hang limit
    assert kept(root, child), f"the worker was evicted by an impostor using its {which}"
    assert root.supervisor is not None and root.supervisor.state == "running"
    if which == "node id":
        assert root.control.drops["unknown_peer"] >= 4
        assert any(m.type == "error" and m.body["reason"] == "unknown_peer" and m.corr == "imp-1" for m in answers)
    else:  # libzmq never routes a duplicate of a connected identity to us: nothing of it is served
        assert not any(m.type == "reply" for m in answers)
    await root.stop()


async def test_a_previous_incarnations_identity_is_refused_after_a_restart(root: RootSupervisor, marker: str) -> None:
    first = await launch_w1(root, marker)
    old_identity = first.identity.encode()
    assert first.proc is not None
    first.proc.signal(signal.SIGKILL)
    second = await until(lambda: (w := root.nodes.worker("w1")) is not None and w is not first and w.ready_body and w,
                         message="w1 restarted")
    assert second.identity != first.identity and second.identity.startswith("w1.2.")
    assert root.control is not None and root.control_endpoint is not None
    refused = root.control.drops["unknown_peer"]
    answers = await pose(root.control_endpoint, old_identity, active=2 * INTERVAL, hold=0)
    assert root.control.drops["unknown_peer"] > refused
    assert any(m.type == "error" and m.body["reason"] == "unknown_peer" for m in answers)
    await asyncio.sleep(2 * INTERVAL)
    assert kept(root, second)
    await root.stop()


async def test_identities_that_never_were_workers_are_not_remembered(root: RootSupervisor, marker: str) -> None:
    """Issue 13 item 10: the control server forgets (never books) identities that are no worker."""
    child = await launch_w1(root, marker)
    assert root.control is not None and root.control_endpoint is not None
    ctx = zmq.asyncio.Context()
    ghosts = [impostor(ctx, root.control_endpoint, f"ghost-{i}".encode()) for i in range(50)]
    try:
        for i, sock in enumerate(ghosts):
            await sock.send(encode(Message("heartbeat", f"ghost-{i}", {})))
        await until(lambda: root.control is not None and root.control.drops.total + root.unknown_frames >= 50,
                    message="every ghost frame accounted for")
        assert root.control.known_workers == ["w1"], "identities that never were workers are remembered"
        assert root.control.drops["unknown_peer"] == 50 and len(root.control._refusals) <= 256
    finally:
        for sock in ghosts:
            sock.close(linger=0)
        ctx.term()
    await root.nodes.retire("w1")
    assert root.control.known_workers == [] and root.control.last_seen("w1") is None
    assert child.identity.encode() not in root.control._peer_of
    await root.stop()
