"""Monitor stream: the root's PUB of sequenced events plus a snapshot endpoint (zguide "Clone").

Publisher side (root): `MonitorPublisher.publish(type, body)` gives every event the next `seq`
and never blocks — a slow or stalled monitor loses messages at its high-water mark instead of
slowing supervision or growing the root. The queue per subscriber is bounded in bytes: a body
larger than `max_event_bytes` encoded is truncated before publishing (long strings cut, and a
`"truncated": {"bytes": original size, "limit": …}` field says so), batch frames stop at
`max_batch_bytes`, and the PUB's high-water mark (in frames) is `queue_bytes` divided by the
largest frame (unless `sndhwm` is given). The snapshot endpoint answers `{"seq": last_seq, "state": provider()}`.
The provider and `publish` must run on the same thread (the root's event loop) and the caller
must update its state *before* publishing the event that describes the change; then a snapshot
taken at `seq = S` contains exactly the effects of events 1..S.

Client side: `MonitorClient` (asyncio) and `MonitorStream` (blocking, for the CLI) subscribe first,
wait until the subscription is live, take a snapshot, drop events with `seq <= snapshot.seq` and
deliver the rest in order. A gap in `seq` (or a tick announcing a seq we never saw) means events
were lost: the client counts it in `gaps` and re-snapshots, yielding a fresh `Snapshot`.

Batching (default): events published within `flush_delay` (2 ms) leave as one frame of at most
`max_batch` events and `max_batch_bytes` — several times the throughput of a frame per event for
both sides, at no visible latency, and few frames even for bursts (the high-water mark counts frames). Each body is encoded once, at `publish`; one orjson cannot
encode is logged and counted in `drops["unencodable"]` (batch mode: its seq is used up, so subscribers
see a gap and re-snapshot; single mode: `publish` raises ProtocolError and no seq is used).

Every frame carries the publisher's random `epoch`: a root that restarts numbers from 1 again, so
a frame from another epoch makes the client re-snapshot (counted in `restarts`, not `gaps`).

Wire frames on the PUB (one orjson frame each):
    {"v": 1, "e": epoch, "seq": n, "t": type, "b": body}          one event
    {"v": 1, "e": epoch, "batch": [[seq, type, body], ...]}       consecutive events (batch mode)
    {"v": 1, "e": epoch, "tick": last_seq}                        liveness tick, every `tick_interval`
Snapshot request/reply on the ROUTER:
    {"v": 1, "snap": id} -> {"v": 1, "e": epoch, "snap": id, "seq": S, "state": {...}}

Each endpoint accepts at most `max_connections` (default: a quarter of RLIMIT_NOFILE): at the limit it is
closed for two seconds, so a local connection flood never takes the root's last descriptors (libzmq
aborts on EMFILE in an ipc accept). The root binds only the ipc endpoints. A `tcp://` monitor is served by a separate, supervised relay
process (`legion.bus.relay`, started by `supervision/relay_child.py`): it subscribes to these ipc
endpoints, forwards the frames unchanged (so seq, epoch and ticks are the root's), and forwards snapshot
requests as `[relay, client, request]` — see docs/servers.md. The `tcp_endpoint` options below bind tcp
in *this* process; the root never uses them.

Use: `cli = MonitorClient(run_dir)` (or an endpoint pair), `snap = await cli.attach()`, then
`await cli.next()` / `async for item in cli`; `MonitorStream(run_dir)` is the blocking iterator.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import orjson
import zmq
import zmq.asyncio
import zmq.utils.monitor
from loguru import logger

from legion.procs import nofile_limit

from .handshake import HandshakeWatch
from .protocol import DropCounter, ProtocolError
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

MONITOR_VERSION = 1
MAX_EVENT_BYTES = 64 << 10  # an event body larger than this (encoded) is truncated before publishing
_MAX_ITEMS = 64  # items kept per container when a body is truncated
_GUARD_PAUSE = 2.0  # seconds a monitor endpoint stays closed after reaching max_connections
_SNAPSHOT_HWM = 16  # snapshot replies queued per client: a client that asks and never reads stays small
StateProvider = Callable[[], dict[str, Any]]


def default_max_connections() -> int:
    """Connections per monitor endpoint: a quarter of RLIMIT_NOFILE (at least 64), so the two endpoints never
    hold more than half of the root's descriptors; the rest is the control plane's reserve."""
    return max(64, nofile_limit() // 4)


def monitor_endpoints(run_dir: str | os.PathLike[str]) -> tuple[str, str]:
    """(PUB endpoint, snapshot endpoint) of a run: `ipc://<run_dir>/mon.sock`, `…/snap.sock`."""
    return ipc_endpoint(run_dir, "mon.sock"), ipc_endpoint(run_dir, "snap.sock")


def truncate_body(body: Any, size: int, limit: int) -> dict[str, Any]:
    """A stand-in, at most `limit` bytes encoded, for an event body of `size` bytes: long strings cut,
    containers shortened, and `"truncated": {"bytes": size, "limit": limit}` saying so."""
    mark: dict[str, Any] = {"bytes": size, "limit": limit}
    if isinstance(body, dict):
        for max_str in (limit // 16, limit // 256, 16):
            cut = _shrink(body, max(16, max_str), 0)
            cut["truncated"] = mark
            if len(orjson.dumps(cut)) <= limit:
                return cut
    return {"truncated": mark}


def _shrink(value: Any, max_str: int, depth: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= max_str else value[:max_str] + "…"
    if isinstance(value, dict):
        if depth >= 4:
            return "…"
        return {str(k)[:max_str]: _shrink(v, max_str, depth + 1) for k, v in list(value.items())[:_MAX_ITEMS]}
    if isinstance(value, list | tuple):
        return "…" if depth >= 4 else [_shrink(v, max_str, depth + 1) for v in value[:_MAX_ITEMS]]
    return value


def _drain(watch: zmq.asyncio.Socket) -> None:
    """Read what a socket monitor has queued, without waiting."""
    sync: zmq.Socket[bytes] = zmq.Socket.shadow(watch.underlying)
    with contextlib.suppress(zmq.ZMQError):
        while sync.poll(0):
            sync.recv_multipart(zmq.NOBLOCK)


class MonitorError(RuntimeError):
    """The monitor stream could not be followed (no snapshot answer, bad reply)."""


class MonitorRefused(MonitorError):
    """A tcp:// monitor refused this client in the CurveZMQ handshake (the message says what to check)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The publisher's state as of `seq`; replaces whatever state the consumer held."""

    seq: int
    state: dict[str, Any]


@dataclass(frozen=True, slots=True)
class MonitorEvent:
    seq: int
    type: str
    body: dict[str, Any]


MonitorItem = Snapshot | MonitorEvent


class MonitorPublisher:
    """PUB of sequenced events plus a ROUTER answering snapshot requests."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        provider: StateProvider,
        endpoint: str | None = None,
        snapshot_endpoint: str | None = None,
        tcp_endpoint: str | None = None,
        tcp_snapshot_endpoint: str | None = None,
        curve: CurveServerConfig | None = None,
        sndhwm: int | None = None,
        tick_interval: float = 0.5,
        batch: bool = True,
        max_batch: int = 256,
        context: zmq.asyncio.Context | None = None,
        queue_bytes: int = 16 << 20,
        max_event_bytes: int = MAX_EVENT_BYTES,
        max_batch_bytes: int = 128 << 10,
        flush_delay: float = 0.002,
        max_connections: int | None = None,
    ) -> None:
        if run_dir is None and (endpoint is None or snapshot_endpoint is None):
            raise ValueError("MonitorPublisher needs run_dir or both endpoint and snapshot_endpoint")
        if (tcp_endpoint is None) != (tcp_snapshot_endpoint is None):
            raise ValueError("tcp_endpoint and tcp_snapshot_endpoint go together (a tcp monitor needs both)")
        defaults = monitor_endpoints(run_dir) if run_dir is not None else ("", "")
        self.endpoint = endpoint or defaults[0]
        self.snapshot_endpoint = snapshot_endpoint or defaults[1]
        self.tcp_endpoint = tcp_endpoint
        self.tcp_snapshot_endpoint = tcp_snapshot_endpoint
        self.provider = provider
        self.curve = curve
        self.max_event_bytes = max_event_bytes
        self.max_batch_bytes = max_batch_bytes
        self.flush_delay = flush_delay
        largest_frame = (max_batch_bytes if batch else 0) + max_event_bytes + 1024
        self.sndhwm = sndhwm if sndhwm is not None else max(8, queue_bytes // largest_frame)
        self.truncated = 0  # event bodies cut to max_event_bytes
        self.tick_interval = tick_interval
        self.batch = batch
        self.max_batch = max_batch
        self.epoch = secrets.token_hex(8)  # names this publisher's seq numbering (a restarted root differs)
        self.last_seq = 0
        self._taps: list[Callable[[str, dict[str, Any]], None]] = []  # `tap`: in-process readers of the stream
        self.published = 0
        self.drops = DropCounter()  # bad snapshot requests, events lost to a full queue
        self._ctx = context
        self._pub: zmq.Socket[bytes] | None = None  # sync view: a PUB send never waits
        self._pub_async: zmq.asyncio.Socket | None = None
        self._snap: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._watches: list[zmq.asyncio.Socket] = []  # the endpoint guards' socket-monitor readers
        self._pending: list[list[Any]] = []  # [seq, type, orjson.Fragment(body)]
        self._pending_bytes = 0
        self._flush_scheduled = False
        self._closed = False
        # the root's descriptor reserve: connections per endpoint it accepts before it stops listening
        self.max_connections = max_connections if max_connections is not None else default_max_connections()
        self.connections = {"pub": 0, "snapshot": 0}
        self.paused = 0  # times an endpoint stopped listening at max_connections

    async def start(self) -> tuple[str, str]:
        """Bind PUB and snapshot endpoints; returns the bound (PUB, snapshot) ipc endpoints."""
        for ep in (self.endpoint, self.snapshot_endpoint):
            check_bind_endpoint(ep, None)
        for tcp in (self.tcp_endpoint, self.tcp_snapshot_endpoint):
            if tcp is not None:
                check_bind_endpoint(tcp, self.curve)
        ctx = self._ctx = self._ctx or zmq.asyncio.Context.instance()
        pub, snap = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
        self._pub_async, self._snap = pub, snap
        watches: list[tuple[zmq.asyncio.Socket, str, str, zmq.asyncio.Socket]] = []
        try:
            pub.setsockopt(zmq.SNDHWM, self.sndhwm)
            for s in (pub, snap):
                s.setsockopt(zmq.LINGER, 0)  # a monitor is never worth waiting for at exit
                s.setsockopt(zmq.HEARTBEAT_IVL, 1000)
                s.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
                s.setsockopt(zmq.HEARTBEAT_TTL, 3000)
            snap.setsockopt(zmq.MAXMSGSIZE, 4096)  # requests are tiny
            snap.setsockopt(zmq.SNDHWM, _SNAPSHOT_HWM)
            guards = [(pub, "pub", self.endpoint), (snap, "snapshot", self.snapshot_endpoint)]
            for s, name, ep in guards:
                watches.append((s, name, ep, s.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)))
            if self.curve is not None and self.tcp_endpoint is not None:
                acquire_curve_server(ctx, pub, self.curve)
                acquire_curve_server(ctx, snap, self.curve)
            pub.bind(self.endpoint)
            snap.bind(self.snapshot_endpoint)
            restrict_ipc_socket(self.endpoint)
            restrict_ipc_socket(self.snapshot_endpoint)
            if self.tcp_endpoint is not None and self.tcp_snapshot_endpoint is not None:
                pub.bind(self.tcp_endpoint)
                self.tcp_endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
                snap.bind(self.tcp_snapshot_endpoint)
                self.tcp_snapshot_endpoint = snap.getsockopt_string(zmq.LAST_ENDPOINT)
        except Exception:
            for *_, watch in watches:
                watch.close(linger=0)
            await self.close()
            raise
        self._pub = zmq.Socket.shadow(pub.underlying)
        self._tasks = [asyncio.create_task(self._serve_snapshots(), name="monitor-snapshots")]
        self._tasks += [asyncio.create_task(self._guard(*w), name=f"monitor-guard-{w[1]}") for w in watches]
        self._watches = [w[3] for w in watches]
        if self.tick_interval > 0:
            self._tasks.append(asyncio.create_task(self._tick(), name="monitor-ticks"))
        return self.endpoint, self.snapshot_endpoint

    async def close(self) -> None:
        """Stop serving and close both sockets; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._pending:
            self._flush()
        # the socket monitors stop while their readers are still open and drained: libzmq's io thread sends each
        # event with the socket's monitor lock held and blocks while the reader is gone or full, and
        # disable_monitor() takes that lock (a deadlock of the whole process, seen in a test's teardown)
        for watch in self._watches:
            _drain(watch)
        for s in (self._pub_async, self._snap):
            if s is not None:
                with contextlib.suppress(zmq.ZMQError):
                    s.disable_monitor()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._watches = []
        for s in (self._pub_async, self._snap):
            if s is not None:
                s.close(linger=0)
        if self.curve is not None and self.tcp_endpoint is not None and self._ctx is not None:
            release_curve_server(self._ctx, self.curve)
            release_curve_server(self._ctx, self.curve)
        self._pub = self._pub_async = self._snap = None

    def publish(self, type: str, body: dict[str, Any] | None = None) -> int:
        """Publish one event and return its seq; never blocks, never raises on a full queue.

        Call it from the thread that runs the publisher's event loop (ZeroMQ sockets are not
        thread-safe); in batch mode the flush is scheduled on that loop.
        """
        if not isinstance(type, str) or not type:
            raise ProtocolError("bad_envelope", f"monitor event type must be a non-empty str, got {type!r}")
        body = {} if body is None else body
        if self.batch and not isinstance(body, dict):
            raise ProtocolError("bad_envelope", f"monitor event body must be an object, got {body!r:.80}")
        seq = self.last_seq + 1
        try:
            raw = self._encode_body(type, body)
        except ProtocolError:
            self.drops.add("unencodable")
            if not self.batch:
                raise  # refused: nothing was sent, no seq used
            logger.error("monitor event {} {!r} has an unencodable body; subscribers will see a gap", seq, type)
        else:
            if self.batch:
                self._queue(seq, type, raw)
            else:
                self._send(orjson.dumps({"v": MONITOR_VERSION, "e": self.epoch, "seq": seq, "t": type,
                                         "b": orjson.Fragment(raw)}), 1)  # fmt: skip
        self.last_seq = seq
        self.published += 1
        for tap in self._taps:
            try:
                tap(type, body)
            except Exception as exc:  # an in-process reader never breaks the publisher
                logger.warning("monitor tap failed on {}: {!r}", type, exc)
        return seq

    def tap(self, reader: Callable[[str, dict[str, Any]], None]) -> None:
        """Call `reader(type, body)` after each published event, in this process (a progress view: no socket)."""
        self._taps.append(reader)

    def _encode_body(self, type: str, body: Any) -> bytes:
        """The body as JSON, truncated to `max_event_bytes`; ProtocolError if orjson cannot encode it."""
        try:
            raw = orjson.dumps(body)
        except TypeError as exc:  # orjson.JSONEncodeError
            raise ProtocolError("unencodable", f"monitor event {type!r}: {exc}") from None
        if len(raw) <= self.max_event_bytes:
            return raw
        self.truncated += 1
        return orjson.dumps(truncate_body(body, len(raw), self.max_event_bytes))

    def _queue(self, seq: int, type: str, raw: bytes) -> None:
        self._pending.append([seq, type, orjson.Fragment(raw)])
        self._pending_bytes += len(raw)
        if len(self._pending) >= self.max_batch or self._pending_bytes >= self.max_batch_bytes:
            self._flush()
        elif not self._flush_scheduled:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop (a script): nothing to batch with, send now
                self._flush()
            else:
                self._flush_scheduled = True
                loop.call_later(self.flush_delay, self._flush)

    def flush(self) -> None:
        """Send batched events now (batch mode); a no-op otherwise."""
        self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if pending:
            self._send(orjson.dumps({"v": MONITOR_VERSION, "e": self.epoch, "batch": pending}), len(pending))

    def _send(self, raw: bytes, n: int) -> None:
        if self._pub is None:
            self.drops.add("not_started", n)
            return
        try:
            self._pub.send(raw, zmq.NOBLOCK)
        except zmq.Again:  # PUB drops at HWM itself; this only happens on odd transports
            self.drops.add("queue_full", n)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.tick_interval)
            try:
                if self._pending:
                    self._flush()
                self._send(orjson.dumps({"v": MONITOR_VERSION, "e": self.epoch, "tick": self.last_seq}), 0)
            except zmq.ZMQError as exc:
                logger.warning("monitor tick not sent: {}", exc)

    async def _serve_snapshots(self) -> None:
        assert self._snap is not None
        sock = self._snap
        while True:
            try:
                frames = await sock.recv_multipart()
            except zmq.ZMQError as exc:
                if exc.errno in (zmq.ETERM, zmq.ENOTSOCK):
                    return
                logger.warning("monitor snapshot receive failed: {}", exc)
                await asyncio.sleep(0.01)
                continue
            try:
                reply = self._snapshot_reply(frames)
                if reply is not None:
                    # A client that went away or stopped reading must not stall the publisher.
                    with contextlib.suppress(zmq.Again, zmq.ZMQError):
                        await sock.send_multipart([*frames[:-1], reply], flags=zmq.NOBLOCK)
            except Exception:
                logger.exception("monitor snapshot request failed")

    async def _guard(self, sock: zmq.asyncio.Socket, name: str, endpoint: str, watch: zmq.asyncio.Socket) -> None:
        """At `max_connections` on `endpoint`, close it (and its connections) for `_GUARD_PAUSE` seconds.

        libzmq aborts the process when an ipc accept meets EMFILE, so the root never lets its monitor
        endpoints take descriptors without bound (docs/servers.md). libzmq has no per-listener cap, and
        unbinding a listener also ends the connections it accepted: every subscriber (the tcp relay too)
        reconnects once the endpoint is back and heals the gap with a snapshot."""
        listening, paused_at = True, 0.0
        try:
            while True:
                if await watch.poll(250):
                    event = zmq.utils.monitor.parse_monitor_message(await watch.recv_multipart())
                    if listening and event["endpoint"] == endpoint.encode():  # not a tcp endpoint's peers
                        self.connections[name] += 1 if event["event"] == zmq.EVENT_ACCEPTED else -1
                count = self.connections[name]
                if listening and count >= self.max_connections:
                    sock.unbind(endpoint)
                    listening, paused_at = False, time.monotonic()
                    self.connections[name] = 0
                    self.paused += 1
                    logger.error("monitor {} endpoint: {} connections (limit {}, a flood?): closed for {:g}s with "
                                 "its connections; subscribers reconnect and re-snapshot", name, count,
                                 self.max_connections, _GUARD_PAUSE)  # fmt: skip
                elif not listening and time.monotonic() - paused_at >= _GUARD_PAUSE:
                    sock.bind(endpoint)
                    restrict_ipc_socket(endpoint)
                    listening = True
                    logger.info("monitor {} endpoint: accepting connections again", name)
        except zmq.ZMQError as exc:
            if exc.errno not in (zmq.ETERM, zmq.ENOTSOCK):
                logger.error("monitor {} endpoint guard stopped: {}", name, exc)
        finally:
            watch.close(linger=0)

    def _snapshot_reply(self, frames: list[bytes]) -> bytes | None:
        # [peer, request], or [relay, client, request] from the tcp relay (bus/relay.py): its ROUTER-DEALER
        # forwarding adds the remote client's routing id, which the reply carries back (`frames[:-1]`).
        if not (len(frames) == 2 or (len(frames) == 3 and _is_routing_id(frames[1]))):
            self.drops.add("multipart")
            return None
        try:
            req = orjson.loads(frames[-1])
        except orjson.JSONDecodeError:
            self.drops.add("not_json")
            return None
        if not isinstance(req, dict) or req.get("v") != MONITOR_VERSION or "snap" not in req:
            self.drops.add("bad_request")
            return None
        if self._pending:
            self._flush()  # the snapshot's seq must never be ahead of what the PUB has sent
        try:
            state = self.provider()
            return orjson.dumps(
                {"v": MONITOR_VERSION, "e": self.epoch, "snap": req["snap"], "seq": self.last_seq, "state": state}
            )
        except Exception as exc:
            logger.exception("monitor state provider failed")
            return orjson.dumps({"v": MONITOR_VERSION, "snap": req["snap"], "error": f"{type(exc).__name__}: {exc}"})


def _is_routing_id(frame: bytes) -> bool:
    """A ROUTER's generated routing id (libzmq: a zero byte and a 4-byte counter)."""
    return len(frame) == 5 and frame[0] == 0


class _CloneState:
    """Sequencing logic shared by the async and blocking clients (no I/O)."""

    def __init__(self) -> None:
        self.last: int | None = None
        self.epoch: str | None = None
        self.gaps = 0
        self.restarts = 0
        self.snapshots = 0
        self.stale = 0
        self.malformed = 0
        self._req_ids = itertools.count(1)
        self.current_req: int | None = None

    def snapshot_request(self) -> bytes:
        self.current_req = next(self._req_ids)
        return orjson.dumps({"v": MONITOR_VERSION, "snap": self.current_req})

    def on_snapshot_reply(self, raw: bytes) -> Snapshot | None:
        """A Snapshot for the current request; None for a stale reply to an older one."""
        try:
            rep = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise MonitorError("snapshot reply is not JSON") from None
        if not isinstance(rep, dict) or rep.get("snap") != self.current_req:
            return None
        if "error" in rep:
            raise MonitorError(f"publisher could not produce a snapshot: {rep['error']}")
        seq, state = rep.get("seq"), rep.get("state")
        if type(seq) is not int or not isinstance(state, dict):
            raise MonitorError("snapshot reply lacks an integer seq or an object state")
        epoch = rep.get("e")
        self.epoch = epoch if isinstance(epoch, str) else None
        self.last = seq
        self.snapshots += 1
        return Snapshot(seq, state)

    def on_frame(self, raw: bytes) -> tuple[list[MonitorEvent], bool]:
        """Events to deliver from one PUB frame, and whether a re-snapshot is needed."""
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            self.malformed += 1
            return [], False
        if not isinstance(obj, dict) or obj.get("v") != MONITOR_VERSION:
            self.malformed += 1
            return [], False
        epoch = obj.get("e")
        if self.epoch is not None and isinstance(epoch, str) and epoch != self.epoch:
            # A different publisher (the root restarted): its seq numbering means nothing to us.
            self.restarts += 1
            return [], True
        if "tick" in obj:
            tick = obj["tick"]
            if type(tick) is int and self.last is not None and tick > self.last:
                self.gaps += 1
                return [], True
            return [], False
        entries = obj["batch"] if "batch" in obj else [[obj.get("seq"), obj.get("t"), obj.get("b")]]
        out: list[MonitorEvent] = []
        for entry in entries if isinstance(entries, list) else []:
            if not (isinstance(entry, list) and len(entry) == 3):
                self.malformed += 1
                continue
            seq, type_, body = entry
            if type(seq) is not int or not isinstance(type_, str) or not isinstance(body, dict):
                self.malformed += 1
                continue
            if self.last is None or seq <= self.last:
                self.stale += 1
                continue
            if seq != self.last + 1:
                self.gaps += 1
                return out, True
            self.last = seq
            out.append(MonitorEvent(seq, type_, body))
        return out, False


def _resolve_target(target: str | os.PathLike[str], snapshot_endpoint: str | None) -> tuple[str, str]:
    if isinstance(target, str) and "://" in target:
        if snapshot_endpoint is None:
            raise ValueError(f"attaching to {target} needs snapshot_endpoint too")
        return target, snapshot_endpoint
    run_dir = Path(target)
    if not run_dir.is_dir():
        raise MonitorError(f"run directory {run_dir} does not exist; pass the run's directory or an endpoint")
    pub, snap = monitor_endpoints(run_dir)
    return pub, snapshot_endpoint or snap


_Wait = tuple[Any, int, int]  # (socket to poll, zmq.POLLIN or zmq.POLLOUT, timeout in ms; -1: none)
_T = TypeVar("_T")
_Steps = Generator[_Wait, int, _T]  # a client's I/O steps: each yield is a poll, answered with its result


class _CloneClient:
    """The Clone-pattern client, once: sockets, snapshot requests, framing and gap handling (`_CloneState`).

    Its steps are generators that send and receive without blocking and yield only to wait for a socket;
    `MonitorClient` awaits that poll and `MonitorStream` blocks in it, so the two differ in nothing else.
    """

    def __init__(
        self,
        target: str | os.PathLike[str],
        snapshot_endpoint: str | None,
        curve: CurveClientConfig | None,
        rcvhwm: int,
        snapshot_timeout: float,
        warmup_timeout: float,
    ) -> None:
        self.endpoint, self.snapshot_endpoint = _resolve_target(target, snapshot_endpoint)
        self.curve = curve
        self.rcvhwm = rcvhwm
        self.snapshot_timeout = snapshot_timeout
        self.warmup_timeout = warmup_timeout
        self._clone = _CloneState()
        self._ready: deque[MonitorItem] = deque()
        self._sub: Any = None  # the sockets the steps wait on (asyncio or blocking)
        self._snap: Any = None
        self._sub_io: zmq.Socket[bytes] | None = None  # their sync views, for non-blocking sends and receives
        self._snap_io: zmq.Socket[bytes] | None = None
        self._handshake: HandshakeWatch | None = None  # CurveZMQ: a refusal is told at once (bus/handshake.py)

    @property
    def gaps(self) -> int:
        return self._clone.gaps

    @property
    def snapshots(self) -> int:
        return self._clone.snapshots

    @property
    def restarts(self) -> int:
        """Times the publisher changed (root restarted) under this client."""
        return self._clone.restarts

    @property
    def seq(self) -> int | None:
        """Seq of the last snapshot or event delivered."""
        return self._clone.last

    def _open(self, ctx: zmq.Context[Any]) -> None:
        """Make, configure and connect the SUB and the snapshot DEALER."""
        sub = self._sub = ctx.socket(zmq.SUB)
        snap = self._snap = ctx.socket(zmq.DEALER)
        sub.setsockopt(zmq.RCVHWM, self.rcvhwm)
        for s in (sub, snap):
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.HEARTBEAT_IVL, 1000)
            s.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
            s.setsockopt(zmq.HEARTBEAT_TTL, 3000)
            if self.curve is not None:
                apply_curve_client(s, self.curve)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._sub_io, self._snap_io = zmq.Socket.shadow(sub.underlying), zmq.Socket.shadow(snap.underlying)
        if self.curve is not None:
            self._handshake = HandshakeWatch(sub, self.endpoint)
        sub.connect(self.endpoint)
        snap.connect(self.snapshot_endpoint)

    def _close(self) -> None:
        self._watched()
        for s in (self._sub, self._snap):
            if s is not None:
                s.close(linger=0)
        self._sub = self._snap = self._sub_io = self._snap_io = None

    def _no_snapshot(self) -> str:
        return (
            f"no snapshot from {self.snapshot_endpoint} within {self.snapshot_timeout:g}s: is the run's root "
            "supervisor alive (and, for tcp://, is this client's public key on its allow-list)?"
        )

    def _attach_steps(self) -> _Steps[Snapshot]:
        # Any frame (an event or an idle tick) proves the subscription reached the publisher; frames stay
        # queued in the SUB socket and are filtered against the snapshot's seq afterwards.
        if self._handshake is not None:
            refused = yield from self._handshake.steps(self.warmup_timeout)
            self._watched()
            if refused is not None:
                raise MonitorRefused(refused)
        yield self._sub, zmq.POLLIN, int(self.warmup_timeout * 1000)
        return (yield from self._snapshot_steps())

    def _watched(self) -> None:
        if self._handshake is not None:
            self._handshake.close()
            self._handshake = None

    def _snapshot_steps(self) -> _Steps[Snapshot]:
        """Ask for a snapshot and wait for the answer to this request (older answers are dropped)."""
        assert self._snap_io is not None
        request = self._clone.snapshot_request()
        deadline = time.monotonic() + self.snapshot_timeout
        sent = False
        while True:
            try:
                if not sent:
                    self._snap_io.send(request, zmq.NOBLOCK)
                    sent = True
                raw = self._snap_io.recv(zmq.NOBLOCK)
            except zmq.Again:
                # Without a connection (refused handshake, publisher gone) a send or an answer never comes.
                left = deadline - time.monotonic()
                if left <= 0 or not (yield self._snap, zmq.POLLIN if sent else zmq.POLLOUT, int(left * 1000) + 1):
                    raise MonitorError(self._no_snapshot()) from None
                continue
            snap = self._clone.on_snapshot_reply(raw)
            if snap is not None:
                return snap

    def _next_steps(self, timeout: float | None) -> _Steps[MonitorItem | None]:
        """The next item (a re-snapshot or an event), or None when nothing arrives within `timeout`."""
        assert self._sub_io is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._ready:
            try:
                raw = self._sub_io.recv(zmq.NOBLOCK)  # drain what is queued; wait only when empty
            except zmq.Again:
                wait_ms = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
                if not (yield self._sub, zmq.POLLIN, wait_ms):
                    return None
                continue
            events, resync = self._clone.on_frame(raw)
            self._ready.extend(events)
            if resync:
                self._ready.append((yield from self._snapshot_steps()))
        return self._ready.popleft()


def _run_blocking(steps: _Steps[_T]) -> _T:
    """Run a client's steps, blocking in each poll."""
    try:
        sock, flags, ms = next(steps)
        while True:
            sock, flags, ms = steps.send(sock.poll(ms, flags))
    except StopIteration as done:
        return cast(_T, done.value)


async def _run_async(steps: _Steps[_T]) -> _T:
    """Run a client's steps, awaiting each poll."""
    try:
        sock, flags, ms = next(steps)
        while True:
            sock, flags, ms = steps.send(await sock.poll(ms, flags))
    except StopIteration as done:
        return cast(_T, done.value)


class MonitorClient(_CloneClient):
    """Async Clone-pattern client: `attach()` then iterate for Snapshot / MonitorEvent items."""

    def __init__(
        self,
        target: str | os.PathLike[str],
        *,
        snapshot_endpoint: str | None = None,
        curve: CurveClientConfig | None = None,
        rcvhwm: int = 100_000,
        snapshot_timeout: float = 5.0,
        warmup_timeout: float = 2.0,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        super().__init__(target, snapshot_endpoint, curve, rcvhwm, snapshot_timeout, warmup_timeout)
        self._ctx = context

    async def attach(self) -> Snapshot:
        """Subscribe, wait for the subscription to be live, and return the first snapshot."""
        ctx = self._ctx = self._ctx or zmq.asyncio.Context.instance()
        try:
            self._open(ctx)
            return await _run_async(self._attach_steps())
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        self._close()

    async def next(self, timeout: float | None = None) -> MonitorItem | None:
        """The next item (a re-snapshot or an event), or None when nothing arrives within `timeout`."""
        if self._sub is None:
            raise MonitorError("call attach() first")
        if self._ready:
            return self._ready.popleft()
        return await _run_async(self._next_steps(timeout))

    async def __aiter__(self) -> AsyncIterator[MonitorItem]:
        while True:
            item = await self.next()
            if item is not None:
                yield item


class MonitorStream(_CloneClient):
    """Blocking Clone-pattern client for the CLI: iterate for Snapshot then MonitorEvent items."""

    def __init__(
        self,
        target: str | os.PathLike[str],
        *,
        snapshot_endpoint: str | None = None,
        curve: CurveClientConfig | None = None,
        rcvhwm: int = 100_000,
        snapshot_timeout: float = 5.0,
        warmup_timeout: float = 2.0,
        idle_timeout: float | None = None,
    ) -> None:
        super().__init__(target, snapshot_endpoint, curve, rcvhwm, snapshot_timeout, warmup_timeout)
        self.idle_timeout = idle_timeout
        try:
            self._open(zmq.Context.instance())
            self._ready.append(_run_blocking(self._attach_steps()))
        except BaseException:
            self.close()
            raise

    def next(self, timeout: float | None = None) -> MonitorItem | None:
        """The next item, or None when nothing arrives within `timeout` seconds."""
        if self._ready:
            return self._ready.popleft()
        return _run_blocking(self._next_steps(timeout))

    def __iter__(self) -> Iterator[MonitorItem]:
        """Items until `idle_timeout` passes without one (forever when None)."""
        while True:
            item = self.next(self.idle_timeout)
            if item is None:
                return
            yield item

    def close(self) -> None:
        self._close()

    def __enter__(self) -> MonitorStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
