"""Each session's own executor for tool work that may spin or block.

A pool worker hosts many sessions in one process on one event loop, so a tool's work must never run
where it cannot be stopped: a regular expression that backtracks holds the GIL inside one ``re`` call,
and a ``read()`` of a kernel stream or a hung mount never returns. A thread can be neither killed nor
interrupted, and an abandoned one stays in the pool's default executor for good (six of them and every
other session's ``asyncio.to_thread`` waits). So:

- File-tool work runs in a **helper process** (``python -I -S fileops.py``, standard library only) that
  leads its own process group: the call's hard deadline, or an abort, SIGKILLs the group. The helper is
  kept warm between calls (one idle helper per session, closed after ``IDLE_SECONDS``), so a call costs
  a pipe round trip, not a process start; its start is not counted against the call's deadline (as for
  ``bash``, whose timer starts after its exec). The helper's process group is in ``ToolContext.pgids``
  while it lives, so the session's retire and the root's post-crash sweep reach it.
- A session runs at most ``MAX_HELPERS`` helpers at once, and its short thread work (``bash``'s scan
  for leftover processes) runs on its own ``THREADS``-thread executor, never the process's default
  one: one session cannot starve another.
- The parent talks to a helper with non-blocking pipes watched by the event loop: the loop never waits
  on a helper, and a helper from an earlier event loop (tests) is still usable, as no transport is bound
  to a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from legion.workers.tools import fileops

HELPER = Path(fileops.__file__)
MAX_HELPERS = 2  # helper processes one session may run at once (its tool calls run one at a time)
THREADS = 2  # threads of one session's executor for short blocking work
IDLE_SECONDS = 30.0  # an idle helper is closed after this
START_TIMEOUT_S = 30.0  # a helper that is not ready by then is killed and the call fails
_MAX_FRAME = 256 * 1024 * 1024  # a reply larger than this is a broken helper
_READ_CHUNK = 1024 * 1024
T = TypeVar("T")


class DeadlineExceeded(Exception):
    """The work did not finish by its hard deadline; its helper process was killed."""


class HelperFailed(Exception):
    """The helper process could not be started, or died, or broke the protocol."""


class _Helper:
    """One helper process: its pipes (non-blocking) and the pgid it leads."""

    def __init__(self, popen: subprocess.Popen[bytes], pgids: set[int]) -> None:
        assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
        self.popen = popen
        self.pgid = popen.pid  # start_new_session: it leads its own group
        self.pgids = pgids
        self.wfd, self.rfd, self.efd = popen.stdin.fileno(), popen.stdout.fileno(), popen.stderr.fileno()
        for fd in (self.wfd, self.rfd, self.efd):
            os.set_blocking(fd, False)
        self.buf = bytearray()
        self.idle_since = 0.0

    def kill(self) -> None:
        if self.popen.returncode is not None:  # reaped: its pgid may belong to someone else by now
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signal.SIGKILL)

    def close_pipes(self) -> None:
        for f in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
            with contextlib.suppress(OSError):
                f.close()  # type: ignore[union-attr]

    def reaped(self) -> bool:
        """Collect the exit status if the helper is gone (never blocks); True once it is."""
        if self.popen.poll() is None:
            return False
        self.pgids.discard(self.pgid)
        return True

    def stderr_tail(self) -> str:
        try:
            data = os.read(self.efd, 4096)
        except OSError:
            return ""
        return data.decode("utf-8", "replace").strip()[-500:]


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, write: bool) -> None:
    """Until ``fd`` is readable (or writable); the watch is removed however the wait ends."""
    done = loop.create_future()

    def wake() -> None:
        if not done.done():
            done.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await done
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


async def _send(helper: _Helper, body: bytes) -> None:
    loop = asyncio.get_running_loop()
    view = memoryview(len(body).to_bytes(4, "big") + body)
    while view:
        try:
            view = view[os.write(helper.wfd, view):]
        except BlockingIOError:
            await _ready(loop, helper.wfd, write=True)
        except BrokenPipeError:
            raise HelperFailed(f"the helper process exited: {helper.stderr_tail() or 'no message'}") from None


async def _receive(helper: _Helper) -> bytes:
    """One frame's body."""
    loop = asyncio.get_running_loop()
    buf = helper.buf
    while True:
        if len(buf) >= 4:
            size = int.from_bytes(buf[:4], "big")
            if size > _MAX_FRAME:
                raise HelperFailed(f"the helper process sent a {size}-byte frame")
            if len(buf) >= 4 + size:
                body = bytes(buf[4:4 + size])
                del buf[:4 + size]
                return body
        try:
            chunk = os.read(helper.rfd, _READ_CHUNK)
        except BlockingIOError:
            await _ready(loop, helper.rfd, write=False)
            continue
        if not chunk:
            raise HelperFailed(f"the helper process exited: {helper.stderr_tail() or 'no message'}")
        buf += chunk


class ToolExecutor:
    """A session's bounded place for tool work that may spin or block (see the module doc)."""

    def __init__(self) -> None:
        self._idle: list[_Helper] = []
        self._dying: list[_Helper] = []
        self._busy: set[_Helper] = set()
        self._slots: asyncio.Semaphore | None = None
        self._slots_loop: asyncio.AbstractEventLoop | None = None
        self._threads: ThreadPoolExecutor | None = None
        self._expiry: asyncio.TimerHandle | None = None
        self._collector: asyncio.TimerHandle | None = None
        self._closed = False

    # ---- helper processes -----------------------------------------------------------------------

    async def call(self, pgids: set[int], request: dict[str, Any], hard_timeout: float, *,
                   idempotent: bool = True) -> dict[str, Any]:
        """Send ``request`` to a helper and return its reply; at ``hard_timeout`` s (counted once the
        helper is ready) or on cancellation the helper's process group is killed. An idle helper found
        dead when used (killed meanwhile, e.g. by the OOM killer) is replaced once if ``idempotent``."""
        if self._closed:
            raise HelperFailed("the session's tool executor is closed")
        async with self._semaphore():
            self._collect()
            helper = self._take()
            if helper is not None:
                if not idempotent:
                    return await self._on(helper, request, hard_timeout)
                try:
                    return await self._on(helper, request, hard_timeout)
                except HelperFailed:
                    pass  # it died while idle: one fresh helper
            return await self._on(await self._start(pgids), request, hard_timeout)

    async def _on(self, helper: _Helper, request: dict[str, Any], hard_timeout: float) -> dict[str, Any]:
        """One exchange with ``helper``: given back when it answered, killed otherwise."""
        self._busy.add(helper)
        ok = False
        try:
            body = json.dumps(request).encode()
            try:
                reply = await asyncio.wait_for(self._exchange(helper, body), hard_timeout)
            except TimeoutError:
                raise DeadlineExceeded from None
            ok = True
            return reply
        finally:
            self._busy.discard(helper)
            if ok:
                self._give_back(helper)
            else:  # timed out, aborted or broken: it may still be spinning or blocked
                self._discard(helper)

    @staticmethod
    async def _exchange(helper: _Helper, body: bytes) -> dict[str, Any]:
        await _send(helper, body)
        reply = json.loads(await _receive(helper))
        if not isinstance(reply, dict):
            raise HelperFailed(f"the helper process sent {type(reply).__name__}, not an object")
        return reply

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:
            self._slots, self._slots_loop = asyncio.Semaphore(MAX_HELPERS), loop
        return self._slots

    def _take(self) -> _Helper | None:
        while self._idle:
            helper = self._idle.pop()
            if helper.popen.poll() is None:
                return helper
            self._discard(helper)
        return None

    async def _start(self, pgids: set[int]) -> _Helper:
        try:
            popen = subprocess.Popen([sys.executable, "-I", "-S", str(HELPER)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/",
                                     start_new_session=True, close_fds=True)
        except OSError as exc:
            raise HelperFailed(f"cannot start a helper process: {exc.strerror or exc}") from exc
        helper = _Helper(popen, pgids)
        pgids.add(helper.pgid)
        try:
            ready = await asyncio.wait_for(_receive(helper), START_TIMEOUT_S)
        except TimeoutError:
            self._discard(helper)
            raise HelperFailed(f"the helper process was not ready within {START_TIMEOUT_S:g} s") from None
        except BaseException:
            self._discard(helper)
            raise
        if ready:
            self._discard(helper)
            raise HelperFailed("the helper process did not start with an empty frame")
        return helper

    def _give_back(self, helper: _Helper) -> None:
        if self._closed or self._idle:  # one warm helper per session is enough: calls run one at a time
            helper.close_pipes()  # EOF: it exits by itself
            self._dying.append(helper)
            self._collect()
            return
        loop = asyncio.get_running_loop()
        helper.idle_since = loop.time()
        self._idle.append(helper)
        if self._expiry is None:
            self._expiry = loop.call_later(IDLE_SECONDS, self._expire)

    def _expire(self) -> None:
        """Close the helper idle for ``IDLE_SECONDS``; re-arm for one idle for less."""
        self._expiry = None
        loop = asyncio.get_running_loop()
        keep = []
        for helper in self._idle:
            if loop.time() - helper.idle_since >= IDLE_SECONDS - 0.01:
                helper.close_pipes()  # EOF: it exits by itself
                self._dying.append(helper)
            else:
                keep.append(helper)
        self._idle = keep
        if self._idle:
            self._expiry = loop.call_later(IDLE_SECONDS, self._expire)
        self._collect()

    def _discard(self, helper: _Helper) -> None:
        """Kill a helper that may be spinning or blocked, and close our ends of its pipes."""
        helper.kill()
        helper.close_pipes()
        self._dying.append(helper)
        self._collect()

    def _collect(self, delay: float = 0.01) -> None:
        """Reap helpers that exited (their process groups leave the session's set); while some have
        not, look again later, less and less often."""
        self._dying = [h for h in self._dying if not h.reaped()]
        if self._dying and self._collector is None:
            with contextlib.suppress(RuntimeError):  # no running loop: collected at the next call
                self._collector = asyncio.get_running_loop().call_later(delay, self._recollect, delay)

    def _recollect(self, delay: float) -> None:
        self._collector = None
        self._collect(min(1.0, delay * 2))

    @property
    def helpers(self) -> int:
        """Live helper processes (idle, busy or not yet reaped)."""
        self._collect()
        return len(self._idle) + len(self._busy) + len(self._dying)

    # ---- threads --------------------------------------------------------------------------------

    async def thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run short blocking work on this session's own threads (never the process's default executor)."""
        if self._threads is None:
            self._threads = ThreadPoolExecutor(THREADS, thread_name_prefix="session-tools")
        return await asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    # ---- the end --------------------------------------------------------------------------------

    async def aclose(self, timeout: float = 2.0) -> None:
        """Kill every helper and wait (at most ``timeout`` s) until they are reaped; stop the threads."""
        self._closed = True
        for handle in (self._expiry, self._collector):
            if handle is not None:
                handle.cancel()
        self._expiry = self._collector = None
        for helper in self._busy:
            helper.kill()  # its call ends with it (and closes its pipes)
        for helper in self._idle:
            self._discard(helper)
        self._idle.clear()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (self._dying or self._busy) and loop.time() < deadline:
            await asyncio.sleep(0.01)
            self._dying = [h for h in self._dying if not h.reaped()]
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None
