"""SessionHost: in-process hosting of many sessions with slots and an admission queue (docs/spec-conformance.md §2.5, §3.5).

- ``maxActive`` slots (``pool_limits`` derives 8 when the settings block exists without the key, 30
  without a block). A slot is held from admission until the session is retired.
- When all slots are busy, launches wait in a FIFO admission queue of at most ``maxQueuedLaunches``
  (32; beyond that a launch is refused with ``AdmissionError(code="QUEUE_FULL")``) for at most
  ``launchQueueTimeoutMs`` (15 min; then ``QUEUE_TIMEOUT``). Creating the session after admission has
  a 15 s start timeout (``START_TIMEOUT``; the slot is released again).
- Process events ``launch_queued`` / ``launch_admitted`` go to ``on_process_event(type, body)``.
- A retire disposes the one session (aborting its turn, sweeping its tool process groups, closing its
  transcript), releases its slot and broadcasts the release: every listener registered with
  ``subscribe_slot_released`` is called, and a listener that throws is logged and skipped — it never
  breaks the retire or the queue wake-up, which always runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger

from legion.bus.protocol import LAUNCH_ADMITTED, LAUNCH_QUEUED
from legion.codes import CANCELLED, CLOSED, DUPLICATE, QUEUE_FULL, QUEUE_TIMEOUT, START_FAILED, START_TIMEOUT
from legion.procs import ProcRef
from legion.workers.engine import AgentSession

SessionFactory = Callable[[], AgentSession | Awaitable[AgentSession]]
ProcessEventCallback = Callable[[str, dict[str, Any]], None]
SlotListener = Callable[[str], None]


@dataclass(frozen=True)
class PoolLimits:
    max_active: int = 30
    max_queued: int = 32
    queue_timeout_s: float = 900.0
    start_timeout_s: float = 15.0

    def __post_init__(self) -> None:
        if self.max_active < 1 or self.max_queued < 0 or self.queue_timeout_s <= 0 or self.start_timeout_s <= 0:
            raise ValueError(f"invalid pool limits {self}: inprocess.maxActive must be >= 1, maxQueuedLaunches "
                             ">= 0 and launchQueueTimeoutMs > 0")


def pool_limits(block: Mapping[str, Any] | None) -> PoolLimits:
    """Limits from an ``inprocess`` settings block (None = no block: maxActive 30; a block without it: 8)."""
    if block is None:
        return PoolLimits()

    def whole(key: str, default: int) -> int:
        value = block.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise ValueError(f"inprocess.{key} must be a whole number, got {value!r}")
        return int(value)

    return PoolLimits(max_active=whole("maxActive", 8), max_queued=whole("maxQueuedLaunches", 32),
                      queue_timeout_s=whole("launchQueueTimeoutMs", 900_000) / 1000)


class AdmissionError(Exception):
    """A launch was not admitted; ``code`` is QUEUE_FULL, QUEUE_TIMEOUT, START_TIMEOUT, START_FAILED,
    DUPLICATE, CANCELLED or CLOSED."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class SessionRetire:
    node_id: str
    found: bool
    survivors: list[ProcRef] = field(default_factory=list)
    was_queued: bool = False


@dataclass
class _Waiter:
    node_id: str
    future: asyncio.Future[None]
    queued_at: float
    token: object = field(default_factory=object)


class SessionHost:
    """Hosts sessions as asyncio tasks of one process; never spawns processes itself."""

    def __init__(self, limits: PoolLimits | None = None, *, on_process_event: ProcessEventCallback | None = None) -> None:
        self.limits = limits or PoolLimits()
        self.on_process_event = on_process_event
        self._sessions: dict[str, AgentSession] = {}
        # resolved transcript path -> node: the duplicate-transcript check is one lookup, not a resolve() of
        # every hosted session's path on every launch (its cost grew with the sessions hosted)
        self._by_transcript: dict[Path, str] = {}
        self._transcript_of: dict[str, Path] = {}
        self._slots: dict[str, object] = {}  # admitted node id -> admission token (starting or running)
        self._queue: deque[_Waiter] = deque()
        self._listeners: list[SlotListener] = []
        self._closed = False

    # ---- observation ---------------------------------------------------------------------------

    @property
    def active_count(self) -> int:
        return len(self._slots)

    @property
    def queued_count(self) -> int:
        return len(self._queue)

    def admission(self) -> dict[str, Any]:
        """Who holds a slot and who waits in the queue, with the limits: what a launch would meet now."""
        return {"slots": list(self._slots), "queued": [w.node_id for w in self._queue],
                "maxActive": self.limits.max_active, "maxQueued": self.limits.max_queued}

    def get(self, node_id: str) -> AgentSession | None:
        return self._sessions.get(node_id)

    def sessions(self) -> dict[str, AgentSession]:
        return dict(self._sessions)

    def transcript_user(self, transcript: Path) -> str | None:
        """The node whose hosted session appends to `transcript` (a resolved path), if any."""
        return self._by_transcript.get(transcript)

    def subscribe_slot_released(self, listener: SlotListener) -> Callable[[], None]:
        """Register a slot-release listener; returns an unsubscribe function."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._listeners.remove(listener)
        return unsubscribe

    # ---- launch --------------------------------------------------------------------------------

    async def launch(self, node_id: str, factory: SessionFactory) -> AgentSession:
        """Admit (possibly after queueing) and start one session; raise AdmissionError when refused."""
        if self._closed:
            raise AdmissionError(CLOSED, "the session host is shutting down; no new launches")
        if node_id in self._slots or any(w.node_id == node_id for w in self._queue):
            raise AdmissionError(DUPLICATE, f"a session for node {node_id!r} is already running or queued")
        token = await self._admit(node_id)
        try:
            session = await asyncio.wait_for(self._create(factory), self.limits.start_timeout_s)
        except TimeoutError:
            self._release_own(node_id, token)
            raise AdmissionError(START_TIMEOUT, f"session {node_id!r} did not start within "
                                 f"{self.limits.start_timeout_s:g} s; its slot was released") from None
        except Exception as exc:
            self._release_own(node_id, token)
            raise AdmissionError(START_FAILED, f"session {node_id!r} failed to start: "
                                 f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            self._release_own(node_id, token)
            raise
        if self._slots.get(node_id) is not token:  # retired (or the host closed) while it was starting
            await session.dispose(timeout=1.0)
            raise AdmissionError(CANCELLED, f"session {node_id!r} was retired while it was starting")
        self._sessions[node_id] = session
        path = Path(session.transcript_path).resolve()
        self._by_transcript[path] = node_id
        self._transcript_of[node_id] = path
        return session

    @staticmethod
    async def _create(factory: SessionFactory) -> AgentSession:
        made = factory()
        return await made if inspect.isawaitable(made) else made

    async def _admit(self, node_id: str) -> object:
        """Take a slot (waiting in the queue if needed); returns this admission's token."""
        if len(self._slots) < self.limits.max_active and not self._queue:
            token = self._slots[node_id] = object()
            return token
        if len(self._queue) >= self.limits.max_queued:
            raise AdmissionError(QUEUE_FULL, f"launch of {node_id!r} refused: the admission queue is full "
                                 f"({len(self._queue)} of maxQueuedLaunches {self.limits.max_queued} waiting, "
                                 f"{len(self._slots)} of maxActive {self.limits.max_active} running); retry "
                                 "after a child settles or raise inprocess.maxQueuedLaunches")
        waiter = _Waiter(node_id, asyncio.get_running_loop().create_future(), time.monotonic())
        self._queue.append(waiter)
        self._emit(LAUNCH_QUEUED, {"nodeId": node_id, "position": len(self._queue),
                                     "active": len(self._slots), "maxActive": self.limits.max_active})
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), self.limits.queue_timeout_s)
        except TimeoutError:
            if waiter in self._queue:
                self._queue.remove(waiter)
            if self._slots.get(node_id) is waiter.token:
                self._release(node_id)  # admitted in the same instant the timer fired: give the slot back
            raise AdmissionError(QUEUE_TIMEOUT, f"launch of {node_id!r} waited "
                                 f"{self.limits.queue_timeout_s:g} s in the admission queue without a free "
                                 f"slot (maxActive {self.limits.max_active}); retry later") from None
        except asyncio.CancelledError:
            if waiter in self._queue:
                self._queue.remove(waiter)
            elif self._slots.get(node_id) is waiter.token:
                self._release(node_id)
            raise
        self._emit(LAUNCH_ADMITTED, {"nodeId": node_id,
                                       "waitedMs": int((time.monotonic() - waiter.queued_at) * 1000)})
        return waiter.token

    def _wake_queue(self) -> None:
        while self._queue and len(self._slots) < self.limits.max_active:
            waiter = self._queue.popleft()
            if waiter.future.done():
                continue
            self._slots[waiter.node_id] = waiter.token
            waiter.future.set_result(None)

    # ---- retire --------------------------------------------------------------------------------

    async def retire(self, node_id: str, timeout: float = 5.0) -> SessionRetire:
        """Dispose one session (sweeping its tool process groups) and free its slot; a queued launch is
        cancelled instead. ``found`` is False for an unknown node; ``survivors`` lists tool processes
        the sweep could not kill."""
        for waiter in list(self._queue):
            if waiter.node_id == node_id:
                self._queue.remove(waiter)
                waiter.future.set_exception(AdmissionError(CANCELLED, f"launch of {node_id!r} was retired "
                                                           "while queued"))
                return SessionRetire(node_id, True, was_queued=True)
        session = self._pop_session(node_id)
        if session is None and node_id not in self._slots:
            return SessionRetire(node_id, False)
        survivors: list[ProcRef] = []
        try:
            if session is not None:
                survivors = await session.dispose(timeout=timeout)
        finally:
            self._release(node_id)
        return SessionRetire(node_id, True, survivors=survivors)

    def _release_own(self, node_id: str, token: object) -> None:
        """Release the slot only if it still belongs to this admission (not a newer one)."""
        if self._slots.get(node_id) is token:
            self._release(node_id)

    def _pop_session(self, node_id: str) -> AgentSession | None:
        path = self._transcript_of.pop(node_id, None)
        if path is not None and self._by_transcript.get(path) == node_id:
            del self._by_transcript[path]
        return self._sessions.pop(node_id, None)

    def _release(self, node_id: str) -> None:
        self._slots.pop(node_id, None)
        self._pop_session(node_id)
        for listener in list(self._listeners):
            try:
                listener(node_id)
            except Exception:  # a throwing listener must not break a retire
                logger.exception("slot-release listener failed after retiring {}", node_id)
        self._wake_queue()

    async def close(self, timeout: float = 5.0) -> None:
        """Refuse new launches, fail queued ones, retire every session."""
        self._closed = True
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.future.done():
                waiter.future.set_exception(AdmissionError(CLOSED, "the session host is shutting down"))
        # sessions still starting are retired too: their launch sees its slot gone and disposes them
        results = await asyncio.gather(*(self.retire(n, timeout) for n in list(self._slots)),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                logger.error("retire during close failed: {!r}", result)

    def _emit(self, type_: str, body: dict[str, Any]) -> None:
        if self.on_process_event is None:
            return
        try:
            self.on_process_event(type_, body)
        except Exception:  # observers never break admission
            logger.exception("process-event callback failed ({})", type_)
