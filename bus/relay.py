"""The tcp monitor relay: the only part of a run that listens on the network (docs/servers.md).

It runs in its own process, supervised by the root (`supervision/relay_child.py`), never in the root:
whatever the network does to it (a connection flood, descriptor exhaustion, a crash) ends at most this
process, which the root restarts. It

- subscribes to the root's ipc monitor PUB and forwards every frame unchanged to its own PUB (seq, epoch
  and ticks are the root's, so `MonitorClient`/`MonitorStream` keep their snapshot + gap-free rule: a
  relay restart is a gap the next tick reveals, and the client re-snapshots);
- forwards snapshot requests from its ROUTER to the root's snapshot ROUTER through a DEALER
  (`[client, request]`, which the root answers as `[client, reply]`), and the replies back;
- serves both on tcp with CurveZMQ (ZAP allow-list of client keys) end to end: its PUB and ROUTER are
  CURVE servers bound on private ipc endpoints in the run directory, and a tcp accept front in front of
  each forwards the bytes of every admitted connection unchanged (the handshake is the remote client's
  and the ZMQ socket's; the front sees only ciphertext).

The front (`TcpFront`) is where the budgets live, because libzmq offers none: it accepts one connection
at a time and at once refuses (closes with a reset) a peer over its per-IP budget, any connection over
the total budget (itself capped so that the descriptors every admitted connection can use — the tcp
socket, the forwarding ipc socket and the ZMQ side of it — plus a reserve stay under RLIMIT_NOFILE), a
peer not on `allowed_ips`, and a connection that sends nothing within `handshake_ivl`. The ZMQ sockets
drop a connection whose CurveZMQ handshake has not completed within `handshake_ivl` (ZMQ_HANDSHAKE_IVL),
which ends its forwarding too. So no accept in this process reaches EMFILE (where libzmq's ipc listener
aborts the process), and pre-authentication connections are short-lived. Refusals are counted by reason
(`refused`) and logged: the first of each reason at once, then a summary every `report_every` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import os
import socket
import struct
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import zmq
import zmq.asyncio
from loguru import logger

from legion.procs import nofile_limit, open_fds

from .monitor import MAX_EVENT_BYTES
from .security import (
    CurveServerConfig,
    acquire_curve_server,
    check_bind_endpoint,
    ipc_endpoint,
    release_curve_server,
    restrict_ipc_socket,
)

PRIVATE_PUB = "rmon.sock"
PRIVATE_SNAP = "rsnap.sock"
_CHUNK = 64 << 10
_FDS_PER_CONNECTION = 3  # the tcp socket, our ipc socket to the ZMQ socket, and the ZMQ socket's side of it
_ACCEPT_BURST = 64  # accepts per readiness callback: refusals never starve the loop
_EMFILE_PAUSE = 0.1


@dataclass(frozen=True)
class RelayLimits:
    """The relay's connection budget (per source IP and in total) and its pre-authentication deadline."""

    per_peer: int = 16
    total: int = 1024
    handshake_ivl: float = 2.5
    fd_reserve: int = 64  # descriptors kept free for everything else in the relay (ZMQ, logging, upstream)
    report_every: float = 10.0

    def __post_init__(self) -> None:
        if self.per_peer < 2:  # one client needs two connections (PUB and snapshot)
            raise ValueError(f"RelayLimits.per_peer must be at least 2, got {self.per_peer}")
        if self.total < self.per_peer or self.handshake_ivl <= 0 or self.fd_reserve < 16:
            raise ValueError(f"RelayLimits needs total >= per_peer, handshake_ivl > 0, fd_reserve >= 16: {self!r}")

    def effective_total(self, nofile: int) -> int:
        """The total budget, capped by what the descriptor limit can hold."""
        return max(0, min(self.total, (nofile - self.fd_reserve) // _FDS_PER_CONNECTION))


def parse_tcp_endpoint(endpoint: str) -> tuple[socket.AddressFamily, str, int]:
    """(family, host, port) of `tcp://HOST:PORT` (`*` is every IPv4 interface, `[::1]` an IPv6 address)."""
    scheme, sep, rest = endpoint.partition("://")
    host, colon, port_text = rest.rpartition(":")
    if scheme != "tcp" or not sep or not colon or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"monitor endpoint {endpoint!r}: expected tcp://HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        return socket.AF_INET6, host[1:-1], int(port_text)
    if host in ("*", ""):
        return socket.AF_INET, "0.0.0.0", int(port_text)
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        try:
            host = socket.gethostbyname(host)
        except OSError as exc:
            raise ValueError(f"monitor endpoint {endpoint!r}: cannot resolve {host!r} ({exc})") from None
        return socket.AF_INET, host, int(port_text)
    return (socket.AF_INET6 if addr.version == 6 else socket.AF_INET), host, int(port_text)


def _peer_ip(addr: Any) -> str:
    ip = str(addr[0]) if isinstance(addr, tuple) and addr else str(addr)
    return ip[7:] if ip.startswith("::ffff:") else ip  # an IPv4 client of a dual-stack socket


def _reset(conn: socket.socket) -> None:
    """Close at once with a reset: no TIME_WAIT, no lingering descriptor."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


class Budget:
    """Connections admitted per source IP and in total, shared by the relay's fronts; refusals by reason."""

    def __init__(self, limits: RelayLimits, allowed_ips: tuple[str, ...] = ()) -> None:
        self.limits = limits
        self.allowed_ips = frozenset(allowed_ips)
        self.nofile = nofile_limit()
        self.total = limits.effective_total(self.nofile)
        self.by_peer: Counter[str] = Counter()
        self.open = 0
        self.admitted = 0
        self.refused: Counter[str] = Counter()
        self.refused_peers: Counter[str] = Counter()
        self._reported: Counter[str] = Counter()
        self._last_report = time.monotonic()

    def admit(self, ip: str) -> str | None:
        """None to admit a connection from `ip` (counted until `release`), else why it is refused."""
        if self.allowed_ips and ip not in self.allowed_ips:
            return self.refuse(ip, "ip_not_allowed")
        if self.by_peer[ip] >= self.limits.per_peer:
            return self.refuse(ip, "per_peer")
        if self.open >= self.total:
            return self.refuse(ip, "total")
        fds = open_fds()
        if fds >= 0 and fds + _FDS_PER_CONNECTION > self.nofile - self.limits.fd_reserve:
            return self.refuse(ip, "descriptors")  # something else holds descriptors: keep the reserve
        self.by_peer[ip] += 1
        self.open += 1
        self.admitted += 1
        return None

    def release(self, ip: str) -> None:
        self.open -= 1
        self.by_peer[ip] -= 1
        if self.by_peer[ip] <= 0:
            del self.by_peer[ip]

    def refuse(self, ip: str, reason: str) -> str:
        """Count (and log) a refusal; the first of each reason is logged at once, the rest in `report()`."""
        first = reason not in self.refused
        self.refused[reason] += 1
        self.refused_peers[ip] += 1
        if first:
            logger.warning("monitor relay: refused a connection from {} ({}); limits: {} per peer, {} in total "
                           "(RLIMIT_NOFILE {}), {:g}s to authenticate", ip, reason, self.limits.per_peer,
                           self.total, self.nofile, self.limits.handshake_ivl)
            self._reported[reason] += 1
        return reason

    def report(self) -> None:
        """Log the refusals since the last report, if any (rate-limited summary)."""
        new = self.refused - self._reported
        self._last_report = time.monotonic()
        if not new:
            return
        top = ", ".join(f"{ip} {n}" for ip, n in self.refused_peers.most_common(5))
        logger.warning("monitor relay: refused {} connections since the last report ({}); totals {}; "
                       "top peers: {}; open {}/{}", sum(new.values()), dict(new), dict(self.refused), top,
                       self.open, self.total)
        self._reported = Counter(self.refused)


class TcpFront:
    """A tcp listener that admits connections within the budget and forwards their bytes to a private ipc path."""

    def __init__(self, endpoint: str, backend_path: str, budget: Budget) -> None:
        self.requested = endpoint
        self.backend_path = backend_path
        self.budget = budget
        self.endpoint: str | None = None
        self._sock: socket.socket | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._paused: asyncio.TimerHandle | None = None

    def start(self) -> str:
        """Bind and listen; returns the bound endpoint (the real port when 0 was asked)."""
        family, host, port = parse_tcp_endpoint(self.requested)
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise OSError(exc.errno, f"cannot listen on {self.requested}: {exc.strerror}") from None
        self._sock = sock
        bound = sock.getsockname()
        self.endpoint = f"tcp://[{bound[0]}]:{bound[1]}" if family == socket.AF_INET6 else f"tcp://{bound[0]}:{bound[1]}"
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._on_readable)
        return self.endpoint

    async def close(self) -> None:
        if self._paused is not None:
            self._paused.cancel()
        if self._sock is not None and self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task

    def _on_readable(self) -> None:
        assert self._sock is not None and self._loop is not None
        for _ in range(_ACCEPT_BURST):
            try:
                conn, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # the budget should make this impossible; if not, wait a little instead of spinning
                    self.budget.refuse("?", "accept_" + errno.errorcode.get(exc.errno or 0, "error").lower())
                    self._loop.remove_reader(self._sock.fileno())
                    self._paused = self._loop.call_later(_EMFILE_PAUSE, self._resume)
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                logger.error("monitor relay: accept on {} failed: {}", self.endpoint, exc)
                return
            ip = _peer_ip(addr)
            if self.budget.admit(ip) is not None:
                _reset(conn)
                continue
            task = self._loop.create_task(self._serve(conn, ip), name=f"relay:{ip}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _resume(self) -> None:
        self._paused = None
        if self._sock is not None and self._loop is not None:
            self._loop.add_reader(self._sock.fileno(), self._on_readable)

    async def _serve(self, conn: socket.socket, ip: str) -> None:
        loop = asyncio.get_running_loop()
        back: socket.socket | None = None
        try:
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                # a raw connection costs one descriptor until it speaks: the ZMQ side only opens then
                first = await asyncio.wait_for(loop.sock_recv(conn, _CHUNK), self.budget.limits.handshake_ivl)
            except TimeoutError:
                self.budget.refuse(ip, "silent")
                return
            if not first:
                return
            back = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            back.setblocking(False)
            await loop.sock_connect(back, self.backend_path)
            await loop.sock_sendall(back, first)
            up = asyncio.ensure_future(self._pump(conn, back))
            down = asyncio.ensure_future(self._pump(back, conn))
            try:
                await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for t in (up, down):
                    t.cancel()
                await asyncio.gather(up, down, return_exceptions=True)
        except OSError as exc:
            logger.debug("monitor relay: connection from {} ended: {}", ip, exc)
        finally:
            if back is not None:
                back.close()
            _reset(conn)
            self.budget.release(ip)

    @staticmethod
    async def _pump(src: socket.socket, dst: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError):
            while data := await loop.sock_recv(src, _CHUNK):
                await loop.sock_sendall(dst, data)


class MonitorRelay:
    """Re-publish a root's ipc monitor (PUB + snapshot) on tcp with CurveZMQ, behind budgeted tcp fronts."""

    def __init__(
        self,
        upstream: tuple[str, str],
        listen: tuple[str, str],
        private_dir: str | os.PathLike[str],
        curve: CurveServerConfig,
        *,
        limits: RelayLimits | None = None,
        queue_bytes: int = 16 << 20,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        self.upstream = upstream
        self.listen = listen
        self.limits = limits or RelayLimits()
        # ZAP sees the ipc side (no peer address): the front enforces the IP allow-list instead
        self.curve = replace(curve, allowed_ips=())
        self.budget = Budget(self.limits, curve.allowed_ips)
        self.private = (ipc_endpoint(private_dir, PRIVATE_PUB), ipc_endpoint(private_dir, PRIVATE_SNAP))
        self.sndhwm = max(8, queue_bytes // (MAX_EVENT_BYTES + (128 << 10) + 1024))
        self.forwarded = 0
        self.endpoints: tuple[str, str] | None = None
        self._ctx = context
        self._sockets: list[zmq.asyncio.Socket] = []
        self._fronts: list[TcpFront] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._curve_users = 0

    async def start(self) -> tuple[str, str]:
        """Connect upstream, bind the private CURVE sockets and the tcp fronts; returns the tcp endpoints."""
        for ep in self.private:
            check_bind_endpoint(ep, None)
        ctx = self._ctx = self._ctx or zmq.asyncio.Context.instance()
        try:
            sub, up_snap = self._socket(zmq.SUB), self._socket(zmq.DEALER)
            pub, snap = self._socket(zmq.PUB), self._socket(zmq.ROUTER)
            sub.setsockopt(zmq.RCVHWM, self.sndhwm)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            up_snap.setsockopt(zmq.SNDHWM, 64)
            pub.setsockopt(zmq.SNDHWM, self.sndhwm)
            snap.setsockopt(zmq.MAXMSGSIZE, 4096)  # requests are tiny
            snap.setsockopt(zmq.SNDHWM, 16)
            for s in (pub, snap):
                s.setsockopt(zmq.HANDSHAKE_IVL, int(self.limits.handshake_ivl * 1000))
                acquire_curve_server(ctx, s, self.curve)
                self._curve_users += 1
            sub.connect(self.upstream[0])
            up_snap.connect(self.upstream[1])
            pub.bind(self.private[0])
            snap.bind(self.private[1])
            for ep in self.private:
                restrict_ipc_socket(ep)
            self._fronts = [TcpFront(self.listen[0], self.private[0].removeprefix("ipc://"), self.budget),
                            TcpFront(self.listen[1], self.private[1].removeprefix("ipc://"), self.budget)]
            bound = (self._fronts[0].start(), self._fronts[1].start())
        except BaseException:
            await self.close()
            raise
        self.endpoints = bound
        self._tasks = [asyncio.create_task(self._forward_events(sub, pub), name="relay-events"),
                       asyncio.create_task(self._forward(snap, up_snap), name="relay-snap-requests"),
                       asyncio.create_task(self._forward(up_snap, snap), name="relay-snap-replies"),
                       asyncio.create_task(self._report(), name="relay-report")]
        return bound

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        assert self._ctx is not None
        s = self._ctx.socket(kind)
        self._sockets.append(s)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        s.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
        s.setsockopt(zmq.HEARTBEAT_TTL, 3000)
        return s

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        for front in self._fronts:
            await front.close()
        for s in self._sockets:
            s.close(linger=0)
        if self._ctx is not None:
            for _ in range(self._curve_users):
                release_curve_server(self._ctx, self.curve)
        self._curve_users = 0
        self._sockets, self._tasks, self._fronts = [], [], []

    async def _forward_events(self, sub: zmq.asyncio.Socket, pub: zmq.asyncio.Socket) -> None:
        """Every root frame, unchanged, in order; a PUB send never waits (a slow client loses at its HWM)."""
        sub_sync: zmq.Socket[bytes] = zmq.Socket.shadow(sub.underlying)
        pub_sync: zmq.Socket[bytes] = zmq.Socket.shadow(pub.underlying)
        while True:
            try:
                frame = sub_sync.recv(zmq.NOBLOCK)
            except zmq.Again:
                await sub.poll()
                continue
            with contextlib.suppress(zmq.Again):
                pub_sync.send(frame, zmq.NOBLOCK)
            self.forwarded += 1

    async def _forward(self, src: zmq.asyncio.Socket, dst: zmq.asyncio.Socket) -> None:
        """Snapshot requests ([client, request]) up, replies ([client, reply]) down; never blocks on a peer."""
        while True:
            frames = await src.recv_multipart()
            if len(frames) != 2:
                continue
            with contextlib.suppress(zmq.Again, zmq.ZMQError):
                await dst.send_multipart(frames, flags=zmq.NOBLOCK)

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(self.limits.report_every)
            self.budget.report()
