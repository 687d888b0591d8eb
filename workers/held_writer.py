"""An rpc worker's ledger writer, opened only when a write cannot ride its session's settle.

An rpc worker hosts one session. Its ledger writes are its node's usage snapshots, its liveness stamps and
its transcript's settle-time sync. Opening a ledger writer costs the worker a SQLite connection, a thread,
~1.3 MB of private memory and, on its first commit, a directory fsync; each batch then costs a WAL fsync and
a syncfs. A session that answers in one go settles within moments of its last model call, and its settle
already goes to the root, which records the round's artifact in one batch that makes the transcript durable.

So a write submitted here is *held* for `hold` seconds before a writer is opened for it. If the session
settles meanwhile, the settle takes the held writes (`carry`): the newest usage snapshot travels in the
`agent_settled` event and the root records it with the round's artifact, after the same sync of the
transcript (docs/architecture.md §5, "Durability"). Once a writer was opened (a write outlived the hold, or a
legion tool call waits on a write: `hurry`), nothing is carried any more: every write goes through it, in
order, as with a plain `LedgerWriter`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loguru import logger

if TYPE_CHECKING:
    from legion.ledger import Ledger, LedgerWriter


@dataclass
class _Held:
    fn: Callable[[Ledger], Any]
    what: str | None
    durable: tuple[str, ...]
    future: Future[Any]


class HeldWriter:
    """The subset of `LedgerWriter` a `SessionService` uses, over a writer opened on first need."""

    def __init__(self, open_writer: Callable[[], LedgerWriter], hold: float) -> None:
        self._open_writer = open_writer  # blocking: run in a thread
        self.hold = hold
        self._writer: LedgerWriter | None = None
        self._opening: asyncio.Task[None] | None = None
        self._held: dict[object, _Held] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._hurried = False
        self._closed = False

    @property
    def opened(self) -> bool:
        """A writer was opened, or is being opened: writes go through it, none is carried any more."""
        return self._opening is not None

    def submit_latest(self, key: object, fn: Callable[[Ledger], Any], what: str | None = None, *,
                      durable: Iterable[str | os.PathLike[str]] = ()) -> Future[Any]:
        """`LedgerWriter.submit_latest`: held (and coalesced by `key`) until the writer is open."""
        if self._closed:
            # imported here: the writer's module imports SQLAlchemy, which importing this module need not
            from legion.ledger.writer import WriterClosedError

            raise WriterClosedError(f"this worker's ledger writer is closed; {what or 'a write'} was not queued")
        if self._writer is not None:
            return self._writer.submit_latest(key, fn, what, durable=durable)
        files = tuple(os.fspath(p) for p in durable)
        held = self._held.get(key)
        if held is None:
            held = self._held[key] = _Held(fn, what, files, Future())
        else:
            held.fn, held.what, held.durable = fn, what or held.what, tuple(dict.fromkeys(held.durable + files))
        if self._opening is None and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.hold, self._open)
        return held.future

    def carry(self, keys: Iterable[object]) -> bool:
        """A settle takes these held writes to the root: they are dropped here and their futures cancelled (they
        never land from this process). False, taking nothing, once a writer was opened."""
        if self._opening is not None:
            return False
        for key in keys:
            held = self._held.pop(key, None)
            if held is not None:
                held.future.cancel()
        if not self._held and self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return True

    def hurry(self) -> None:
        """Someone waits on a write: open the writer now (no carrying), and end its batch's linger."""
        self._hurried = True
        if self._writer is not None:
            self._writer.hurry()
        elif self._held:
            self._open()

    @property
    def disk_full(self) -> str | None:
        return self._writer.disk_full if self._writer is not None else None

    @property
    def last_error(self) -> str:
        return self._writer.last_error if self._writer is not None else ""

    @property
    def pending(self) -> int:
        return len(self._held) + (self._writer.pending if self._writer is not None else 0)

    async def aclose(self, timeout: float | None = 30.0) -> bool:
        """Land what is held (opening the writer for it), then close the writer. False if writes were left."""
        self._closed = True
        if self._held:
            self._open()
        if self._opening is not None:
            await asyncio.shield(self._opening)
        if self._writer is None:
            return not self._held
        return await self._writer.aclose(timeout)

    def _open(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._opening is None:
            self._opening = asyncio.get_running_loop().create_task(self._opened(), name="ledger-writer-open")

    async def _opened(self) -> None:
        try:
            writer = await asyncio.to_thread(self._open_writer)
        except Exception as exc:  # the ledger cannot be opened: the held writes fail (the transcript keeps usage)
            logger.warning("this worker's ledger writer could not be opened: {!r}", exc)
            held, self._held = self._held, {}
            for entry in held.values():
                entry.future.set_exception(exc)
            self._opening = None  # a later write tries again
            return
        self._writer = writer
        held, self._held = self._held, {}
        for key, entry in held.items():
            _chain(writer.submit_latest(key, entry.fn, entry.what, durable=entry.durable), entry.future)
        if self._hurried:
            writer.hurry()


def _chain(inner: Future[Any], outer: Future[Any]) -> None:
    """Resolve `outer` as `inner` resolves (from the writer thread)."""

    def copy(done: Future[Any]) -> None:
        if outer.done():
            return
        if done.cancelled():
            outer.cancel()
        elif done.exception() is not None:
            outer.set_exception(done.exception())
        else:
            outer.set_result(done.result())

    inner.add_done_callback(copy)
