"""Helpers shared by the tests (import as `from tests.support import ...`)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol


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
