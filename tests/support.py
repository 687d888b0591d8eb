"""Helpers shared by the tests (import as `from tests.support import ...`)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from legion.ledger.ledger import Ledger
from legion.orchestration.preload import (
    SESSION_PRELOAD as SESSION_PRELOAD,  # the session tests' roots preload it too
)
from legion.supervision.root import RootSupervisor


class Until(Protocol):
    """`until` with a module's own default deadline and interval bound (see `poller`)."""

    def __call__(self, predicate: Callable[[], Any], deadline: float = ..., message: str = ...) -> Awaitable[Any]: ...


class _Poll:
    """The one polling loop behind `until` and `wait_until`: the attempts, the deadline and the failure."""

    def __init__(self, deadline: float, interval: float, message: str) -> None:
        if deadline <= 0 or interval <= 0:
            raise ValueError(f"poll deadline and interval must be > 0 s, got {deadline} and {interval}")
        self.deadline, self.interval, self.message = deadline, interval, message
        self.expires = time.monotonic() + deadline

    def check(self, value: Any) -> bool:
        """True when `value` ends the poll; raises once the deadline has passed without it."""
        if value:
            return True
        if time.monotonic() > self.expires:
            raise AssertionError(f"timed out after {self.deadline}s waiting for {self.message}")
        return False


async def until(predicate: Callable[[], Any], deadline: float = 10.0, message: str = "condition", *,
                interval: float = 0.02, await_result: bool = False) -> Any:  # fmt: skip
    """Poll `predicate` every `interval` s until it is truthy and return that value; fail with an
    AssertionError naming `message` once `deadline` s have passed. The predicate is checked once more
    after the deadline, so a slow last attempt is not lost. With `await_result`, an awaitable returned
    by `predicate` is awaited first. (For synchronous code, `wait_until` is the same loop.)"""
    poll = _Poll(deadline, interval, message)
    while True:
        value = predicate()
        if await_result and inspect.isawaitable(value):
            value = await value
        if poll.check(value):
            return value
        await asyncio.sleep(interval)


def wait_until(predicate: Callable[[], Any], deadline: float = 10.0, message: str = "condition", *,
               interval: float = 0.02) -> Any:  # fmt: skip
    """`until` for synchronous code: blocks the calling thread between attempts (never inside a loop)."""
    poll = _Poll(deadline, interval, message)
    while True:
        value = predicate()
        if poll.check(value):
            return value
        time.sleep(interval)


def poller(deadline: float, interval: float, *, await_result: bool = False) -> Until:
    """`until` with a module's default deadline and interval bound (kept explicit per test module)."""

    async def bound(predicate: Callable[[], Any], deadline: float = deadline, message: str = "condition") -> Any:
        return await until(predicate, deadline, message, interval=interval, await_result=await_result)

    return bound


class TmuxPane:
    """A detached tmux session running one command, on a tmux server of its own (`tmux -S`, its socket removed at
    `close`): tests running side by side never share a server, so one test's last `kill-session` (which ends the
    default server) cannot end another test's session while it starts ("server exited unexpectedly")."""

    def __init__(self, command: str, width: int, height: int) -> None:
        self.socket = Path(tempfile.gettempdir()) / f"legion-tmux-{os.getpid()}-{time.monotonic_ns()}"
        self.session = "t"
        self._run("new-session", "-d", "-s", self.session, "-x", str(width), "-y", str(height), command, check=True)

    def _run(self, *args: str, check: bool = False) -> str:
        done = subprocess.run(["tmux", "-S", str(self.socket), *args], capture_output=True, text=True, timeout=10)
        if check and done.returncode != 0:
            raise RuntimeError(f"tmux {args[0]} failed (exit {done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def capture(self, *, escapes: bool = False) -> str:
        """The pane's visible text (with its colour escapes when `escapes`)."""
        return self._run("capture-pane", "-p", *(["-e"] if escapes else []), "-t", self.session)

    def send_keys(self, *keys: str) -> None:
        self._run("send-keys", "-t", self.session, *keys, check=True)

    def resize(self, width: int, height: int) -> None:
        self._run("resize-window", "-t", self.session, "-x", str(width), "-y", str(height))

    def close(self) -> None:
        self._run("kill-server")
        self.socket.unlink(missing_ok=True)

    def __enter__(self) -> TmuxPane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie. Its /proc entry can vanish between the open and the read while it
    is reaped (ProcessLookupError): that is dead too."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def events(ledger: Ledger, node_id: str, type: str | None = None) -> list[dict[str, Any]]:
    """The ledger events of `node_id` (of one `type` if given), each its data plus its type."""
    return [e.data | {"type": e.type} for e in ledger.events_after(0, node_id=node_id) if type in (None, e.type)]


def status(ledger: Ledger, node_id: str) -> str | None:
    """The ledger status of `node_id`, None when the node is unknown."""
    node = ledger.get_node(node_id)
    return node["status"] if node is not None else None


def make_session_root(base: Path, **kw: Any) -> RootSupervisor:
    """A RootSupervisor on `base`/run whose fork server preloads the session worker (heartbeat 0.5 s, hung after
    3 silent intervals: a test of a loop that must never freeze keeps a sharp limit)."""
    return RootSupervisor(base / "run", preload=SESSION_PRELOAD, **{"heartbeat_interval": 0.5, "hang_misses": 3, **kw})


@contextlib.contextmanager
def small_filesystem(size: str = "5m") -> Iterator[Path]:
    """A fresh tmpfs of `size` under /tmp (root only: the test is skipped, saying why, elsewhere)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    where = Path(tempfile.mkdtemp(prefix="ldf", dir="/tmp"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        where.rmdir()
        pytest.skip(f"mount -t tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)
        shutil.rmtree(where, ignore_errors=True)
