"""pidfds: pin a process so a recycled pid is never signalled, and observe its exit without polling.

`ProcessHandle` is the parent-side handle of one process we own the exit status of (an rpc worker
re-parented to the root): signals go through its pidfd, `await wait()` is woken by the event loop the
moment the process exits, and the status is collected with `waitid(P_PIDFD)` — no SIGCHLD handler
that could steal other exit statuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import select
import signal
import threading
import time
from collections.abc import Sequence

from legion.procs.table import ProcRef, is_alive

__all__ = ["UNKNOWN_EXIT", "ProcessHandle", "open_pidfds", "pidfd_exited", "poll_ms", "wait_exit"]

# exit status of a process whose status someone else reaped (should never happen: only we reap it)
UNKNOWN_EXIT = -256
_REPARENT_WAIT = 0.5
_POLL_MAX_MS = 2**31 - 1  # poll() takes a C int; longer waits are simply re-polled by the callers


def poll_ms(seconds: float | None) -> int | None:
    """poll() timeout: None blocks; otherwise whole ms, rounded up so short waits do not spin."""
    return None if seconds is None else min(_POLL_MAX_MS, max(0, math.ceil(seconds * 1000)))


def pidfd_exited(fd: int, timeout: float | None = 0.0) -> bool:
    """True once the process behind pidfd `fd` has exited (pidfds poll readable on exit).

    `timeout` seconds to wait for it (None = until it exits)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(poll_ms(timeout)))


def wait_exit(fds: Sequence[int], timeout: float) -> list[int]:
    """Block until every process behind `fds` exited or `timeout` passed; returns the pidfds still running."""
    deadline = time.monotonic() + timeout
    pending = list(fds)
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        poller = select.poll()
        for fd in pending:
            poller.register(fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(poll_ms(remaining))}
        pending = [fd for fd in pending if fd not in ready]
    return pending


def open_pidfds(procs: Sequence[ProcRef]) -> dict[ProcRef, int]:
    """Pin each still-live process with a pidfd; the identity check comes after the open."""
    fds: dict[ProcRef, int] = {}
    for ref in procs:
        try:
            fd = os.pidfd_open(ref.pid)
        except (ProcessLookupError, OSError):
            continue
        if is_alive(ref):
            fds[ref] = fd
        else:
            os.close(fd)
    return fds


class ProcessHandle:
    """A process whose exit status we own: pidfd, signals, exit observed by the event loop."""

    def __init__(self, pid: int, pidfd: int | None, create_time: float) -> None:
        self.pid = pid
        self.pgid = pid  # our processes call setsid() first thing after fork
        self.create_time = create_time
        self._pidfd = pidfd
        self._returncode: int | None = None if pidfd is not None else UNKNOWN_EXIT
        self._waiter: asyncio.Future[None] | None = None
        self._lock = threading.Lock()

    @property
    def ref(self) -> ProcRef:
        """The process as a sweepable ProcRef."""
        return ProcRef(pid=self.pid, pgid=self.pgid, create_time=self.create_time)

    @property
    def returncode(self) -> int | None:
        """Exit code once exited (negative = killed by that signal), else None."""
        self._poll()
        return self._returncode

    def is_alive(self) -> bool:
        return self.returncode is None

    def signal(self, sig: int) -> None:
        """Signal the process through its pidfd (never a recycled pid)."""
        if self._pidfd is None or self.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, OSError):
            signal.pidfd_send_signal(self._pidfd, sig)

    def _poll(self) -> None:
        if self._returncode is None and self._pidfd is not None and pidfd_exited(self._pidfd):
            self._collect()

    def _collect(self) -> None:
        with self._lock:
            if self._returncode is not None or self._pidfd is None:
                return
            res = None
            deadline = time.monotonic() + _REPARENT_WAIT
            while True:
                try:
                    res = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG)
                    break
                except ChildProcessError:
                    # a process that died within a millisecond of its fork may still be the child of
                    # the fork server's intermediate process; it re-parents to us as that exits
                    if time.monotonic() > deadline:
                        self._returncode = UNKNOWN_EXIT
                        return
                    time.sleep(0.001)
            if res is None:
                return
            self._returncode = -res.si_status if res.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else res.si_status

    def wait_blocking(self, timeout: float | None = None) -> int | None:
        """Block until the process exits (or timeout); returns its exit code or None."""
        if self._pidfd is not None and self._returncode is None:
            pidfd_exited(self._pidfd, timeout)
        return self.returncode

    async def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the process to exit; returns its exit code, or None if `timeout` passed first."""
        self._poll()
        if self._returncode is not None or self._pidfd is None:
            return self._returncode
        loop = asyncio.get_running_loop()
        if self._waiter is None or self._waiter.done() or self._waiter.get_loop() is not loop:
            self._waiter = loop.create_future()
            loop.add_reader(self._pidfd, self._on_exit, loop, self._waiter)
        try:
            await asyncio.wait_for(asyncio.shield(self._waiter), timeout)
        except TimeoutError:
            return None
        return self._returncode

    def _on_exit(self, loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[None]) -> None:
        if self._pidfd is not None:
            loop.remove_reader(self._pidfd)
        self._collect()
        if not waiter.done():
            waiter.set_result(None)

    def release_pidfd(self) -> None:
        """Close the pidfd (after collecting the exit status if there is one).

        Pending `wait()` callers are woken with the exit code, never cancelled: a retire often sees
        the exit (and closes) before the event loop ran the pidfd callback that other waiters share.
        A handle closed while its process still runs wakes them with None.
        """
        self._poll()  # collect the status while the pidfd can still name the process
        fd, self._pidfd = self._pidfd, None
        if fd is None:
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            with contextlib.suppress(Exception):
                waiter.get_loop().remove_reader(fd)
            with contextlib.suppress(RuntimeError):  # its loop is already closed: nobody can await it
                waiter.set_result(None)
        os.close(fd)
