"""tcp:// needs CurveZMQ with an allow-list: an allowed client talks, others get nothing through."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from legion.bus.control import ControlClient, ControlServer, PeerUnavailable, RequestTimeout
from legion.bus.protocol import Message
from legion.bus.security import (
    CurveClientConfig,
    CurveServerConfig,
    InsecureEndpointError,
    ensure_private_dir,
    generate_certificates,
    ipc_endpoint,
)

pytestmark = pytest.mark.timeout(60)


async def echo(worker: str, msg: Message) -> dict[str, Any]:
    return {"hello": worker}


async def test_curve_allow_list_admits_only_listed_clients(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    _, server_secret = generate_certificates(keys, "server")
    ok_public, ok_secret = generate_certificates(keys, "ok")
    _, bad_secret = generate_certificates(keys, "intruder")
    assert stat.S_IMODE(server_secret.stat().st_mode) == 0o600
    cfg = CurveServerConfig.from_certificates(server_secret, [ok_public], allowed_ips=("127.0.0.1",))
    srv = ControlServer("tcp://127.0.0.1:0", on_message=echo, curve=cfg)
    endpoint = await srv.start()
    assert endpoint.startswith("tcp://127.0.0.1:")
    ok = ControlClient(endpoint, "ok", curve=CurveClientConfig.from_certificates(ok_secret, keys / "server.key"))
    bad = ControlClient(endpoint, "intruder", curve=CurveClientConfig.from_certificates(bad_secret, keys / "server.key"))
    plain_ctx = zmq.asyncio.Context.instance()
    plain = plain_ctx.socket(zmq.DEALER)
    plain.setsockopt(zmq.IDENTITY, b"plain")
    plain.setsockopt(zmq.LINGER, 0)
    plain.setsockopt(zmq.SNDTIMEO, 500)  # a refused handshake can leave no pipe to queue into
    try:
        await ok.connect()
        await bad.connect()
        plain.connect(endpoint)
        reply = await ok.request("request", {"op": "hi"}, timeout=10)
        assert reply.body == {"hello": "ok"}
        with contextlib.suppress(zmq.Again):
            await plain.send(b'{"v":1,"t":"request","s":"plain","c":"1","b":{"op":"hi"}}')
        with pytest.raises((RequestTimeout, PeerUnavailable)):  # refused handshake: the send cannot even queue
            await bad.request("request", {"op": "hi"}, timeout=1.0)
        # Neither got a single frame through: nothing seen, nothing even dropped.
        assert srv.known_workers == ["ok"]
        assert srv.drops.total == 0
        assert await plain.poll(100) == 0
    finally:
        plain.close()
        await ok.close()
        await bad.close()
        await srv.close()


async def test_two_curve_servers_share_one_authenticator_per_context(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    _, server_secret = generate_certificates(keys, "server")
    a_pub, _ = generate_certificates(keys, "a")
    b_pub, b_sec = generate_certificates(keys, "b")
    s1 = ControlServer("tcp://127.0.0.1:0", on_message=echo, curve=CurveServerConfig.from_certificates(server_secret, [a_pub]))
    s2 = ControlServer("tcp://127.0.0.1:0", on_message=echo, curve=CurveServerConfig.from_certificates(server_secret, [b_pub]))
    await s1.start()
    await s2.start()
    await s1.close()  # s2's allow-list and authenticator survive s1 closing
    cli = ControlClient(s2.endpoint, "b", curve=CurveClientConfig.from_certificates(b_sec, keys / "server.key"))
    try:
        await cli.connect()
        assert (await cli.request("request", {"op": "x"}, timeout=10)).body == {"hello": "b"}
    finally:
        await cli.close()
        await s2.close()


def test_curve_config_validation_messages(tmp_path: Path) -> None:
    pub, sec = zmq.curve_keypair()
    with pytest.raises(ValueError, match="at least one allowed client"):
        CurveServerConfig(pub, sec, frozenset())
    with pytest.raises(ValueError, match="40-character"):
        CurveServerConfig(pub, b"short", frozenset({pub}))
    public_only = generate_certificates(tmp_path / "k", "s")[0]
    with pytest.raises(ValueError, match="no secret key"):
        CurveServerConfig.from_certificates(public_only, [public_only])


def test_private_dir_is_created_0700_and_tightened(tmp_path: Path) -> None:
    d = ensure_private_dir(tmp_path / "run" / "x")
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o755)
    ensure_private_dir(loose)
    assert stat.S_IMODE(loose.stat().st_mode) == 0o700


def test_overlong_ipc_path_is_refused_with_a_fix(tmp_path: Path) -> None:
    with pytest.raises(InsecureEndpointError, match="shorter run directory"):
        ipc_endpoint(tmp_path / ("d" * 120), "ctl.sock")


async def test_tcp_client_without_curve_is_refused() -> None:
    with pytest.raises(ValueError, match="curve"):
        await ControlClient("tcp://127.0.0.1:9", "w").connect()


async def test_curve_servers_can_be_restarted_back_to_back(tmp_path: Path) -> None:
    """Each close stops the context's ZAP authenticator; the next start must not trip over its endpoint."""
    keys = tmp_path / "keys"
    _, server_secret = generate_certificates(keys, "server")
    client_public, _ = generate_certificates(keys, "c")
    cfg = CurveServerConfig.from_certificates(server_secret, [client_public])
    for _ in range(20):
        srv = ControlServer("tcp://127.0.0.1:0", on_message=echo, curve=cfg)
        await srv.start()
        await srv.close()


async def test_bound_ipc_socket_files_are_owner_only_whatever_the_umask(tmp_path: Path) -> None:
    from legion.bus.monitor import MonitorPublisher

    run = ensure_private_dir(tmp_path / "run")
    old = os.umask(0)  # libzmq creates the socket file with the process umask
    try:
        srv = ControlServer(f"ipc://{run}/ctl.sock", on_message=_noop)
        await srv.start()
        pub = MonitorPublisher(run, provider=lambda: {})
        await pub.start()
    finally:
        os.umask(old)
    try:
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in run.iterdir() if p.is_socket()}
        assert len(modes) == 3 and set(modes.values()) == {0o600}, modes
    finally:
        await pub.close()
        await srv.close()


async def _noop(worker_id: str, msg: Message) -> None:
    return None
