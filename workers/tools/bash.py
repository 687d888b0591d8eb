"""The ``bash`` tool: one command in its own process group, with a timeout and output truncation.

- ``start_new_session=True``: the command leads a new process group; its pgid is registered in
  ``ToolContext.pgids`` while any process of the group may live, so the session's retire can sweep it.
- Timeout: the call's ``timeout`` (seconds) or the session's ``toolTimeoutMs``; on timeout or abort
  (task cancellation) the whole group gets SIGKILL.
- Output (stdout+stderr) beyond ``MAX_LINES`` lines / ``MAX_BYTES`` is truncated to its tail; the full
  output is kept in a file under the session's output directory whose path is in the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from legion.procs import group_exists
from legion.workers.tools.base import ToolContext, ToolFailure, ToolResult
from legion.workers.tools.schema import Schema

MAX_LINES = 2000
MAX_BYTES = 50 * 1024
_DRAIN_AFTER_EXIT = 0.5  # background children may hold the pipe open; stop reading after this


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class _Capture:
    """Keeps the output tail in memory and spills the full output to a file once it grows large."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        self.buf = bytearray()
        self.total = 0
        self.file: Any = None
        self.path: str | None = None
        self.head_cut = False  # the kept tail starts in the middle of a line

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.file is not None:
            self.file.write(chunk)
        self.buf += chunk
        if len(self.buf) > 2 * MAX_BYTES:
            if self.file is None:
                self.output_dir.mkdir(parents=True, exist_ok=True)
                fd, self.path = tempfile.mkstemp(prefix="bash-", suffix=".log", dir=self.output_dir)
                self.file = os.fdopen(fd, "wb")
                self.file.write(self.buf)
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
            self.output_dir.mkdir(parents=True, exist_ok=True)
            fd, self.path = tempfile.mkstemp(prefix="bash-", suffix=".log", dir=self.output_dir)
            with os.fdopen(fd, "wb") as f:
                f.write(self.buf)
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
        return (f"[output truncated: showing {shown} of {self.total} bytes; full output: "
                f"{self.path}]\n" + "\n".join(tail)), True

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class BashTool:
    name = "bash"
    description = ("Run a bash command in the session's working directory. stdout and stderr are combined; "
                   f"long output is truncated to the last {MAX_LINES} lines with the full output saved to a "
                   "file. Optional timeout in seconds.")
    parameters: ClassVar[Schema] = {"type": "object", "additionalProperties": False, "required": ["command"], "properties": {
        "command": {"type": "string", "minLength": 1},
        "timeout": {"type": "number", "minimum": 0.001, "description": "seconds"}}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        timeout: float | None = args.get("timeout")
        budget_ms = ctx.session.budget.tool_timeout_ms
        if budget_ms:
            timeout = min(timeout, budget_ms / 1000) if timeout else budget_ms / 1000
        if not Path(ctx.cwd).is_dir():
            raise ToolFailure(f"working directory {ctx.cwd} does not exist")
        proc = await asyncio.create_subprocess_exec(
            "/bin/bash", "-c", args["command"], cwd=ctx.cwd, env=ctx.session.tool_env(),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True)
        pgid = proc.pid
        ctx.pgids.add(pgid)
        capture = _Capture(ctx.output_dir)
        reader = asyncio.create_task(self._pump(proc, capture))
        timed_out = False
        try:
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                timed_out = True
                kill_group(pgid)
                await proc.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(reader), _DRAIN_AFTER_EXIT)
        except BaseException:  # abort (cancellation): the whole group dies with the turn
            kill_group(pgid)
            raise
        finally:
            reader.cancel()
            with contextlib.suppress(BaseException):
                await reader
            capture.close()
            if not group_exists(pgid):
                ctx.pgids.discard(pgid)
        text, truncated = capture.result_text()
        details = {"exitCode": proc.returncode, "truncated": truncated, "fullOutputPath": capture.path}
        if timed_out:
            return ToolResult(f"{text}\n[command timed out after {timeout:g} s; its process group was killed]",
                              True, details)
        if proc.returncode:
            return ToolResult(f"{text}\n[exit code {proc.returncode}]".lstrip("\n"), True, details)
        return ToolResult(text or "(no output)", False, details)

    @staticmethod
    async def _pump(proc: asyncio.subprocess.Process, capture: _Capture) -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            capture.feed(chunk)
