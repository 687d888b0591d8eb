"""Background WAL checkpoints on a separate connection, so no transaction ever pays for one.

SQLite's autocheckpoint runs inside the COMMIT of the writer that crosses 1000 WAL pages: that
transaction then also copies pages and fsyncs the database file, and every writer queued behind it
on the write gate waits too. Each Database instead asks its Checkpointer for a PASSIVE checkpoint
every CHECKPOINT_EVERY_COMMITS commits; a daemon thread runs it on its own sqlite3 connection
(PASSIVE never blocks writers and never invokes the busy handler), so the requesting transaction
returns as soon as its own COMMIT is durable. The default autocheckpoint stays on as the safety net.
The thread and its connection are created lazily on the first request, in the process that asks.
"""

from __future__ import annotations

import math
import sqlite3
import threading

_GOLDEN = (math.sqrt(5) - 1) / 2


def stagger(pid: int, period: int) -> int:
    """A process's starting offset in its checkpoint period (0 <= offset < period).

    Why not pid % period: writers forked together get consecutive pids, which then fill one
    contiguous block of offsets and leave a long stretch in which no process asks for a
    checkpoint; the WAL then reaches the 1000-page autocheckpoint and a COMMIT pays for it.
    Fibonacci hashing spreads consecutive pids evenly over the period (three-gap theorem).
    """
    return int(((pid * _GOLDEN) % 1.0) * period) % period if period > 0 else 0


class Checkpointer:
    """One lazily started daemon thread per Database that runs PRAGMA wal_checkpoint(PASSIVE)."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.runs = 0
        self.last: tuple[int, int, int] | None = None
        self.errors = 0
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def request(self) -> None:
        """Ask for a checkpoint soon; never blocks."""
        with self._lock:
            if self._stop:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="legion-ledger-checkpoint", daemon=True)
                self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        con: sqlite3.Connection | None = None
        try:
            con = sqlite3.connect(self.file, isolation_level=None, check_same_thread=True)
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stop:
                    return
                try:
                    self.last = self.checkpoint(con)
                    self.runs += 1
                except sqlite3.Error:
                    self.errors += 1  # best effort: the next request retries, autocheckpoint is the net
        except sqlite3.Error:
            self.errors += 1
        finally:
            if con is not None:
                con.close()

    def checkpoint(self, con: sqlite3.Connection) -> tuple[int, int, int]:
        """One PASSIVE checkpoint: (busy, WAL frames, frames backfilled); a seam for instrumentation."""
        row = con.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return (int(row[0]), int(row[1]), int(row[2]))

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (after a checkpoint in progress) and close its connection."""
        with self._lock:
            self._stop = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join(timeout)
