"""What the root reports outside any node's own lifecycle: a worker's problem (a failed cleanup, a hang), ledger
writes that keep waiting, a full disk under the ledger, a ledger server unreachable for longer than its bound. Each is a log line and a monitor event.

The ledger writer reports from its own thread; `Alarms` carries those reports to the root's event loop and never
blocks the writer (docs/architecture.md §5)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from loguru import logger

from legion.bus.protocol import LEDGER_DISK_FULL, LEDGER_STALL, NODE_PROBLEM
from legion.ledger import LedgerWriter
from legion.supervision.child_spec import MAX_DETAIL

WRITER_CLOSE_S = 30.0  # how long the root's close waits for its queued ledger writes to land

Publish = Callable[[str, dict[str, Any]], None]


class Alarms:
    """The root's alarm reports, published through `publish`; `on_disk_full` is called on the loop as well."""

    def __init__(self, publish: Publish, on_disk_full: Callable[[str], None] | None = None,
                 on_unreachable: Callable[[str], None] | None = None, unreachable_after: float = 60.0) -> None:
        self._publish = publish
        self._on_disk_full = on_disk_full
        self._on_unreachable = on_unreachable
        self.unreachable_after = unreachable_after
        self._loop: asyncio.AbstractEventLoop | None = None

    def writer(self, path: str, run_id: str | None) -> LedgerWriter:
        """The root's ledger writer, its stalls, full disk and unreachable server reported here."""
        return LedgerWriter(path, on_stall=self.ledger_stall, on_disk_full=self.ledger_disk_full, run_id=run_id,
                            on_unreachable=self.ledger_unreachable, unreachable_after=self.unreachable_after)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the writer thread's reports are carried to (the root's, once it starts)."""
        self._loop = loop

    def child_problem(self, node_id: str, what: str, detail: str) -> None:
        logger.warning("node {}: {} ({})", node_id, what, detail)
        self._publish(NODE_PROBLEM, {"node_id": node_id, "what": what, "detail": detail[:MAX_DETAIL]})

    def ledger_stall(self, seconds: float, detail: str) -> None:
        """The ledger writer has waited `seconds` (called on its thread)."""
        def report() -> None:
            logger.warning("ledger writes waiting for {:.1f}s: {}", seconds, detail)
            self._publish(LEDGER_STALL, {"seconds": round(seconds, 1), "detail": detail[:MAX_DETAIL]})

        self._on_loop(report)

    def ledger_disk_full(self, message: str) -> None:
        """The ledger's filesystem is full (called on the writer's thread)."""
        def report() -> None:
            self._publish(LEDGER_DISK_FULL, {"detail": message[:MAX_DETAIL]})
            if self._on_disk_full is not None:
                self._on_disk_full(message)

        self._on_loop(report)

    def ledger_unreachable(self, seconds: float, detail: str) -> None:
        """The ledger's server has been unreachable for longer than its bound (called on the writer's watchdog)."""
        def report() -> None:
            self._publish(LEDGER_STALL, {"seconds": round(seconds, 1), "detail": detail[:MAX_DETAIL]})
            if self._on_unreachable is not None:
                self._on_unreachable(detail)

        self._on_loop(report)

    @staticmethod
    async def close_writer(writer: LedgerWriter) -> None:
        """Drain the root's writer (nothing the run recorded is lost on a clean close); say what did not land."""
        with contextlib.suppress(Exception):
            if not await asyncio.to_thread(writer.close, WRITER_CLOSE_S):
                logger.error("ledger writes still queued at close were not recorded ({})", writer.disk_full or
                             f"the ledger stayed locked or unreachable; last error: {writer.last_error}")

    def _on_loop(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the root's loop, from another thread (dropped once the loop has closed)."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(fn)
