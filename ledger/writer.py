"""LedgerWriter: one thread that owns a Ledger connection and commits queued writes in batches.

Why: a supervisor's event loop must never wait on SQLite. A write can block for the write gate's
timeout plus busy_timeout (5 s + 5 s) when another process holds the lock and is stopped (SIGSTOP,
a debugger), and one slow fsync stalls every heartbeat and reply. Here the loop only enqueues; the
writer thread does the waiting, retries what failed for a transient reason until it lands, and
reports a stall it cannot end.

    writer = LedgerWriter(run_dir / "legion.db", on_stall=report)   # opens its own Ledger, starts the thread

    # async code (e.g. the root's event loop): each caller awaits its own commit
    event_id = await writer.run(lambda led: led.append_event(node, "node_launched", {"pid": pid}))

    # sync code: fire and forget, or keep the Future and wait on it elsewhere
    fut = writer.submit(lambda led: led.set_status(node, "failed"), what="failed w1")

    # only the newest value matters (cumulative usage, a liveness stamp): one queued op per key
    writer.submit_latest(("usage", node), lambda led: led.upsert_usage(node, 10, 2, 0.01))

    # a file written beside the ledger (a transcript) is durable before the op's commit is (see "Durability")
    writer.submit_latest(("sync", path), lambda led: None, durable=(path,))

    writer.flush(timeout=5)   # block until everything submitted so far has landed (sync code only)
    writer.close(timeout=10)  # drain the queue, then close the connection; True when nothing was left
    await writer.aclose(10)   # the same from async code (the join runs in a thread, not on the loop)

An op is a plain callable `fn(ledger) -> T` (not a coroutine function: that fails the op with a
TypeError). It runs on the writer thread inside a `BEGIN IMMEDIATE`
transaction (`ledger.transaction()` inside it simply joins) and in its own SAVEPOINT, so:
- **Group commit:** the thread takes everything queued (up to `max_batch` ops) and commits it in one
  transaction: one gate acquisition, one COMMIT, one fsync.
- **Grouping** (`linger` seconds, default 0): a writer whose writes nobody waits on (a worker's liveness stamps
  and usage) lets the first op of a batch wait up to `linger` for more to join it, so a burst of sessions
  costs a few commits, not one each. `hurry()` (and `flush`) ends the wait at once, for a caller that
  waits on a write after all.
- **Durability of files:** an op may name files it depends on that were written but not synced: at
  submit (`durable=`: files already written, e.g. a settled session's transcript) or while it runs
  (`ledger.make_durable(path)`, e.g. `write_artifact`'s new file). The writer makes all of a batch's files
  durable with one `sync_paths` call (one syncfs per filesystem; `legion.procs.durable`): the submitted
  ones before BEGIN, the ones named inside the ops before COMMIT. So a committed row never names a file
  that a power loss can take back (docs/architecture.md §5, "Durability"). A failed sync retries the batch
  like any transient failure.
- **Order:** ops run in the order `submit` was called (one total order across all threads); each op
  sees the effects of every earlier op that succeeded. The future of an op that succeeded resolves
  only after its COMMIT is durable, in submit order; a reader on another connection sees the write
  once the future has resolved.
- **A failing op fails alone:** an op that raises a permanent error (an input error such as a
  LedgerError subclass, a constraint violation, a TypeError) is rolled back to its savepoint and its
  future fails at once with that exception; the other ops of the batch commit.
- **Transient failures are never dropped:** "database is locked"/busy, I/O errors, a full disk (see
  `is_transient`) roll the batch back and retry it with backoff (10 ms doubling to 1 s) until it
  lands; ops queued meanwhile join the retried batch behind it. So an op may run more than once;
  only its ledger effects of the final, committed run remain. Ops should touch only the ledger.
- **Stalls are reported:** when the oldest unlanded op has waited more than `stall_after` seconds
  (2 s) since the writer last made progress, `on_stall(seconds, detail)` is called once for that
  stall (again only after a batch has landed and a new stall begins). `seconds` is how long it has
  waited so far; `detail` is one human-readable line: how many writes wait, the oldest one's
  `what`, the attempts and last error, and who holds the locks, read from /proc/locks, e.g.
  "pid 4242 (python3, stopped) holds the write gate; pid 4242 (python3, stopped) holds SQLite's WAL
  write lock"; on PostgreSQL, from pg_stat_activity and pg_locks (pg_stall.py): the lock the writer's
  backend waits for and each blocking backend's pid, state, open transaction, wait event and query. `on_stall` runs on the writer's watchdog thread: from asyncio, hand it over with
  `loop.call_soon_threadsafe`; an exception it raises is logged. The stall and its end are also
  logged here (loguru).
- `submit` never blocks (a lock held only for an append) and is safe from any thread of the process
  that created the writer (a forked child gets WriterClosedError: it must open its own); the Ledger
  object itself is used only by the writer thread. `run` is shielded: cancelling the awaiting task
  does not cancel the write. A sync caller may `future.cancel()` an op still queued (it then never
  runs). Futures' done-callbacks run on the writer thread.
- **A full disk is its own condition** (ENOSPC, EDQUOT, SQLite's "database or disk is full"; see
  `is_disk_full`): waiting does not end it, someone must free space. The writer keeps the ops and
  retries as for any transient failure, but at the first such failure it says so at once, not after
  `stall_after` (and its watchdog finds a filesystem with no free space left within SPACE_CHECK_S, before
  any write fails): `on_disk_full(message)` (once per episode, on the writer thread; `message` names the
  filesystem and how much is free, from `space_report`), and `disk_full` holds the message until a
  batch lands again. Ops submitted in a `fail_fast()` context (a tool call that would otherwise wait
  for free space) are not kept: queued or in the rolled-back batch, they fail with DiskFullError, and
  new ones are refused with it while the disk is full. `close` then waits at most DISK_FULL_CLOSE_S.
- **A PostgreSQL server that goes away** (a restart, a dropped connection, a server refusing connections:
  `LedgerUnreachable`, ledger/pg_engine.py) is transient too: the batch is retried with the same backoff and
  jitter, each attempt on a fresh connection, and ops queue meanwhile. Each batch carries a request id that
  commits with it; when the connection drops during COMMIT (`CommitOutcomeUnknown`) the batch is frozen (nothing
  joins it) and, once the server answers, `request_applied` tells whether it landed: then its futures resolve
  with the results of that attempt and nothing runs twice; else it runs again. With `on_unreachable`, a writer
  whose server stays unreachable longer than `unreachable_after` seconds calls `on_unreachable(seconds, detail)`
  once per outage (on its watchdog thread): the root pauses the run (orchestration/run.py). Such a writer
  probes an idle server every `probe_every(unreachable_after)` seconds, so an outage is seen even when nothing
  else is written; after the report, `close` waits at most UNREACHABLE_CLOSE_S.
- `close(timeout)` refuses new ops (`submit` raises WriterClosedError), drains everything queued,
  closes the connection and returns True. If the queue cannot drain within `timeout` (the lock
  holder stays stopped), it returns False; the writer then fails the unlanded futures with
  WriterClosedError after its current attempt and closes the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import inspect
import os
import random
import sqlite3
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil
from loguru import logger

from legion.ledger.clock import Clock, now_ms
from legion.ledger.errors import CommitOutcomeUnknown, LedgerError, LedgerUnreachable, Refusal
from legion.ledger.ledger import Ledger, open_ledger
from legion.ledger.target import is_url
from legion.procs.durable import sync_paths

T = TypeVar("T")
OnStall = Callable[[float, str], object]
OnDiskFull = Callable[[str], object]
OnUnreachable = Callable[[float, str], object]

STALL_AFTER_S = 2.0
MAX_BATCH = 1000
_BACKOFF_FIRST_S = 0.01
_BACKOFF_MAX_S = 1.0
_SAVEPOINT = "legion_writer_op"
# SQLite primary result codes worth retrying: BUSY, LOCKED, NOMEM, IOERR, FULL, PROTOCOL.
_TRANSIENT_SQLITE = frozenset({5, 6, 7, 10, 13, 15})
# PostgreSQL: connection exceptions, insufficient resources, operator intervention (a restart); a serialisation
# failure, a deadlock and a lock timeout
_TRANSIENT_SQLSTATE_CLASSES = ("08", "53", "57")
_TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03"})
_TRANSIENT_TEXT = ("database is locked", "database is busy", "disk i/o error", "database or disk is full")
_TRANSIENT_ERRNO = frozenset({errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EAGAIN, errno.EINTR, errno.ENOMEM,
                              errno.EMFILE, errno.ENFILE})
_WAL_WRITE_LOCK_BYTE = "120"  # SQLite's WAL_WRITE_LOCK: byte 120 of the -shm file
_SQLITE_FULL = 13
_DISK_FULL_ERRNO = frozenset({errno.ENOSPC, errno.EDQUOT})
SPACE_CHECK_S = 1.0  # how often the watchdog looks at the free space of the ledger's filesystem
DISK_FULL_CLOSE_S = 3.0  # how long close waits for writes while the disk is full (only freed space ends it)
UNREACHABLE_CLOSE_S = 2.0  # how long close waits for writes once the server was reported unreachable
PROBE_MAX_S = 5.0  # the longest an idle writer with `on_unreachable` goes without touching its server
_fail_fast: contextvars.ContextVar[bool] = contextvars.ContextVar("legion_ledger_fail_fast", default=False)


class WriterClosedError(LedgerError):
    """The LedgerWriter is closed: the op was refused, or it could not land before close gave up."""


class DiskFullError(LedgerError):
    """The ledger's filesystem is full: a fail-fast op was refused or dropped (nothing of it was recorded)."""


@contextlib.contextmanager
def fail_fast() -> Iterator[None]:
    """Ops submitted inside (this task or thread, and tasks it starts) fail with DiskFullError on a full disk."""
    token = _fail_fast.set(True)
    try:
        yield
    finally:
        _fail_fast.reset(token)


def background_task(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task that outlives the call that starts it (a revive, a mail hand-over): its ledger writes are ordinary
    (kept on a full disk until space is freed), not fail-fast like the tool call that may have started it."""
    context = contextvars.copy_context()
    context.run(_fail_fast.set, False)
    return asyncio.get_running_loop().create_task(coro, context=context)


def is_disk_full(exc: BaseException) -> bool:
    """True for ENOSPC, EDQUOT and SQLITE_FULL ("database or disk is full"), anywhere in the cause chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _DISK_FULL_ERRNO:
            return True
        if isinstance(seen, sqlite3.Error):
            code = getattr(seen, "sqlite_errorcode", None)
            if (isinstance(code, int) and code & 0xFF == _SQLITE_FULL) or "database or disk is full" in str(seen).lower():
                return True
        seen = seen.__cause__
    return False


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _mount_point(path: str) -> str:
    here = os.path.realpath(path)
    dev = os.stat(here).st_dev
    while here != "/":
        parent = os.path.dirname(here)
        if os.stat(parent).st_dev != dev:
            break
        here = parent
    return here


def space_report(path: str | Path) -> str:
    """'the filesystem at /mnt (holding /mnt/x/legion.db) is full: 0 bytes of 5.0 MiB free' (best effort)."""
    target = str(path)
    folder = os.path.dirname(os.path.abspath(target)) or "."
    try:
        st = os.statvfs(folder)
        mount = _mount_point(folder)
    except OSError as exc:
        return f"the filesystem holding {target} is full (its free space is unknown: {exc.strerror})"
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    return f"the filesystem at {mount} (holding {target}) is full: {_size(free)} of {_size(total)} free"


def probe_every(unreachable_after: float) -> float:
    """How often a writer watching for an unreachable server probes it while idle."""
    return min(PROBE_MAX_S, max(0.05, unreachable_after / 4))


def _unreachable_reason(exc: BaseException) -> str:
    """Why the server could not be reached (the first LedgerUnreachable in the cause chain), '' if it could."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, LedgerUnreachable):
            return seen.reason
        seen = seen.__cause__
    return ""


def _one_transient(exc: BaseException) -> bool:
    if isinstance(exc, LedgerUnreachable):
        return True
    sqlstate = getattr(exc, "sqlstate", None)  # a psycopg error (PostgreSQL)
    if isinstance(sqlstate, str):
        return sqlstate.startswith(_TRANSIENT_SQLSTATE_CLASSES) or sqlstate in _TRANSIENT_SQLSTATES
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if isinstance(code, int):
            return (code & 0xFF) in _TRANSIENT_SQLITE
        return any(text in str(exc).lower() for text in _TRANSIENT_TEXT)
    return isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNO


def is_transient(exc: BaseException) -> bool:
    """True for failures that go away by waiting (lock contention, I/O errors, a full disk).

    A LedgerError is an input error (permanent) unless it wraps a transient SQLite/OS error.
    """
    seen: BaseException | None = exc
    while seen is not None:
        if _one_transient(seen):
            return True
        seen = seen.__cause__
    return False


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class _Relay:
    """Hands the writer's results to one event loop, a batch at a time: the first op of a batch to land schedules
    one call on the loop and the others join it (`asyncio.wrap_future` wakes the loop once per op: a self-pipe
    write, an epoll wake-up and a GIL hand-over each, at every op of every batch)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._landed: list[tuple[Callable[[Future[Any]], None], Future[Any]]] = []
        self._scheduled = False

    def when_done(self, inner: Future[T], then: Callable[[Future[T]], None]) -> None:
        """`then(inner)` on the loop once `inner` is resolved."""
        inner.add_done_callback(lambda done: self._done(then, done))

    def wrap(self, inner: Future[T]) -> asyncio.Future[T]:
        """An asyncio future of the loop that follows `inner`."""
        waiter: asyncio.Future[T] = self.loop.create_future()
        self.when_done(inner, lambda done: _copy_state(done, waiter))
        return waiter

    def _done(self, then: Callable[[Future[Any]], None], inner: Future[Any]) -> None:
        """In whichever thread resolved `inner` (the writer's, or the loop's when it was done already)."""
        with self._lock:
            self._landed.append((then, inner))
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            landed, self._landed = self._landed, []
            self._scheduled = False
        for then, inner in landed:
            try:
                then(inner)
            except Exception as exc:  # one caller's callback must not keep the batch's other results back
                logger.opt(exception=exc).error("ledger writer: a landed write's callback failed")


def _copy_state(inner: Future[T], waiter: asyncio.Future[T]) -> None:
    if waiter.done():
        return
    if inner.cancelled():
        waiter.cancel()
    elif (exc := inner.exception()) is not None:
        waiter.set_exception(exc)
    else:
        waiter.set_result(inner.result())


def _holder_name(pid: int) -> str:
    if pid == os.getpid():
        return f"pid {pid} (this process)"
    try:
        proc = psutil.Process(pid)
        return f"pid {pid} ({proc.name()}, {proc.status()})"
    except psutil.Error:
        return f"pid {pid}"


def lock_holders(db_file: str) -> list[str]:
    """Who holds the write gate's flock and SQLite's WAL write lock on `db_file`, from /proc/locks."""
    wanted: dict[int, tuple[str, str]] = {}  # inode -> (lock kind, what it is)
    for suffix, kind, label in (("-writelock", "FLOCK", "the write gate"), ("-shm", "POSIX", "SQLite's WAL write lock")):
        with contextlib.suppress(OSError):
            wanted[os.stat(db_file + suffix).st_ino] = (kind, label)
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    found: list[str] = []
    for line in lines:
        parts = line.split()
        if len(parts) < 8 or "->" in parts:  # "->" marks a blocked waiter, not a holder
            continue
        kind, mode, pid, dev, start = parts[1], parts[3], parts[4], parts[5], parts[6]
        try:
            inode = int(dev.rsplit(":", 1)[1])
        except (IndexError, ValueError):
            continue
        hit = wanted.get(inode)
        if hit is None or kind != hit[0] or mode != "WRITE" or not pid.lstrip("-").isdigit():
            continue
        if kind == "POSIX" and start != _WAL_WRITE_LOCK_BYTE:
            continue
        found.append(f"{_holder_name(int(pid))} holds {hit[1]}")
    return found


@dataclass(eq=False)
class _Op:
    fn: Callable[[Ledger], Any]
    future: Future[Any]
    what: str
    key: object = None  # set by submit_latest: a newer op with the same key replaces this one while it is queued
    durable: tuple[str, ...] = ()  # files (written, not yet synced) to make durable before the batch begins
    fail_fast: bool = False  # submitted in a fail_fast() context: dropped, not kept, while the disk is full
    probe: bool = False  # the watchdog's probe of an idle server: records no request id
    queued_at: float = field(default_factory=time.monotonic)


class LedgerWriter:
    """One writer thread with its own Ledger; ops are queued, batched, committed, retried, never lost."""

    def __init__(self, path: str | Path, *, clock: Clock = now_ms, on_stall: OnStall | None = None,
                 stall_after: float = STALL_AFTER_S, max_batch: int = MAX_BATCH,
                 name: str = "legion-ledger-writer", on_disk_full: OnDiskFull | None = None,
                 linger: float = 0.0, run_id: str | None = None, on_unreachable: OnUnreachable | None = None,
                 unreachable_after: float = 60.0) -> None:
        self.path = str(path)
        self.run_id = run_id
        self.linger = linger
        self._hurry = False
        self._on_stall = on_stall
        self._on_disk_full = on_disk_full
        self._disk_full: str | None = None  # the space report while the disk is full (until a batch lands)
        self.stall_after = stall_after
        self.max_batch = max_batch
        self._cond = threading.Condition()
        self._queue: deque[_Op] = deque()
        self._batch: list[_Op] = []  # the ops in flight (read by the watchdog under _cond)
        self._latest: dict[object, _Op] = {}  # submit_latest's key -> its op, while that op is still queued
        self._closing = False
        self._abort = threading.Event()
        self._progress_at = time.monotonic()
        self._stalled_since: float | None = None  # set once a stall was reported, until a batch lands
        self._last_error = ""
        self._attempts = 0
        self._file = ""
        self._ledger: Ledger | None = None  # the writer thread's (the watchdog asks who blocks it: `_holders`)
        self._relay: _Relay | None = None  # how `run` hands results to its event loop
        self._pid = os.getpid()
        self._on_unreachable = on_unreachable
        self.unreachable_after = unreachable_after
        self._unreachable_since: float | None = None  # the first failed attempt of an outage, until a batch lands
        self._unreachable_reported = False
        self._unreachable_reason = ""  # the last attempt's reason, while the server cannot be reached
        self._unknown: tuple[str, list[tuple[_Op, Any]]] | None = None  # a COMMIT in doubt: its request id, results
        self.reconnect_waits = 0  # attempts that failed because the server could not be reached
        self.commits = 0  # batches committed (one transaction each)
        self.ops = 0  # ops landed
        self.retries = 0  # batch attempts that failed transiently
        self.stalls = 0  # stalls reported
        self.max_batch_seen = 0
        self.syncs = 0  # sync calls made for the files ops depend on (one syncfs per batch and filesystem)
        self.synced_files = 0  # files those calls made durable
        opened: Future[None] = Future()
        self._thread = threading.Thread(target=self._main, args=(clock, opened), name=name, daemon=True)
        self._thread.start()
        opened.result()  # the open error, if any, is the caller's
        self._watchdog = threading.Thread(target=self._watch, name=name + "-watchdog", daemon=True)
        self._watchdog.start()

    # -- the callers' side -------------------------------------------------------------------------

    def submit(self, fn: Callable[[Ledger], T], what: str | None = None, *,
               durable: Iterable[str | os.PathLike[str]] = ()) -> Future[T]:
        """Queue `fn(ledger)`; never blocks. The future resolves after the op's commit (or its own failure).
        `durable`: files the op's rows depend on, made durable before its batch begins."""
        self._check_pid()
        future: Future[T] = Future()
        op = _Op(fn, future, what or str(getattr(fn, "__qualname__", None) or repr(fn)),
                 durable=tuple(os.fspath(p) for p in durable), fail_fast=_fail_fast.get())
        with self._cond:
            if op.fail_fast and self._disk_full is not None:
                raise DiskFullError(f"not recorded in the ledger: {self._disk_full}")
            self._enqueue(op)
        return future

    def _check_pid(self) -> None:
        if os.getpid() != self._pid:  # checked before taking a lock a fork may have copied held
            raise WriterClosedError(f"the ledger writer for {self.path!r} belongs to pid {self._pid}, not {os.getpid()}: "
                                    "a forked process must open its own ledger or writer")

    def _enqueue(self, op: _Op) -> None:
        """Queue one op (called under _cond)."""
        if self._closing:
            raise WriterClosedError(f"the ledger writer for {self.path!r} is closed; {op.what} was not queued")
        self._queue.append(op)
        if len(self._queue) == 1 or len(self._queue) >= self.max_batch:
            # the thread waits for a first op, or (lingering) for a full batch: other ops need not wake it
            self._cond.notify()

    def submit_latest(self, key: object, fn: Callable[[Ledger], T], what: str | None = None, *,
                      durable: Iterable[str | os.PathLike[str]] = ()) -> Future[T]:
        """`submit`, coalesced by `key`: while an op with this key is still queued (not yet in a batch), `fn`
        replaces its function and its future is returned. For writes where only the newest value matters (a
        cumulative usage snapshot, a liveness stamp): a stalled ledger queues one op per key, never a backlog,
        and the newest value always lands. The replaced op's `durable` files stay with it."""
        self._check_pid()
        files = tuple(os.fspath(p) for p in durable)
        with self._cond:
            op = self._latest.get(key)
            if op is not None and not self._closing and not op.future.cancelled():
                op.fn, op.what = fn, what or op.what
                op.durable = tuple(dict.fromkeys(op.durable + files))
                return op.future
            future: Future[T] = Future()
            op = _Op(fn, future, what or str(getattr(fn, "__qualname__", None) or repr(fn)), key, durable=files)
            self._enqueue(op)
            self._latest[key] = op
        return future

    def submit_then(self, fn: Callable[[Ledger], T], then: Callable[[Future[T]], None], what: str | None = None, *,
                    loop: asyncio.AbstractEventLoop) -> Future[T]:
        """`submit`, and `then(future)` on `loop` once the op is resolved, with the rest of its batch: one wake-up
        of the loop per batch, not per op."""
        future = self.submit(fn, what)
        self._relay_for(loop).when_done(future, then)
        return future

    def _relay_for(self, loop: asyncio.AbstractEventLoop) -> _Relay:
        relay = self._relay
        if relay is None or relay.loop is not loop:  # (one loop uses a writer; a new one simply gets a new relay)
            relay = self._relay = _Relay(loop)
        return relay

    async def run(self, fn: Callable[[Ledger], T], what: str | None = None, *,
                  durable: Iterable[str | os.PathLike[str]] = ()) -> T:
        """Queue `fn(ledger)` and await its commit without blocking the loop (cancelling the wait keeps the write)."""
        relay = self._relay_for(asyncio.get_running_loop())
        inner = relay.wrap(self.submit(fn, what, durable=durable))
        inner.add_done_callback(_retrieve)  # a waiter cancelled meanwhile must not leave "exception never retrieved"
        return await asyncio.shield(inner)

    def flush(self, timeout: float | None = None) -> None:
        """Block until every op submitted before this call has landed or failed (TimeoutError after timeout)."""
        future = self.submit(lambda _led: None, "flush")
        self.hurry()
        future.result(timeout)

    def hurry(self) -> None:
        """Someone waits on a queued write: the batch being gathered stops waiting for more (`linger`)."""
        with self._cond:
            self._hurry = True
            self._cond.notify_all()

    @property
    def disk_full(self) -> str | None:
        """While the ledger's filesystem is full: what `space_report` said when it was found full; else None."""
        with self._cond:
            return self._disk_full

    @property
    def last_error(self) -> str:
        """The repr of the last transient failure of the batch in flight ('' once it landed)."""
        with self._cond:
            return self._last_error

    @property
    def pending(self) -> int:
        """Ops queued or in flight."""
        with self._cond:
            return len(self._queue) + len(self._batch)

    async def aclose(self, timeout: float | None = 30.0) -> bool:
        """`close` for async callers: waits in a worker thread, so the loop keeps running meanwhile."""
        return await asyncio.to_thread(self.close, timeout)

    def close(self, timeout: float | None = 30.0) -> bool:
        """Refuse new ops, drain the queue, close the connection. False if it could not drain in time."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            full = self._disk_full
        if full is not None:
            timeout = DISK_FULL_CLOSE_S if timeout is None else min(timeout, DISK_FULL_CLOSE_S)
        if self._unreachable_reported:  # the run pauses: writes that cannot land now are not waited on long
            timeout = UNREACHABLE_CLOSE_S if timeout is None else min(timeout, UNREACHABLE_CLOSE_S)
        self._thread.join(timeout)
        if self._thread.is_alive():
            left = self.pending
            full = self.disk_full
            logger.error("ledger writer for {}: {} write(s) not landed after {}s at close; giving up on them ({})",
                         self.path, left, timeout, full or f"last error: {self.last_error or 'none'}")
            self._abort.set()
            return False
        self._watchdog.join()
        return True

    # -- the writer thread -------------------------------------------------------------------------

    def _main(self, clock: Clock, opened: Future[None]) -> None:
        try:
            ledger = open_ledger(self.path, clock=clock, run_id=self.run_id)
        except BaseException as exc:
            opened.set_exception(exc)
            return
        self._file, self._ledger = ledger.file, ledger
        opened.set_result(None)
        try:
            self._serve(ledger)
        finally:
            try:
                ledger.close()
            except Exception as exc:
                logger.error("ledger writer for {}: closing the connection failed: {!r}", self.path, exc)
            with self._cond:
                self._closing = True
                self._fail_unlanded()  # nothing is left after a clean drain; after an abort or a crash, say so
                self._cond.notify_all()

    def _serve(self, ledger: Ledger) -> None:
        while self._next_batch():
            if not self._batch:
                continue
            try:
                landed = self._commit(ledger, self._batch)
            except Exception as exc:  # anything not an op's own permanent error: roll back and retry
                self._failed_attempt(ledger, exc)
                continue
            self._landed(landed)

    def _next_batch(self) -> bool:
        """Top up the batch with queued ops (FIFO); False when closed and drained, or aborted."""
        with self._cond:
            while not self._queue and not self._batch and not self._closing:
                self._cond.wait()
            if self._abort.is_set():
                self._fail_unlanded()
                return False
            self._gather()
            # a batch whose COMMIT is in doubt stays as it was: its request id answers for exactly these ops
            while self._queue and len(self._batch) < self.max_batch and self._unknown is None:
                op = self._queue.popleft()
                if op.key is not None and self._latest.get(op.key) is op:
                    del self._latest[op.key]  # its function is fixed from here on: a newer value queues anew
                if op.future.set_running_or_notify_cancel():
                    self._batch.append(op)
            return bool(self._batch) or bool(self._queue) or not self._closing

    def _gather(self) -> None:
        """`linger`: let a new batch's first op wait for others to join it (called under _cond)."""
        if self.linger > 0 and not self._batch and self._queue:
            deadline = self._queue[0].queued_at + self.linger
            while not (self._closing or self._hurry or self._abort.is_set()) and len(self._queue) < self.max_batch:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        self._hurry = False

    def _sync(self, files: Iterable[str]) -> None:
        """Make the batch's files durable (OSError: the attempt failed and is retried)."""
        wanted = list(dict.fromkeys(files))
        if wanted:
            self.syncs += sync_paths(wanted)
            self.synced_files += len(wanted)

    def _commit(self, ledger: Ledger, batch: list[_Op]) -> int:
        """Run the batch in one transaction, each op in its own savepoint; resolve futures after COMMIT."""
        if self._unknown is not None:
            landed = self._settle_unknown(ledger)
            if landed is not None:
                return landed
        results: list[tuple[_Op, Any]] = []
        self._sync(path for op in batch if not op.future.done() for path in op.durable)
        request_id = uuid.uuid4().hex if ledger.backend == "postgresql" and not all(op.probe for op in batch) else None
        try:
            self._run_batch(ledger, batch, request_id, results)
        except CommitOutcomeUnknown:
            if request_id is not None:
                self._unknown = (request_id, results)
            raise
        for op, value in results:
            op.future.set_result(value)
        return len(results)

    def _settle_unknown(self, ledger: Ledger) -> int | None:
        """The last attempt's COMMIT is in doubt: if it landed, resolve its ops with that attempt's results (the
        count); else None, and the batch runs again. LedgerUnreachable while the server cannot answer yet."""
        assert self._unknown is not None
        request_id, results = self._unknown
        applied = ledger.request_applied(request_id)
        self._unknown = None
        if not applied:
            logger.warning("ledger writer for {}: request {} was not applied before the connection dropped; "
                           "running its {} write(s) again", self.path, request_id, len(results))
            return None
        logger.warning("ledger writer for {}: request {} was applied before the connection dropped; its {} write(s) "
                       "are not applied again", self.path, request_id, len(results))
        for op, value in results:
            op.future.set_result(value)
        return len(results)

    def _run_batch(self, ledger: Ledger, batch: list[_Op], request_id: str | None,
                   results: list[tuple[_Op, Any]]) -> None:
        """The batch's transaction: each op in its savepoint; `results` gets the landed ops' values."""
        raw = ledger._db.raw
        with ledger.transaction(request_id), ledger.deferring_sync() as named:
            for op in batch:
                if op.future.done():  # failed permanently in an earlier attempt
                    continue
                raw.execute(f"SAVEPOINT {_SAVEPOINT}")
                try:
                    value = op.fn(ledger)
                    if inspect.iscoroutine(value):
                        value.close()
                        raise TypeError(f"ledger write {op.what} returned a coroutine: pass a plain function "
                                        "fn(ledger), not an async one (it runs on the writer thread)")
                except BaseException as exc:
                    if is_transient(exc):
                        raise
                    raw.execute(f"ROLLBACK TO {_SAVEPOINT}")
                    raw.execute(f"RELEASE {_SAVEPOINT}")
                    if not isinstance(exc, Refusal):  # a refusal is its caller's answer to give
                        logger.warning("ledger write {} failed and was not recorded: {!r}", op.what, exc)
                    op.future.set_exception(exc)
                    continue
                raw.execute(f"RELEASE {_SAVEPOINT}")
                results.append((op, value))
            self._sync(named)  # before COMMIT: the rows that name these files land only once they are on disk

    def _landed(self, landed: int) -> None:
        with self._cond:
            self.commits += 1
            self.ops += landed
            self.max_batch_seen = max(self.max_batch_seen, landed)
            self._batch = []
            self._attempts = 0
            self._last_error = ""
            self._progress_at = time.monotonic()
            stalled_since, self._stalled_since = self._stalled_since, None
            was_full, self._disk_full = self._disk_full, None
            lost_since, self._unreachable_since = self._unreachable_since, None
            self._unreachable_reported = False
        if lost_since is not None:
            logger.warning("the ledger server at {} answers again after {:.1f}s: the writes kept meanwhile land",
                           self.path, time.monotonic() - lost_since)
        if was_full is not None:
            logger.warning("ledger writes to {} land again: there is free space again", self.path)
        if stalled_since is not None:
            logger.warning("ledger writes to {} landed again after {:.1f}s", self.path, time.monotonic() - stalled_since)

    def _failed_attempt(self, ledger: Ledger, exc: Exception) -> None:
        raw = ledger._db.raw
        if raw.in_transaction:  # e.g. a failed COMMIT leaves the transaction open
            with contextlib.suppress(Exception):
                raw.execute("ROLLBACK")
        full = is_disk_full(exc)
        lost = _unreachable_reason(exc)
        with self._cond:
            if lost:
                self._unreachable_reason = lost
            new_outage = bool(lost) and self._unreachable_since is None
            if new_outage:
                self._unreachable_since = time.monotonic()
            self._attempts += 1
            attempts = self._attempts
            self._last_error = repr(exc)[:300]
            newly_full = full and self._disk_full is None
            if newly_full:
                self._disk_full = space_report(self._file or self.path)
        self.retries += 1
        if lost:
            self.reconnect_waits += 1
        if new_outage:
            logger.warning("{}; writes are kept and retried with backoff on a fresh connection", exc)
        if newly_full:
            self._report_disk_full()  # first: whoever a dropped op wakes finds the condition already reported
        if full:
            with self._cond:
                self._drop_fail_fast(self._disk_full or space_report(self._file or self.path))
        if not is_transient(exc):
            logger.error("ledger writer for {}: unexpected error, retrying the batch: {!r}", self.path, exc)
        delay = min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** min(attempts - 1, 10))
        self._abort.wait(delay * random.uniform(0.75, 1.25))

    def _drop_fail_fast(self, reason: str) -> None:
        """The disk is full: fail the fail-fast ops (the batch was rolled back, nothing of them landed) (under _cond)."""
        for op in [*self._batch, *self._queue]:
            if op.fail_fast and not op.future.done() and (op.future.running() or op.future.set_running_or_notify_cancel()):
                op.future.set_exception(DiskFullError(f"not recorded in the ledger: {reason}"))
        self._batch = [op for op in self._batch if not op.fail_fast]
        self._queue = deque(op for op in self._queue if not op.fail_fast)

    def _report_disk_full(self) -> None:
        message = self.disk_full or ""
        logger.error("ledger writes to {} wait for free space: {}", self.path, message)
        if self._on_disk_full is None:
            return
        try:
            self._on_disk_full(message)
        except Exception as exc:
            logger.error("ledger writer: on_disk_full callback failed: {!r}", exc)

    def _fail_unlanded(self) -> None:
        """Close gave up: fail what cannot land now (called under _cond)."""
        gone = [*self._batch, *self._queue]
        self._batch, self._queue = [], deque()
        self._latest.clear()
        for op in gone:
            if op.future.done():
                continue
            if op.future.running() or op.future.set_running_or_notify_cancel():
                op.future.set_exception(WriterClosedError(
                    f"the ledger writer for {self.path!r} was closed before {op.what} could land "
                    f"(last error: {self._last_error or 'none'})"))

    # -- the watchdog thread -----------------------------------------------------------------------

    def _watch(self) -> None:
        period = max(0.01, min(0.25, self.stall_after / 4))
        space_at = 0.0
        while self._thread.is_alive():
            self._thread.join(period)
            report = self._check_stall()
            if report is not None:
                self._report(*report)
            if self._on_unreachable is not None:
                self._check_unreachable()
            if time.monotonic() >= space_at:
                space_at = time.monotonic() + SPACE_CHECK_S
                self._check_space()

    def _check_unreachable(self) -> None:
        """Report an outage longer than `unreachable_after` (once), or probe an idle server."""
        with self._cond:
            since, idle = self._unreachable_since, not (self._queue or self._batch or self._closing)
            quiet = time.monotonic() - self._progress_at
            due = since is not None and not self._unreachable_reported and time.monotonic() - since > self.unreachable_after
            if due:
                self._unreachable_reported = True
            reason = self._unreachable_reason
        if due and since is not None and self._on_unreachable is not None:
            waited = time.monotonic() - since
            detail = f"the ledger server at {self.path} has been unreachable for {waited:.1f}s ({reason})"
            logger.error("{}", detail)
            try:
                self._on_unreachable(waited, detail)
            except Exception as exc:
                logger.error("ledger writer: on_unreachable callback failed: {!r}", exc)
        elif idle and is_url(self.path) and quiet >= probe_every(self.unreachable_after):
            with contextlib.suppress(WriterClosedError):
                op = _Op(lambda _led: None, Future(), "probe of the ledger server", probe=True)
                with self._cond:
                    if not (self._queue or self._batch):
                        self._enqueue(op)
                        self._progress_at = time.monotonic()  # one probe per period, landed or not

    def _check_space(self) -> None:
        """A filesystem with no space left is full before a write fails: SQLite may still reuse WAL pages, so
        the first failing write can come much later (or never, for a run whose transcripts fill up first)."""
        if not self._file and is_url(self.path):
            return  # a database server: its disk is the server's to watch
        folder = os.path.dirname(self._file or os.path.abspath(self.path))
        try:
            st = os.statvfs(folder)
        except OSError:
            return
        if st.f_bavail > 0 or st.f_blocks == 0:
            return
        with self._cond:
            if self._disk_full is not None:
                return
            self._disk_full = space_report(self._file or self.path)
        self._report_disk_full()

    def _check_stall(self) -> tuple[float, str] | None:
        with self._cond:
            if self._stalled_since is not None:
                return None
            oldest = self._batch[0] if self._batch else (self._queue[0] if self._queue else None)
            if oldest is None:
                return None
            now = time.monotonic()
            waited = now - max(oldest.queued_at, self._progress_at)
            if waited <= self.stall_after:
                return None
            self._stalled_since = now - waited
            count = len(self._batch) + len(self._queue)
            attempts, last_error, what = self._attempts, self._last_error, oldest.what
        holders = self._holders()
        detail = (f"{count} ledger write(s) to {self.path} waiting {waited:.1f}s (oldest: {what}); "
                  f"{attempts} failed attempt(s), last error: {last_error or 'none yet, first attempt still blocked'}; "
                  + ("; ".join(holders) if holders else "no lock holder found in /proc/locks" if self._file
                     else "no backend of the server blocks it"))
        return waited, detail

    def _holders(self) -> list[str]:
        """Who holds what the writer waits for: SQLite's file locks (/proc/locks), or the server's (pg_stall.py)."""
        if self._file:
            return lock_holders(self._file)
        ledger = self._ledger
        if ledger is None or ledger.backend != "postgresql":
            return []
        from legion.ledger import pg_stall  # psycopg only for a PostgreSQL ledger

        return pg_stall.blockers(ledger._db.url, pg_stall.backend_pid(ledger))  # type: ignore[union-attr]

    def _report(self, waited: float, detail: str) -> None:
        self.stalls += 1
        logger.warning("ledger writer stalled: {}", detail)
        if self._on_stall is None:
            return
        try:
            self._on_stall(waited, detail)
        except Exception as exc:
            logger.error("ledger writer: on_stall callback failed: {!r}", exc)
