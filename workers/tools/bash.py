"""The ``bash`` tool: one command in its own process group, with a timeout and bounded output.

- ``start_new_session=True``: the command leads a new process group; its pgid is registered in
  ``ToolContext.pgids`` while any process of the group may live, so the session's retire can sweep it.
- The call returns when the shell exits (its exit is watched, not its pipe): output still in flight is
  drained for ``DRAIN_AFTER_EXIT`` s; processes the command left running in the background are named in
  the result, stay registered for the sweep, and their later output is discarded.
- Timeout: the call's ``timeout`` (seconds), at most the session's ``toolTimeoutMs``, which defaults to
  ``DEFAULT_TIMEOUT_S``; on timeout or abort (task cancellation) the whole group gets SIGKILL.
- Output (stdout+stderr) beyond ``MAX_LINES`` lines / ``MAX_BYTES`` is truncated to its tail; the output
  is kept in a file under the session's output directory whose path is in the result, up to
  ``MAX_SPILL_BYTES`` (the file and the result say when it was cut).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from legion.procs import ProcRef, group_exists, snapshot_groups
from legion.workers.tools.base import ToolContext, ToolFailure, ToolResult
from legion.workers.tools.schema import Schema

MAX_LINES = 2000
MAX_BYTES = 50 * 1024
MAX_SPILL_BYTES = 32 * 1024 * 1024  # the full-output file keeps at most this much of the output
DEFAULT_TIMEOUT_S = 600.0  # when neither the call nor the session's toolTimeoutMs sets a shorter one
DRAIN_AFTER_EXIT = 0.25  # background children may hold the pipe open; stop reading after this
_MAX_NAMED = 5  # background processes named in the result


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def effective_timeout(requested: float | None, tool_timeout_ms: int | None) -> float:
    """The call's timeout in seconds: the requested one, capped by toolTimeoutMs (or the default)."""
    cap = tool_timeout_ms / 1000 if tool_timeout_ms else DEFAULT_TIMEOUT_S
    return min(requested, cap) if requested else cap


class _Capture:
    """Keeps the output tail in memory and spills the output to a file (at most ``MAX_SPILL_BYTES``)."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        self.buf = bytearray()
        self.total = 0
        self.file: Any = None
        self.path: str | None = None
        self.spilled = 0  # bytes written to the file
        self.head_cut = False  # the kept tail starts in the middle of a line

    @property
    def spill_cut(self) -> bool:
        return self.total > self.spilled and self.path is not None

    def _open_spill(self) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        fd, self.path = tempfile.mkstemp(prefix="bash-", suffix=".log", dir=self.output_dir)
        self.file = os.fdopen(fd, "wb")

    def _spill(self, chunk: bytes | bytearray) -> None:
        room = MAX_SPILL_BYTES - self.spilled
        if room > 0:
            self.file.write(chunk[:room])
            self.spilled += min(room, len(chunk))

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.file is not None:
            self._spill(chunk)
        self.buf += chunk
        if len(self.buf) > 2 * MAX_BYTES:
            if self.file is None:
                self._open_spill()
                self._spill(self.buf)
            cut = len(self.buf) - MAX_BYTES
            self.head_cut = self.buf[cut - 1] != ord("\n")
            del self.buf[:cut]

    def result_text(self) -> tuple[str, bool]:
        text = self.buf.decode("utf-8", "replace")
        lines = text.splitlines()
        truncated = self.path is not None or len(lines) > MAX_LINES or len(self.buf) > MAX_BYTES
        if not truncated:
            return text, False
        if self.path is None:
            self._open_spill()
            self._spill(self.buf)
        tail = lines[-MAX_LINES:]
        size = sum(len(x) + 1 for x in tail)
        while len(tail) > 1 and size > MAX_BYTES:
            size -= len(tail.pop(0)) + 1
        shown = f"the last {len(tail)} lines"
        # one giant line: show its end rather than nothing. Whether the capture already cut it depends on
        # how the pipe chunked the output, so a line that lost its start counts as giant either way.
        if tail and (len(tail[0]) > MAX_BYTES or (len(tail) == len(lines) == 1 and self.head_cut)):
            tail[0] = tail[0][-MAX_BYTES:]
            shown = f"the last {len(tail[0])} characters"
        kept = (f"the first {self.spilled} bytes (cut at the {MAX_SPILL_BYTES // (1024 * 1024)} MiB limit) in"
                if self.spill_cut else "full output:")
        return f"[output truncated: showing {shown} of {self.total} bytes; {kept} {self.path}]\n" + \
            "\n".join(tail), True

    def close(self) -> None:
        if self.file is not None:
            if self.spill_cut:
                self.file.write(f"\n[output cut here: {self.total - self.spilled} more bytes were not kept "
                                f"(limit {MAX_SPILL_BYTES} bytes)]\n".encode())
            self.file.close()
            self.file = None


class _Shell(asyncio.SubprocessProtocol):
    """Feeds the capture; ``exited`` resolves when the shell exits, ``closed`` when its pipe closes too.

    asyncio's ``Process.wait()`` only returns once every pipe is closed, and a background job holds
    the pipe — so the exit is watched here instead."""

    def __init__(self, capture: _Capture) -> None:
        loop = asyncio.get_running_loop()
        self.capture: _Capture | None = capture
        self.exited: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.transport: asyncio.SubprocessTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        self.transport = transport

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if self.capture is not None:  # after the call returned, background output is discarded
            self.capture.feed(data)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        if self.transport is not None:
            self.transport.close()

    def detach(self) -> None:
        """The call is over: stop capturing; the transport closes itself once the last writer exits."""
        self.capture = None
        if self.closed.done() and self.transport is not None:
            self.transport.close()


def _pipe_inode(shell: _Shell) -> int | None:
    """The inode of the command's output pipe (its holders are the command's leftovers)."""
    assert shell.transport is not None
    pipe = shell.transport.get_pipe_transport(1)
    obj = pipe.get_extra_info("pipe") if pipe is not None else None
    try:
        return os.fstat(obj.fileno()).st_ino if obj is not None else None
    except (OSError, ValueError):
        return None


def _pipe_holders(inode: int) -> list[int]:
    """Pids (other than ours) holding the pipe with this inode open: one readable /proc scan."""
    target, own = f"pipe:[{inode}]", os.getpid()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            fds = os.listdir(f"/proc/{entry.name}/fd")
            if any(os.readlink(f"/proc/{entry.name}/fd/{fd}") == target for fd in fds):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours
            continue
    return found


def _left_behind(pgid: int, inode: int | None) -> list[ProcRef]:
    """Live processes of the command's group, plus those elsewhere still holding its output pipe."""
    refs = {(r.pid, r.create_time): r for r in snapshot_groups([pgid])} if group_exists(pgid) else {}
    for pid in _pipe_holders(inode) if inode is not None else []:
        ref = ProcRef.from_pid(pid)
        if ref is not None:
            refs.setdefault((ref.pid, ref.create_time), ref)
    return sorted(refs.values(), key=lambda r: r.pid)


def _describe(procs: list[ProcRef]) -> str:
    names = []
    for ref in procs[:_MAX_NAMED]:
        try:
            with open(f"/proc/{ref.pid}/cmdline", "rb") as f:
                cmd = f.read(200).replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            cmd = "?"
        names.append(f"{ref.pid} {cmd[:80]}")
    more = f", and {len(procs) - _MAX_NAMED} more" if len(procs) > _MAX_NAMED else ""
    return "; ".join(names) + more


class BashTool:
    name = "bash"
    description = ("Run a bash command in the session's working directory. stdout and stderr are combined; "
                   f"long output is truncated to the last {MAX_LINES} lines with the output saved to a "
                   "file. Optional timeout in seconds. The call returns when the shell exits; background "
                   "jobs keep running until the session ends, and their later output is discarded.")
    parameters: ClassVar[Schema] = {"type": "object", "additionalProperties": False, "required": ["command"], "properties": {
        "command": {"type": "string", "minLength": 1},
        "timeout": {"type": "number", "minimum": 0.001, "description": "seconds"}}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        timeout = effective_timeout(args.get("timeout"), ctx.session.budget.tool_timeout_ms)
        if not Path(ctx.cwd).is_dir():
            raise ToolFailure(f"working directory {ctx.cwd} does not exist")
        capture = _Capture(ctx.output_dir)
        loop = asyncio.get_running_loop()
        _, shell = await loop.subprocess_exec(
            lambda: _Shell(capture), "/bin/bash", "-c", args["command"], cwd=ctx.cwd,
            env=ctx.session.tool_env(), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        assert shell.transport is not None
        pgid = shell.transport.get_pid()
        ctx.pgids.add(pgid)
        timed_out = False
        try:
            try:
                await asyncio.wait_for(asyncio.shield(shell.exited), timeout)
            except TimeoutError:
                timed_out = True
                kill_group(pgid)
                await shell.exited
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(shell.closed), DRAIN_AFTER_EXIT)
        except BaseException:  # abort (cancellation): the whole group dies with the turn
            kill_group(pgid)
            shell.detach()
            capture.close()
            raise
        shell.detach()  # the output is what arrived by now
        left = await ctx.executor.thread(_left_behind, pgid, None if shell.closed.done() else _pipe_inode(shell))
        for group in {p.pgid for p in left} - {os.getpgrp(), 0, 1}:
            ctx.pgids.add(group)  # a process that left the group (setsid) is swept with the session too
        if not left and not group_exists(pgid):
            ctx.pgids.discard(pgid)
        if timed_out:
            left = []  # killed: what remains is dying, not left running
        try:
            text, truncated = capture.result_text()  # may still write the spill file: close it after
        finally:
            capture.close()
        return self._result(text, truncated, capture, shell.transport.get_returncode(),
                            timeout if timed_out else None, pgid, left)

    @staticmethod
    def _result(text: str, truncated: bool, capture: _Capture, code: int | None, timed_out: float | None,
                pgid: int, left: list[ProcRef]) -> ToolResult:
        details: dict[str, Any] = {"exitCode": code, "truncated": truncated, "fullOutputPath": capture.path,
                                   "outputCut": capture.spill_cut, "background": [p.pid for p in left]}
        if left:
            text = (f"{text}\n[{len(left)} background process(es) still running in process group {pgid}: "
                    f"{_describe(left)}. They are killed when the session ends; their further output is "
                    "discarded (redirect it to a file to keep it)]").lstrip("\n")
        if timed_out is not None:
            return ToolResult(f"{text}\n[command timed out after {timed_out:g} s; its process group was killed]",
                              True, details)
        if code:
            return ToolResult(f"{text}\n[exit code {code}]".lstrip("\n"), True, details)
        return ToolResult(text or "(no output)", False, details)
