"""A cross-process FIFO-ish write gate in front of SQLite's BEGIN IMMEDIATE.

Why: SQLite's busy handler polls with growing sleeps (1, 2, 5 … 100 ms), so under saturation a
writer that keeps losing the race can starve past busy_timeout while others commit. Writers here
first take an exclusive `flock` on a sidecar file (`<db>-writelock`); the kernel queues blocked
requests and wakes the next one on release, without polling, so at most one writer at a time
reaches BEGIN IMMEDIATE and it almost never sees SQLITE_BUSY. Correctness does not depend on the
gate (BEGIN IMMEDIATE still serialises writers; a writer that bypasses the gate just competes
through busy_timeout), and a dead holder's lock is released by the kernel when its fd closes.

`flock` locks belong to an open file description, so several ledgers in one process exclude each
other too; a threading lock orders threads of one process before they reach the kernel lock.
One gate object is shared per (process, lock path): re-entrant on the same thread, so a thread
that opens two ledgers on one file cannot deadlock itself on the gate.
"""

from __future__ import annotations

import fcntl
import os
import threading
from typing import ClassVar


class WriteGate:
    """Exclusive, re-entrant (per thread) cross-process write lock on a sidecar file."""

    _registry: ClassVar[dict[tuple[int, str], WriteGate]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, lock_path: str) -> None:
        self.lock_path = lock_path
        self._thread_lock = threading.RLock()
        self._fd: int | None = None
        self._depth = 0
        self._users = 0

    @classmethod
    def shared(cls, lock_path: str) -> WriteGate:
        """The process-wide gate for this lock file (a forked child gets its own)."""
        key = (os.getpid(), os.path.realpath(lock_path))
        with cls._registry_lock:
            gate = cls._registry.get(key)
            if gate is None:
                gate = cls(key[1])
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

    def acquire(self) -> None:
        """Block until this process holds the gate (kernel-queued, no polling)."""
        self._thread_lock.acquire()
        if self._depth == 0:
            try:
                if self._fd is None:
                    self._fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except BaseException:
                self._thread_lock.release()
                raise
        self._depth += 1

    def release(self) -> None:
        """Release one level; the outermost release hands the lock to the next waiter."""
        self._depth -= 1
        try:
            if self._depth == 0 and self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                # Why: a writer that loops straight back into acquire() would usually re-take the
                # lock before the woken waiter is scheduled (barging). Yielding once lets the
                # waiter run first, which keeps the queue closer to FIFO; it costs ~1 us when no
                # one is waiting.
                os.sched_yield()
        finally:
            self._thread_lock.release()


class NullGate:
    """The gate of a private (:memory:) database: only threads of this process can contend."""

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def acquire(self) -> None:
        self._lock.acquire()

    def release(self) -> None:
        self._lock.release()

    def release_user(self) -> None:
        """Nothing to close."""
