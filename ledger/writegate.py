"""A cross-process FIFO-ish write gate in front of SQLite's BEGIN IMMEDIATE.

Why: SQLite's busy handler polls with growing sleeps (1, 2, 5 … 100 ms), so under saturation a
writer that keeps losing the race can starve past busy_timeout while others commit. Writers here
first take an exclusive `flock` on a sidecar file (`<db>-writelock`); the kernel queues blocked
requests and wakes the next one on release, without polling, so at most one gated writer at a time
reaches BEGIN IMMEDIATE and it almost never sees SQLITE_BUSY.

The gate is an optimisation, never a new way to fail or hang:
- correctness does not depend on it (BEGIN IMMEDIATE still serialises writers, and a writer that
  bypasses the gate just competes through busy_timeout);
- a dead holder's lock is released by the kernel when its fd closes;
- waiting is bounded: after `timeout` seconds a waiter gives up on the gate and proceeds to
  BEGIN IMMEDIATE, where SQLite's busy_timeout bounds the rest. So a stopped or hung holder
  (SIGSTOP, a debugger) costs the others at most timeout + busy_timeout, as without a gate, and
  never a deadlock (a supervisor blocked forever in a ledger write could not kill the culprit).

How the wait is bounded (a blocking `flock` has no timeout): an uncontended acquire is one
non-blocking `flock`. A contended one in the main thread blocks in `flock` itself under a one-shot
`ITIMER_REAL` whose SIGALRM handler interrupts it (PEP 475 lets a raising handler abort the
syscall); the previous handler is restored at once. This is used only while nobody else uses
SIGALRM or ITIMER_REAL. Elsewhere (other threads, or SIGALRM in use) a short-lived helper thread
blocks in `flock` on its own fd and hands the lock over: correct and bounded, but the thread
handoff costs throughput (measured ~3x fewer tx/s under saturation), so it is the fallback only.

`flock` locks belong to an open file description, so several ledgers in one process exclude each
other too; a threading lock orders threads of one process first. One gate object is shared per
(process, lock path), re-entrant on the same thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import threading
from types import FrameType
from typing import ClassVar


class _GateTimeout(Exception):
    """Raised by the SIGALRM handler to abort a blocking flock."""


def _alarm_is_free() -> bool:
    """Only borrow SIGALRM/ITIMER_REAL from the main thread when nobody else uses them."""
    if threading.current_thread() is not threading.main_thread():
        return False
    return signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None) and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def _flock_with_alarm(fd: int, timeout: float) -> bool:
    """Blocking flock in the main thread, aborted after timeout; True when the lock is held."""
    waiting = [True]

    def on_alarm(_signum: int, _frame: FrameType | None) -> None:
        if waiting[0]:
            raise _GateTimeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            waiting[0] = False
            return True
        except _GateTimeout:
            waiting[0] = False
        # The alarm may have fired just after flock succeeded: holding it makes LOCK_NB succeed.
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
    finally:
        waiting[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class _Waiter:
    """One contended acquire: a helper thread blocks in flock on its own fd and hands the fd over."""

    def __init__(self, lock_path: str) -> None:
        self.lock_path = lock_path
        self.done = threading.Event()
        self.fd: int | None = None
        self.error: BaseException | None = None
        self.abandoned = False
        self.mutex = threading.Lock()

    def run(self) -> None:
        fd = -1
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException as exc:
            if fd >= 0:
                os.close(fd)
            self.error = exc
            self.done.set()
            return
        with self.mutex:
            if self.abandoned:  # the caller went ahead without the gate: pass the lock on at once
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                return
            self.fd = fd
        self.done.set()

    def wait(self, timeout: float) -> int | None:
        """The locked fd, or None after timeout (the helper then releases whatever it gets)."""
        self.done.wait(timeout)
        with self.mutex:
            if self.fd is None and self.error is None:
                self.abandoned = True
                return None
        if self.error is not None:
            raise self.error
        return self.fd


class WriteGate:
    """Exclusive, re-entrant (per thread), bounded-wait cross-process write lock on a sidecar file."""

    _registry: ClassVar[dict[tuple[int, str], WriteGate]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, lock_path: str, timeout: float = 5.0) -> None:
        self.lock_path = lock_path
        self.timeout = timeout
        self._thread_lock = threading.RLock()
        self._fd: int | None = None
        self._held_fd: int | None = None
        self._depth = 0
        self._users = 0
        self.timeouts = 0  # how often the gate was given up on (observability)

    @classmethod
    def shared(cls, lock_path: str, timeout: float = 5.0) -> WriteGate:
        """The process-wide gate for this lock file (a forked child gets its own)."""
        key = (os.getpid(), os.path.realpath(lock_path))
        with cls._registry_lock:
            gate = cls._registry.get(key)
            if gate is None:
                gate = cls(key[1], timeout)
                cls._registry[key] = gate
            gate._users += 1
            return gate

    def release_user(self) -> None:
        """Drop one user; the last one closes the lock file."""
        key = (os.getpid(), self.lock_path)
        with self._registry_lock:
            self._users -= 1
            if self._users > 0:
                return
            self._registry.pop(key, None)
        with self._thread_lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def acquire(self) -> bool:
        """Take the gate (True), or give up on it after `timeout` (False; the caller proceeds anyway)."""
        if not self._thread_lock.acquire(timeout=self.timeout):
            return False
        if self._depth == 0:
            try:
                held = self._take()
            except BaseException:
                self._thread_lock.release()
                raise
            if held is None:
                self.timeouts += 1
                self._thread_lock.release()
                return False
            self._held_fd = held
        self._depth += 1
        return True

    def _take(self) -> int | None:
        if self._fd is None:
            self._fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return self._fd
        except BlockingIOError:
            pass
        if self.timeout <= 0:
            return None
        if _alarm_is_free():
            return self._fd if _flock_with_alarm(self._fd, self.timeout) else None
        waiter = _Waiter(self.lock_path)
        threading.Thread(target=waiter.run, name="legion-ledger-writegate", daemon=True).start()
        return waiter.wait(self.timeout)

    def release(self) -> None:
        """Release one level; the outermost release hands the lock to the next waiter."""
        self._depth -= 1
        try:
            if self._depth == 0 and self._held_fd is not None:
                held, self._held_fd = self._held_fd, None
                fcntl.flock(held, fcntl.LOCK_UN)
                if held != self._fd:
                    os.close(held)
                # Why: a writer that loops straight back into acquire() would usually re-take the
                # lock before the woken waiter is scheduled (barging). Yielding once lets the
                # waiter run first, which keeps the queue closer to FIFO; it costs ~1 us when no
                # one is waiting.
                with contextlib.suppress(OSError):
                    os.sched_yield()
        finally:
            self._thread_lock.release()


class NullGate:
    """The gate of a private (:memory:) database: only threads of this process can contend."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def acquire(self) -> bool:
        self._lock.acquire()
        return True

    def release(self) -> None:
        self._lock.release()

    def release_user(self) -> None:
        """Nothing to close."""
