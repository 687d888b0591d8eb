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
from legion.supervision.root import RootSupervisor
from legion.supervision.spawn import DEFAULT_PRELOAD

SESSION_PRELOAD = (*DEFAULT_PRELOAD, "legion.workers.session_worker")


class Until(Protocol):
    """A poll-until coroutine: `await until(cond, timeout, what)` returns the first truthy `cond()`."""

    def __call__(self, cond: Callable[[], Any], timeout: float = ..., what: str = ...) -> Awaitable[Any]: ...


async def until(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition", *,
                interval: float = 0.02, await_result: bool = False) -> Any:  # fmt: skip
    """Poll `cond` every `interval` s until it is truthy and return that value; fail naming `what` after
    `timeout` s. With `await_result`, an awaitable returned by `cond` is awaited first."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if await_result and inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


def poller(timeout: float, interval: float, *, await_result: bool = False) -> Until:
    """An `until` with this file's default timeout and poll interval (kept explicit per test module)."""

    async def bound(cond: Callable[[], Any], timeout: float = timeout, what: str = "condition") -> Any:
        return await until(cond, timeout, what, interval=interval, await_result=await_result)

    return bound


def events(ledger: Ledger, node_id: str, type: str | None = None) -> list[dict[str, Any]]:
    """The ledger events of `node_id` (of one `type` if given), each its data plus its type."""
    return [e.data | {"type": e.type} for e in ledger.events_after(0, node_id=node_id) if type in (None, e.type)]


def status(ledger: Ledger, node_id: str) -> str | None:
    """The ledger status of `node_id`, None when the node is unknown."""
    node = ledger.get_node(node_id)
    return node["status"] if node is not None else None


def make_session_root(base: Path, **kw: Any) -> RootSupervisor:
    """A RootSupervisor on `base`/run whose fork server preloads the session worker (heartbeat 0.5 s)."""
    return RootSupervisor(base / "run", preload=SESSION_PRELOAD, **{"heartbeat_interval": 0.5, **kw})


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
