"""Bare-process baselines for the spawn, retire and restart benchmarks, measured in the same run as legion's figures.

The machine's speed varies ±40 % between runs, so those benchmarks gate legion's figures as a ratio to what the
same machine does at that moment with no legion code: `BareForkServer` starts a helper process (this file run as a
script, single-threaded, `zmq` imported but no context opened — what the fork server is) that, on request,
- forks "workers": each opens its own ZeroMQ context, connects a DEALER to a raw ROUTER in the bench's event loop,
  sends `ready` and then blocks on its lifeline pipe (EOF: exit) — spawn → ready;
- closes a worker's lifeline and reaps it — a graceful retire (lifeline EOF → exit observed);
- SIGKILLs a worker, reaps it and forks its replacement, which sends `ready` again — a crash → restart;
- builds a plain tree (a child in its own process group with N `sleep` descendants) and kills it (SIGKILL to the
  group, every process reaped: the helper is a child subreaper) — a forced retire of N descendants.
Requests are one line on the helper's stdin, answered by one line on its stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

PR_SET_CHILD_SUBREAPER = 36


# ---------------------------------------------------------------- the helper process


def _worker_child(wid: str, endpoint: str, lifeline: int, inherited: list[int]) -> None:
    """A bare worker: own ZeroMQ context, DEALER → the bench's ROUTER, `ready`, then wait for lifeline EOF."""
    code = 0
    try:
        for fd in inherited:
            with contextlib.suppress(OSError):
                os.close(fd)
        import zmq

        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, wid.encode())
        sock.connect(endpoint)
        sock.send(b"ready")
        while os.read(lifeline, 1):
            pass
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _tree_child(descendants: int, ready: int, inherited: list[int]) -> None:
    """A plain tree: this child leads its own process group and starts `descendants` `sleep`s (as the fixture
    worker's descendants are) that live until killed."""
    try:
        for fd in inherited:
            with contextlib.suppress(OSError):
                os.close(fd)
        os.setpgid(0, 0)
        sleep = shutil.which("sleep") or "/bin/sleep"
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        for _ in range(descendants):
            os.posix_spawn(sleep, [sleep, "100000"], os.environ)
        os.write(ready, b"r")
        os.close(ready)
        while True:
            signal.pause()
    finally:
        os._exit(0)


def serve(endpoint: str) -> None:
    """The helper: answer one request line at a time (see the module docstring)."""
    import zmq  # noqa: F401 — preloaded, as the fork server preloads it: the workers only open a context

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    workers: dict[str, tuple[int, int]] = {}  # id -> (pid, lifeline write end)
    tree: tuple[int, int] | None = None  # (group leader pid, processes in the group)
    out = sys.stdout

    def fork_worker(wid: str) -> None:
        r, w = os.pipe()
        inherited = [fd for _, fd in workers.values()] + [w, 0, 1]
        pid = os.fork()
        if pid == 0:
            _worker_child(wid, endpoint, r, inherited)
        os.close(r)
        workers[wid] = (pid, w)

    for line in sys.stdin:
        cmd, *args = line.split()
        reply = "ok"
        if cmd == "spawn":
            for wid in args:
                fork_worker(wid)
        elif cmd == "retire":  # close every lifeline, reap every worker: the time from first close to last reap
            t0 = time.perf_counter()
            gone = [workers.pop(wid) for wid in args]
            for _, w in gone:
                os.close(w)
            for pid, _ in gone:
                os.waitpid(pid, 0)
            reply = f"{(time.perf_counter() - t0) * 1000:.4f}"
        elif cmd == "crash":  # SIGKILL, reap, fork the replacement (the bench times it until `ready`)
            wid = args[0]
            pid, w = workers.pop(wid)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(w)
            fork_worker(wid)
        elif cmd == "tree":
            n = int(args[0])
            r, w = os.pipe()
            inherited = [fd for _, fd in workers.values()] + [r, 0, 1]
            pid = os.fork()
            if pid == 0:
                _tree_child(n, w, inherited)
            os.close(w)
            os.read(r, 1)  # every descendant exists
            os.close(r)
            tree = (pid, n + 1)
        elif cmd == "killtree":  # SIGKILL the group, reap every process of it: the time from kill to last reap
            assert tree is not None
            pgid, count = tree
            t0 = time.perf_counter()
            os.killpg(pgid, signal.SIGKILL)
            for _ in range(count):
                os.waitpid(-pgid, 0)
            reply = f"{(time.perf_counter() - t0) * 1000:.4f}"
            tree = None
        else:
            reply = f"error unknown request {cmd!r}"
        out.write(reply + "\n")
        out.flush()
    for pid, w in workers.values():
        os.close(w)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


# ---------------------------------------------------------------- the bench's side


class BareForkServer:
    """The helper and a raw ZeroMQ ROUTER on the bench's loop; `ready` arrivals resolve per-id futures."""

    def __init__(self, run_dir: Path) -> None:
        self.endpoint = f"ipc://{run_dir}/bare.sock"
        self.waiting: dict[str, asyncio.Future[float]] = {}
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ctx: Any = None
        self._router: Any = None

    async def start(self) -> None:
        import zmq
        import zmq.asyncio

        self._ctx = zmq.asyncio.Context()
        self._router = self._ctx.socket(zmq.ROUTER)
        # a restarted worker reconnects under its identity before the ROUTER may have seen the dead one go
        self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        self._router.bind(self.endpoint)
        self._reader = asyncio.create_task(self._read())
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, self.endpoint, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)

    async def _read(self) -> None:
        while True:
            ident, body = await self._router.recv_multipart()
            fut = self.waiting.pop(ident.decode(), None)
            if body == b"ready" and fut is not None and not fut.done():
                fut.set_result(time.perf_counter())

    async def request(self, line: str) -> str:
        assert self._proc is not None and self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(line.encode() + b"\n")
        await self._proc.stdin.drain()
        reply = (await asyncio.wait_for(self._proc.stdout.readline(), 60)).decode().strip()
        if not reply or reply.startswith("error"):
            raise RuntimeError(f"bare fork server: {line!r} -> {reply!r}")
        return reply

    def expect(self, wid: str) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[wid] = fut
        return fut

    async def spawn_ms(self, ids: list[str]) -> float:
        """Request → the last of `ids` ready (ms), as the bench's loop sees it."""
        futs = [self.expect(w) for w in ids]
        t0 = time.perf_counter()
        await self.request("spawn " + " ".join(ids))
        done = await asyncio.wait_for(asyncio.gather(*futs), 30)
        return (max(done) - t0) * 1000

    async def retire_ms(self, ids: list[str]) -> float:
        """Lifeline EOF → every one of `ids` reaped (ms, timed in the helper)."""
        return float(await self.request("retire " + " ".join(ids)))

    async def crash_restart_ms(self, wid: str) -> float:
        """Request → the worker SIGKILLed, reaped, forked again and its `ready` received (ms)."""
        fut = self.expect(wid)
        t0 = time.perf_counter()
        await self.request(f"crash {wid}")
        return (await asyncio.wait_for(fut, 30) - t0) * 1000

    async def kill_tree_ms(self, descendants: int) -> float:
        """Build a plain tree (untimed), then SIGKILL its group → every process reaped (ms, timed in the helper)."""
        await self.request(f"tree {descendants}")
        return float(await self.request("killtree"))

    async def close(self) -> None:
        if self._proc is not None:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            try:
                await asyncio.wait_for(self._proc.wait(), 10)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        if self._router is not None:
            self._router.close(linger=0)
        if self._ctx is not None:
            self._ctx.term()


if __name__ == "__main__":
    serve(sys.argv[1])
