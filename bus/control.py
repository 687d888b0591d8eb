"""Control channel: the root's ROUTER (`ControlServer`) and each worker's DEALER (`ControlClient`).

Both sides can send one-way messages and make requests (`corr` set); the peer's `on_message`
result comes back as a `"reply"` with the same `corr`, or an `"error"` if the handler raised.
Receive loops never die on bad input: malformed frames are counted in `drops` by reason, logged at
debug level (the 1st, 2nd, 4th, 8th … of each reason) and dropped. One-way messages are handled in
arrival order (handlers should be quick); requests run as tasks so a slow request never stalls
heartbeats or other workers. Both are bounded in count and in bytes (`SocketTuning`); beyond the
bounds a one-way message is dropped and a request answered with an `"overload"` error, so a peer
sending large frames never grows the receiver's memory (the ROUTER's libzmq queue per peer is sized
from the same byte budget).

Peers and identities. A peer is addressed by its name (the worker's node id); on the wire it is a
ZeroMQ routing identity. With `admission=True` (the root) only identities handed out with
`admit(peer, identity)` are served — one fresh, unguessable identity per worker incarnation
(`incarnation_identity`), given to the worker through the fork server — and a frame from any other
identity is refused: counted in `drops["unknown_peer"]`, logged, and a request gets an `"error"`
reply. Without admission (tests, benchmarks) a peer's identity is its name. There is no
`ROUTER_HANDOVER`: a second connection with an identity already connected never takes the route
over (with handover plus ZMTP heartbeats libzmq 4.3.5 aborts the process: `!_io_error`).

Liveness is checked twice: ZMTP heartbeats from each DEALER (libzmq's I/O thread answers them; the
ROUTER sends none of its own, see above) and an application heartbeat sent from the worker's asyncio
loop (`start_heartbeat`) that `ControlServer.last_seen` / `silent_workers` observe. Only the second
notices a worker whose Python thread is stuck (e.g. spinning while holding the GIL).

`request` raises `RequestTimeout` (a `TimeoutError`) on timeout and `RemoteError` when the peer
answered with `"error"`; `send` raises `PeerUnavailable` when the worker is not connected or its queue
stays full.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson
import zmq
import zmq.asyncio
from loguru import logger

from .protocol import MAX_FRAME_BYTES, RESPONSE_TYPES, DropCounter, Message, ProtocolError, decode, encode
from .security import (
    CurveClientConfig,
    CurveServerConfig,
    acquire_curve_server,
    apply_curve_client,
    check_bind_endpoint,
    ipc_endpoint,
    release_curve_server,
    restrict_ipc_socket,
)

_REFUSAL_LOG_EVERY = 10.0  # seconds between two log lines about the same refused identity
_REFUSALS_KEPT = 256  # refused identities remembered for that rate limit

ServerHandler = Callable[[str, Message], Awaitable[dict[str, Any] | None]]
ClientHandler = Callable[[Message], Awaitable[dict[str, Any] | None]]


class BusError(Exception):
    """Base class of control-channel failures."""


class RequestTimeout(BusError, TimeoutError):
    """No reply arrived within the request's timeout."""


class RemoteError(BusError):
    """The peer answered a request with an `"error"` message."""

    def __init__(self, message: Message) -> None:
        self.message = message
        self.reason = str(message.body.get("reason", "error"))
        self.detail = str(message.body.get("detail", ""))
        super().__init__(f"{message.sender}: {self.reason}" + (f" ({self.detail})" if self.detail else ""))


class PeerUnavailable(BusError):
    """A message could not be handed to the peer (not connected, or its queue stayed full)."""


class ChannelClosed(BusError):
    """The channel was closed while a request was waiting."""


@dataclass(frozen=True)
class SocketTuning:
    """Socket options applied to every control socket (times in ms)."""

    heartbeat_ivl_ms: int = 1000  # ZMTP PING interval
    heartbeat_timeout_ms: int = 3000  # no traffic for this long after a PING -> disconnect
    heartbeat_ttl_ms: int = 3000  # tells the peer to drop us after this long without traffic
    hwm: int = 10_000  # messages queued per peer before sends wait (then fail)
    linger_ms: int = 200  # close() flushes pending messages for at most this long
    send_timeout_ms: int = 1000  # a send that cannot be queued for this long fails
    hard_max_bytes: int = 64 << 20  # libzmq disconnects a peer sending larger messages (memory guard)
    max_queued_one_way: int = 100_000  # one-way messages waiting for the handler; beyond: dropped
    max_queued_bytes: int = 16 << 20  # ... and their frame bytes; beyond: dropped ("overload")
    max_inflight_requests: int = 1000  # peer requests being handled at once; beyond: "overload" error reply
    max_inflight_bytes: int = 16 << 20  # ... and their frame bytes; beyond: "overload" error reply
    drain_bytes: int = 8 << 20  # frame bytes handled per event-loop turn before other tasks get to run
    max_open_peers: int = 4096  # without admission: peers whose last frame time is kept (least recent dropped)
    max_inflight_per_peer: int = 0  # requests of one peer being handled at once (0: only the shared cap applies)
    max_reserved_inflight: int = 64  # requests of the reserved lane (`ControlServer(reserved=…)`) beyond the caps


def control_endpoint(run_dir: str | os.PathLike[str]) -> str:
    """The default control endpoint of a run: `ipc://<run_dir>/ctl.sock`."""
    return ipc_endpoint(run_dir, "ctl.sock")


def incarnation_identity(peer: str, attempt: int) -> str:
    """A fresh bus identity for one incarnation of `peer`: `<peer>.<attempt>.<random nonce>` (≤ 255 bytes).

    The nonce (128 bits) makes it unguessable, so no other process can connect as this incarnation;
    hand it to the worker through a private channel (the fork server), never argv or the environment.
    """
    tail = f".{attempt}.{secrets.token_urlsafe(16)}"
    head = peer.encode("utf-8")[: 255 - len(tail)].decode("utf-8", "ignore")
    return head + tail


def tune_socket(sock: zmq.Socket, tuning: SocketTuning, max_frame_bytes: int, *, zmtp_heartbeats: bool = True) -> None:
    if zmtp_heartbeats:
        sock.setsockopt(zmq.HEARTBEAT_IVL, tuning.heartbeat_ivl_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, tuning.heartbeat_timeout_ms)
        sock.setsockopt(zmq.HEARTBEAT_TTL, tuning.heartbeat_ttl_ms)
    sock.setsockopt(zmq.SNDHWM, tuning.hwm)
    sock.setsockopt(zmq.RCVHWM, tuning.hwm)
    sock.setsockopt(zmq.LINGER, tuning.linger_ms)
    sock.setsockopt(zmq.SNDTIMEO, tuning.send_timeout_ms)
    # The app-level limit (counted as "oversized") sits below libzmq's hard cap, so oversized
    # frames are visible in the drop counters instead of silently disconnecting the peer.
    sock.setsockopt(zmq.MAXMSGSIZE, max(tuning.hard_max_bytes, max_frame_bytes * 4))


class _Peer:
    """Shared machinery: pending requests, correlation ids, drop accounting, dispatch."""

    def __init__(self, name: str, max_frame_bytes: int, tuning: SocketTuning) -> None:
        self.name = name
        self.max_frame_bytes = max_frame_bytes
        self.tuning = tuning
        self.drops = DropCounter()
        self._pending: dict[str, tuple[str | None, asyncio.Future[Message]]] = {}
        self._corr_prefix = f"{os.getpid():x}.{id(self) & 0xFFFFFF:x}."
        self._corr_seq = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._recv_task: asyncio.Task[None] | None = None
        self._inflight = 0
        self._inflight_bytes = 0
        self._inflight_of: dict[str, int] = {}  # peer -> its requests being handled (not the reserved lane)
        self._requests_of: dict[str, set[asyncio.Task[None]]] = {}  # peer -> its request tasks (both lanes)
        self._reserved_inflight = 0
        self._copy_frames = True  # False: receive zmq.Frame objects (ControlServer reads each frame's source fd)
        self._queued_bytes = 0
        self._ordered: asyncio.Queue[tuple[Callable[[], Awaitable[Any]], Message, int]] = asyncio.Queue()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _new_corr(self) -> str:
        return self._corr_prefix + str(next(self._corr_seq))

    def _drop(self, reason: str, where: str, detail: str = "") -> None:
        self.drops.add(reason)
        n = self.drops[reason]
        if n & (n - 1) == 0:  # the 1st, 2nd, 4th, 8th … drop of a reason: a flood never floods the log
            logger.debug("{} dropped a frame from {}: {} {} (drop #{} of this kind)", self.name, where, reason, detail, n)

    def _encode_out(self, msg: Message) -> bytes:
        """Encode an outgoing frame; one that cannot be encoded is counted in `drops` (its reason, e.g.
        ``unencodable``) and refused with ProtocolError — nothing is sent, nothing else is affected."""
        try:
            return encode(msg, max_bytes=self.max_frame_bytes)
        except ProtocolError as exc:
            self.drops.add(exc.reason)
            logger.warning("{}: not sending {!r}: {}", self.name, msg.type, exc)
            raise

    def _resolve(self, peer: str | None, msg: Message) -> None:
        entry = self._pending.get(msg.corr or "")
        if entry is None or (entry[0] is not None and entry[0] != peer) or entry[1].done():
            self._drop("late_reply", str(peer), f"corr={msg.corr!r}")
            return
        entry[1].set_result(msg)

    async def _await_reply(self, corr: str, peer: str | None, send: Awaitable[None], what: str, timeout: float) -> Message:
        fut: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[corr] = (peer, fut)
        try:
            await send
            try:
                reply = await asyncio.wait_for(fut, timeout)
            except TimeoutError:
                raise RequestTimeout(f"no reply to {what} within {timeout:g}s") from None
        finally:
            self._pending.pop(corr, None)
        if reply.type == "error":
            raise RemoteError(reply)
        return reply

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(
        self,
        handler: Callable[[], Awaitable[dict[str, Any] | None]],
        msg: Message,
        send: Callable[[bytes], Awaitable[None]],
        size: int,
        reserved: bool = False,
    ) -> None:
        """Run a request handler and send its reply, or an error reply if it raised."""
        try:
            result = await handler()
            if result is not None and not isinstance(result, dict):
                raise TypeError(f"handler returned {type(result).__name__}, expected dict or None")
            raw = self._encode_out(Message("reply", self.name, result or {}, msg.corr))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("{}: handler for {!r} from {} failed", self.name, msg.type, msg.sender)
            body = {"reason": "handler_error", "detail": f"{type(exc).__name__}: {exc}"[:1000]}
            raw = encode(Message("error", self.name, body, msg.corr))
        finally:
            if reserved:
                self._reserved_inflight -= 1
            else:
                self._inflight -= 1
                self._inflight_bytes -= size
                left = self._inflight_of.get(msg.sender, 0) - 1
                if left > 0:
                    self._inflight_of[msg.sender] = left
                else:
                    self._inflight_of.pop(msg.sender, None)
        try:
            await send(raw)
        except BusError as exc:
            logger.warning("{}: could not reply to {!r} from {}: {}", self.name, msg.type, msg.sender, exc)

    def _on_frames(self, frames: list[Any]) -> None:
        raise NotImplementedError

    def _guarded(self, frames: list[Any]) -> None:
        try:
            self._on_frames(frames)
        except Exception:  # the loop must survive anything a peer can send
            logger.exception("{}: unexpected error handling a frame", self.name)
            self.drops.add("internal")

    async def _recv_loop(self, sock: zmq.asyncio.Socket) -> None:
        # a plain (blocking-API) view of the same socket: the drain's non-blocking receives skip the asyncio
        # socket's future per call (the awaiting receive below checks readiness itself, so nothing is missed)
        plain: zmq.Socket[Any] = zmq.Socket.shadow(sock.underlying)
        while True:
            try:
                frames = await sock.recv_multipart(copy=self._copy_frames)
            except asyncio.CancelledError:
                raise
            except zmq.ZMQError as exc:
                if exc.errno in (zmq.ETERM, zmq.ENOTSOCK):
                    return
                logger.warning("{}: receive failed: {}", self.name, exc)
                await asyncio.sleep(0.01)
                continue
            self._guarded(frames)
            if self._drain(plain):
                await asyncio.sleep(0)  # a busy peer must not starve handlers and timers

    def _drain(self, sock: zmq.Socket[Any], limit: int = 256) -> bool:
        """Handle frames already queued without a future round trip each; True if more may wait.

        Bounded by count and by bytes: decoding a run of large frames must not stall the loop."""
        budget = self.tuning.drain_bytes
        for _ in range(limit):
            try:
                frames: list[Any] = sock.recv_multipart(flags=zmq.NOBLOCK, copy=self._copy_frames)
            except zmq.ZMQError:  # Again, or a closing socket: the awaiting receive handles it
                return False
            self._guarded(frames)
            budget -= sum(len(f.buffer) if isinstance(f, zmq.Frame) else len(f) for f in frames)
            if budget <= 0:
                return True
        return True

    def _serve_request(
        self,
        handler: Callable[[], Awaitable[dict[str, Any] | None]],
        msg: Message,
        send: Callable[[bytes], Awaitable[None]],
        size: int,
        reserved: bool = False,
    ) -> None:
        """Run a request as a task, or answer "overload" beyond the caps (the shared one and the peer's own).

        A `reserved` request (e.g. the operator's stop, abort and status) bypasses both caps, bounded by its
        own `max_reserved_inflight`, so one client's flood never keeps the others from stopping the run."""
        tuning = self.tuning
        if reserved and self._reserved_inflight < tuning.max_reserved_inflight and size <= tuning.max_inflight_bytes:
            self._reserved_inflight += 1
            self._spawn_request(msg.sender, self._answer(handler, msg, send, size, reserved=True))
            return
        mine = self._inflight_of.get(msg.sender, 0)
        per_peer = tuning.max_inflight_per_peer
        detail = ""
        if per_peer and mine >= per_peer:
            detail = (f"{self.name} is alive but busy: {mine} requests in flight from your client "
                      f"({msg.sender}), at most {per_peer} per client; retry when some of them finish")
        elif self._inflight >= tuning.max_inflight_requests or self._inflight_bytes + size > tuning.max_inflight_bytes:
            detail = (f"{self.name} is alive but busy: {self._inflight} requests in flight from all clients "
                      f"({self._inflight_bytes} bytes), {mine} of them from your client ({msg.sender}); retry later")
        if detail:
            self._drop("overload", msg.sender, f"{msg.type!r}: {mine} requests in flight from this peer, "
                                               f"{self._inflight} in all ({self._inflight_bytes} bytes)")
            body = {"reason": "overload", "detail": detail}
            self._spawn(self._send_quietly(send, encode(Message("error", self.name, body, msg.corr))))
            return
        self._inflight += 1
        self._inflight_bytes += size
        self._inflight_of[msg.sender] = mine + 1
        self._spawn_request(msg.sender, self._answer(handler, msg, send, size))

    def _spawn_request(self, peer: str, coro: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        mine = self._requests_of.setdefault(peer, set())
        mine.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            mine.discard(t)
            if not mine and self._requests_of.get(peer) is mine:
                del self._requests_of[peer]

        task.add_done_callback(done)

    def cancel_requests(self, peer: str) -> int:
        """Cancel the requests of `peer` still being handled (it went away: nobody reads their replies)."""
        tasks = [t for t in self._requests_of.get(peer, ()) if not t.done()]
        for t in tasks:
            t.cancel()
        return len(tasks)

    def inflight(self, peer: str | None = None) -> int:
        """Requests being handled: of `peer` (both lanes), or of every peer."""
        if peer is None:
            return sum(len(ts) for ts in self._requests_of.values())
        return len(self._requests_of.get(peer, ()))

    async def _send_quietly(self, send: Callable[[bytes], Awaitable[None]], raw: bytes) -> None:
        with contextlib.suppress(BusError):
            await send(raw)

    def _enqueue(self, handler: Callable[[], Awaitable[Any]], msg: Message, size: int) -> None:
        # A flood of one-way messages from one peer must not exhaust the root's memory: bounded in bytes too.
        if self._ordered.qsize() >= self.tuning.max_queued_one_way or (
            self._queued_bytes + size > self.tuning.max_queued_bytes
        ):
            self._drop("overload", msg.sender, f"{msg.type!r}: handler queue full "
                                               f"({self._ordered.qsize()} messages, {self._queued_bytes} bytes)")
            return
        self._queued_bytes += size
        self._ordered.put_nowait((handler, msg, size))

    def _start_loops(self, recv: Coroutine[Any, Any, None]) -> None:
        self._recv_task = asyncio.create_task(recv, name=f"{self.name}-control-recv")
        self._spawn(self._one_way_loop())

    async def _one_way_loop(self) -> None:
        """Run one-way handlers one at a time, in arrival order."""
        while True:
            handler, msg, size = await self._ordered.get()
            try:
                await handler()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("{}: handler for {!r} from {} failed", self.name, msg.type, msg.sender)
            finally:
                self._queued_bytes -= size

    async def _shutdown(self, sock: zmq.asyncio.Socket | None) -> None:
        self._closed = True
        # close() may be called from a handler task: never cancel (or await) the caller itself.
        current = asyncio.current_task()
        tasks = [t for t in (self._recv_task, *self._tasks) if t is not None and t is not current]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._recv_task = None
        for _, fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ChannelClosed(f"{self.name}: channel closed"))
        self._pending.clear()
        if sock is not None:
            sock.close(linger=self.tuning.linger_ms)


class ControlServer(_Peer):
    """The root's ROUTER; handlers and `send`/`request` name a worker by its peer name (node id)."""

    def __init__(
        self,
        endpoint: str,
        *,
        on_message: ServerHandler,
        curve: CurveServerConfig | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        name: str = "root",
        tuning: SocketTuning | None = None,
        context: zmq.asyncio.Context | None = None,
        admission: bool = False,
        reserved: Callable[[Message], bool] | None = None,
        cancel_on_disconnect: bool = False,
    ) -> None:
        super().__init__(name, max_frame_bytes, tuning or SocketTuning())
        self.endpoint = endpoint
        self.on_message = on_message
        self.curve = curve
        self.admission = admission  # True: serve only identities given to admit()
        self.reserved = reserved  # requests it accepts are served beyond the in-flight caps (`_serve_request`)
        self.cancel_on_disconnect = cancel_on_disconnect
        self.cancelled_on_disconnect = 0  # requests cancelled because their peer disconnected
        self._copy_frames = not cancel_on_disconnect
        self._monitor: zmq.asyncio.Socket | None = None
        self._monitor_sync: zmq.Socket[bytes] | None = None
        self._monitor_task: asyncio.Task[None] | None = None
        self._peers_on_fd: dict[int, set[str]] = {}  # connection fd -> the peers whose frames came through it
        self._closed_fds: set[int] = set()  # fds whose connection closed and that no new connection holds yet
        self._ctx = context
        self._sock: zmq.asyncio.Socket | None = None
        self._sync: zmq.Socket[bytes] | None = None  # sync view, for replies that must never wait
        self._last_seen: dict[str, float] = {}  # least recently heard first
        self._peer_of: dict[bytes, str] = {}  # admitted identity -> peer name
        self._identity_of: dict[str, bytes] = {}  # peer name -> its admitted identity
        self._refusals: dict[bytes, float] = {}  # identity -> when its refusal was last logged

    async def start(self) -> str:
        """Bind and start receiving; returns the bound endpoint (resolved port for tcp://…:0)."""
        if self._sock is not None:
            raise RuntimeError("ControlServer already started")
        check_bind_endpoint(self.endpoint, self.curve)
        self._ctx = self._ctx or zmq.asyncio.Context.instance()
        sock = self._ctx.socket(zmq.ROUTER)
        try:
            # no ZMTP heartbeats and no ROUTER_HANDOVER here: together they let a second connection with
            # a live identity abort the process (libzmq 4.3.5); the app heartbeat covers liveness
            tune_socket(sock, self.tuning, self.max_frame_bytes, zmtp_heartbeats=False)
            # libzmq bounds its queue per peer in messages: derive it from the byte budget, so a worker
            # flooding large frames waits in its own memory (its send times out), not in the root's
            sock.setsockopt(zmq.RCVHWM, min(self.tuning.hwm, max(16, self.tuning.max_queued_bytes // self.max_frame_bytes)))
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unknown worker -> error, not silent loss
            if self.curve is not None:
                acquire_curve_server(self._ctx, sock, self.curve)
            sock.bind(self.endpoint)
            restrict_ipc_socket(self.endpoint)
        except Exception:
            sock.close(linger=0)
            if self.curve is not None:
                release_curve_server(self._ctx, self.curve)
            raise
        self._sock = sock
        self._sync = zmq.Socket.shadow(sock.underlying)
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        if self.cancel_on_disconnect:
            self._start_monitor(sock)
        self._start_loops(self._recv_loop(sock))
        return self.endpoint

    def _start_monitor(self, sock: zmq.asyncio.Socket) -> None:
        """Watch connections close, to cancel the requests of a peer that went away.

        A ROUTER does not tell its user that a peer disconnected (ZMQ_ROUTER_NOTIFY is a draft option, not
        built into this libzmq), so: each frame's source fd (ZMQ_SRCFD) names the connection it came through,
        and the socket monitor reports that fd's DISCONNECTED. The monitor is drained before every frame is
        handled: a reused fd's ACCEPTED is queued before any frame of the new connection, so a frame is never
        credited to the connection that held its fd before."""
        assert self._ctx is not None
        addr = f"inproc://legion-monitor-{id(self):x}-{secrets.token_hex(4)}"
        sock.monitor(addr, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        mon = self._ctx.socket(zmq.PAIR)
        mon.connect(addr)
        self._monitor = mon
        self._monitor_sync = zmq.Socket.shadow(mon.underlying)
        self._monitor_task = asyncio.create_task(self._monitor_loop(mon), name=f"{self.name}-control-monitor")

    async def _monitor_loop(self, mon: zmq.asyncio.Socket) -> None:
        while True:
            try:
                await mon.poll()
            except asyncio.CancelledError:
                raise
            except zmq.ZMQError:
                return
            self._drain_monitor()

    def _drain_monitor(self) -> None:
        mon = self._monitor_sync
        while mon is not None:
            try:
                frames = mon.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError:  # Again, or closed
                return
            if len(frames) != 2 or len(frames[0]) < 6:
                continue
            event = int.from_bytes(frames[0][:2], "little")
            fd = int.from_bytes(frames[0][2:6], "little")
            peers = self._peers_on_fd.pop(fd, set())
            if event != zmq.EVENT_DISCONNECTED:
                self._closed_fds.discard(fd)
                continue
            self._closed_fds.add(fd)
            for peer in peers:
                n = self.cancel_requests(peer)
                if n:
                    self.cancelled_on_disconnect += n
                    logger.info("{}: client {} disconnected; cancelled its {} request(s) in flight "
                                "({} cancelled so far)", self.name, peer, n, self.cancelled_on_disconnect)

    async def _stop_monitor(self) -> None:
        task, self._monitor_task = self._monitor_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        mon, self._monitor, self._monitor_sync = self._monitor, None, None
        if mon is not None:
            mon.close(linger=0)

    async def close(self) -> None:
        """Stop receiving, fail pending requests, close the socket; safe to call twice."""
        if self._closed:
            return
        sock, self._sock, self._sync = self._sock, None, None
        if sock is not None and self._monitor is not None:
            with contextlib.suppress(zmq.ZMQError):
                sock.disable_monitor()
        await self._stop_monitor()
        await self._shutdown(sock)
        if self.curve is not None and self._ctx is not None and sock is not None:
            release_curve_server(self._ctx, self.curve)

    async def send(self, worker_id: str, type: str, body: dict[str, Any]) -> None:
        """One-way message to a worker."""
        await self._send_raw(worker_id, self._encode_out(Message(type, self.name, body)))

    async def request(self, worker_id: str, type: str, body: dict[str, Any], timeout: float) -> Message:
        """Send a request to a worker and wait for its reply."""
        corr = self._new_corr()
        raw = self._encode_out(Message(type, self.name, body, corr))
        return await self._await_reply(corr, worker_id, self._send_raw(worker_id, raw), f"{type!r} to {worker_id!r}", timeout)

    def admit(self, worker_id: str, identity: str) -> None:
        """Serve `identity` as the worker `worker_id` (its current incarnation); replaces an older identity."""
        ident = identity.encode("utf-8")
        if not ident or len(ident) > 255 or ident.startswith(b"\x00"):
            raise ValueError(f"identity {identity!r} must be 1–255 UTF-8 bytes not starting with NUL")
        owner = self._peer_of.get(ident)
        if owner is not None and owner != worker_id:
            raise ValueError(f"identity {identity!r} is already admitted for {owner!r}")
        self.forget(worker_id)
        self._peer_of[ident] = worker_id
        self._identity_of[worker_id] = ident

    def last_seen(self, worker_id: str) -> float | None:
        """`time.monotonic()` of the last valid frame from the worker (None if never seen)."""
        return self._last_seen.get(worker_id)

    def silent_workers(self, now: float | None = None, interval: float = 1.0, missed: int = 3) -> list[str]:
        """Workers not heard from for more than `missed × interval` seconds (hung by our definition)."""
        now = time.monotonic() if now is None else now
        limit = missed * interval
        return sorted(w for w, t in self._last_seen.items() if now - t > limit)

    def forget(self, worker_id: str) -> None:
        """Stop tracking a worker (after it was retired); with admission its identity is refused from now on."""
        self._last_seen.pop(worker_id, None)
        ident = self._identity_of.pop(worker_id, None)
        if ident is not None:
            self._peer_of.pop(ident, None)

    @property
    def known_workers(self) -> list[str]:
        return sorted(self._last_seen)

    @property
    def zmq_socket(self) -> zmq.asyncio.Socket | None:
        """The bound ROUTER (for diagnostics such as socket monitors); None when not running."""
        return self._sock

    def _identity(self, worker_id: str) -> bytes:
        ident = self._identity_of.get(worker_id)
        if ident is not None:
            return ident
        if self.admission:
            raise PeerUnavailable(f"worker {worker_id!r} is not connected to {self.endpoint} (no admitted identity)")
        return worker_id.encode("utf-8")

    async def _send_raw(self, worker_id: str, raw: bytes) -> None:
        await self._send_to(self._identity(worker_id), worker_id, raw)

    async def _send_to(self, ident: bytes, worker_id: str, raw: bytes) -> None:
        if self._sock is None:
            raise ChannelClosed(f"{self.name}: control server is not running")
        try:
            await self._sock.send_multipart([ident, raw])
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                raise PeerUnavailable(f"worker {worker_id!r} is not connected to {self.endpoint}") from None
            if exc.errno == zmq.EAGAIN:
                raise PeerUnavailable(
                    f"worker {worker_id!r} did not take a message within {self.tuning.send_timeout_ms} ms "
                    f"(queue of {self.tuning.hwm} full)"
                ) from None
            raise

    def _on_frames(self, frames: list[Any]) -> None:
        fd = -1
        if not self._copy_frames:  # zmq.Frame objects: note the connection they came through
            self._drain_monitor()
            with contextlib.suppress(zmq.ZMQError):
                fd = frames[0].get(zmq.SRCFD) if frames else -1
            frames = [f.bytes for f in frames]
        if len(frames) != 2:
            self._drop("multipart", repr(frames[0][:64]) if frames else "?", f"{len(frames)} frames")
            return
        ident, raw = frames
        worker = self._peer_of.get(ident)
        if worker is None:
            if self.admission:
                self._refuse(ident, raw)
                return
            try:
                worker = ident.decode("utf-8")
            except UnicodeDecodeError:
                self._drop("sender_mismatch", repr(ident[:64]), "identity is not UTF-8")
                return
        try:
            msg = decode(raw, max_bytes=self.max_frame_bytes)
        except ProtocolError as exc:
            self._drop(exc.reason, repr(worker), exc.detail)
            if exc.reason == "not_json":
                self._answer_undecodable(ident, worker, raw)
            return
        if msg.sender != worker:
            self._drop("sender_mismatch", repr(worker), f"sender field {msg.sender!r}")
            return
        if fd in self._closed_fds and msg.corr is not None and msg.type not in RESPONSE_TYPES:
            # still queued when its connection closed: nobody is left to read the reply
            self.cancelled_on_disconnect += 1
            self._drop("peer_gone", repr(worker), f"{msg.type!r} request from a closed connection")
            return
        self._seen(worker)
        if fd >= 0:
            self._peers_on_fd.setdefault(fd, set()).add(worker)
        if msg.type in RESPONSE_TYPES:
            self._resolve(worker, msg)
        elif msg.corr is not None:
            reserved = self.reserved is not None and self.reserved(msg)
            self._serve_request(lambda: self.on_message(worker, msg), msg, lambda r: self._send_to(ident, worker, r),
                                len(raw), reserved)
        else:
            self._enqueue(lambda: self.on_message(worker, msg), msg, len(raw))

    def _answer_undecodable(self, ident: bytes, worker: str, raw: bytes) -> None:
        """A request whose frame is not valid UTF-8 gets an error naming the byte, not silence (the sender would
        wait out its timeout and blame the root)."""
        try:
            raw.decode("utf-8")
            return  # valid UTF-8 but not JSON: nothing to say about it
        except UnicodeDecodeError as bad:
            where = f"byte 0x{raw[bad.start]:02x} at offset {bad.start} of the frame"
        try:
            obj = orjson.loads(raw.decode("utf-8", "replace"))
        except orjson.JSONDecodeError:
            return
        if not isinstance(obj, dict) or not isinstance(obj.get("c"), str) or obj.get("s") != worker:
            return
        if obj.get("t") in RESPONSE_TYPES or self._sync is None:
            return
        body = {"reason": "bad_frame", "detail": f"the request is not valid UTF-8 ({where}); send UTF-8 text"}
        with contextlib.suppress(zmq.ZMQError, ProtocolError):
            self._sync.send_multipart([ident, encode(Message("error", self.name, body, obj["c"]))], zmq.NOBLOCK)

    def _seen(self, worker: str) -> None:
        self._last_seen.pop(worker, None)  # re-inserted last: the dict stays ordered by recency
        self._last_seen[worker] = time.monotonic()
        if not self.admission and len(self._last_seen) > self.tuning.max_open_peers:
            # without admission anyone may connect under any name: keep the book bounded
            del self._last_seen[next(iter(self._last_seen))]

    def _refuse(self, ident: bytes, raw: bytes) -> None:
        """A frame from an identity that is no admitted worker incarnation: count, log, answer a request."""
        self.drops.add("unknown_peer")
        now = time.monotonic()
        logged = self._refusals.pop(ident, None)
        if logged is None or now - logged >= _REFUSAL_LOG_EVERY:
            logger.warning("{}: refused a frame from unknown identity {!r} on {} (no admitted worker incarnation; "
                           "{} refused so far)", self.name, ident[:64], self.endpoint, self.drops["unknown_peer"])
            logged = now
        self._refusals[ident] = logged
        if len(self._refusals) > _REFUSALS_KEPT:
            del self._refusals[next(iter(self._refusals))]
        try:
            msg = decode(raw, max_bytes=self.max_frame_bytes)
        except ProtocolError:
            return
        if msg.corr is None or msg.type in RESPONSE_TYPES or self._sync is None:
            return
        body = {"reason": "unknown_peer", "detail": f"unknown worker identity {ident[:64]!r}: connection refused"}
        with contextlib.suppress(zmq.ZMQError, ProtocolError):  # never wait for (or fail on) an impostor
            self._sync.send_multipart([ident, encode(Message("error", self.name, body, msg.corr))], zmq.NOBLOCK)


class ControlClient(_Peer):
    """A worker's DEALER connected to the root's ROUTER; `name` (default: the identity) is its sender."""

    def __init__(
        self,
        endpoint: str,
        identity: str,
        *,
        on_message: ClientHandler | None = None,
        curve: CurveClientConfig | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        tuning: SocketTuning | None = None,
        context: zmq.asyncio.Context | None = None,
        name: str | None = None,
    ) -> None:
        ident = identity.encode("utf-8") if isinstance(identity, str) else b""
        if not ident or len(ident) > 255 or ident.startswith(b"\x00"):
            raise ValueError(f"worker identity {identity!r} must be 1–255 UTF-8 bytes not starting with NUL")
        super().__init__(name or identity, max_frame_bytes, tuning or SocketTuning())
        self.endpoint = endpoint
        self.identity = identity
        self.on_message = on_message
        self.curve = curve
        self._ctx = context
        self._sock: zmq.asyncio.Socket | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None
        self.heartbeats_sent = 0

    async def connect(self) -> None:
        if self._sock is not None:
            raise RuntimeError("ControlClient already connected")
        if self.endpoint.startswith("tcp://") and self.curve is None:
            raise ValueError(f"{self.endpoint} is a tcp:// endpoint; pass curve=CurveClientConfig(...) to connect")
        self._ctx = self._ctx or zmq.asyncio.Context.instance()
        sock = self._ctx.socket(zmq.DEALER)
        try:
            tune_socket(sock, self.tuning, self.max_frame_bytes)
            sock.setsockopt(zmq.IDENTITY, self.identity.encode("utf-8"))
            if self.curve is not None:
                apply_curve_client(sock, self.curve)
            sock.connect(self.endpoint)
        except Exception:
            sock.close(linger=0)
            raise
        self._sock = sock
        self._start_loops(self._recv_loop(sock))

    async def close(self) -> None:
        """Stop the heartbeat and receive loop, close the socket; safe to call twice."""
        if self._closed:
            return
        self.stop_heartbeat()
        sock, self._sock = self._sock, None
        await self._shutdown(sock)

    async def send(self, type: str, body: dict[str, Any]) -> None:
        """One-way message to the root."""
        await self._send_raw(self._encode_out(Message(type, self.name, body)))

    async def request(self, type: str, body: dict[str, Any], timeout: float) -> Message:
        corr = self._new_corr()
        raw = self._encode_out(Message(type, self.name, body, corr))
        return await self._await_reply(corr, None, self._send_raw(raw), f"{type!r} to the root", timeout)

    def start_heartbeat(self, interval: float = 1.0, payload: Callable[[], dict[str, Any] | None] | None = None) -> None:
        """Send `"heartbeat"` every `interval` s from this event loop (so a stuck loop goes silent); a beat whose
        `payload()` is None is skipped (a worker with nothing in flight that its root no longer watches)."""
        if interval <= 0:
            raise ValueError("heartbeat interval must be positive")
        self.stop_heartbeat()
        self._heartbeat_task = asyncio.create_task(self._heartbeat(interval, payload), name=f"{self.name}-heartbeat")

    def stop_heartbeat(self) -> None:
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            self._heartbeat_task = None

    async def _heartbeat(self, interval: float, payload: Callable[[], dict[str, Any] | None] | None) -> None:
        while True:
            body: dict[str, Any] | None = {}
            if payload is not None:
                try:
                    body = payload()
                except Exception:
                    logger.exception("{}: heartbeat payload failed; sending an empty heartbeat", self.name)
                    body = {}
            if body is not None:
                try:
                    await self.send("heartbeat", body)
                    self.heartbeats_sent += 1
                except (BusError, ProtocolError) as exc:
                    logger.warning("{}: heartbeat not sent: {}", self.name, exc)
            await asyncio.sleep(interval)

    async def _send_raw(self, raw: bytes) -> None:
        if self._sock is None:
            raise ChannelClosed(f"{self.name}: control client is not connected")
        try:
            await self._sock.send(raw)
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EAGAIN:
                raise PeerUnavailable(
                    f"{self.name}: the root did not take a message within {self.tuning.send_timeout_ms} ms"
                ) from None
            raise

    def _on_frames(self, frames: list[Any]) -> None:
        if len(frames) != 1:
            self._drop("multipart", "root", f"{len(frames)} frames")
            return
        try:
            msg = decode(frames[0], max_bytes=self.max_frame_bytes)
        except ProtocolError as exc:
            self._drop(exc.reason, "root", exc.detail)
            return
        if msg.type in RESPONSE_TYPES:
            self._resolve(None, msg)
            return
        handler = self.on_message
        if msg.corr is not None:
            if handler is None:
                body = {"reason": "no_handler", "detail": f"{self.name} does not accept requests"}
                self._spawn(self._send_raw(encode(Message("error", self.name, body, msg.corr))))
                return
            self._serve_request(lambda: handler(msg), msg, self._send_raw, len(frames[0]))
        elif handler is not None:
            self._enqueue(lambda: handler(msg), msg, len(frames[0]))
