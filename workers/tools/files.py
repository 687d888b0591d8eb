"""File tools: ``read``, ``write``, ``edit``, ``ls``, ``find``, ``grep``.

Paths are relative to the session's cwd. Walks skip ``.git`` directories and never open the ledger
(``legion.db`` and its WAL/SHM files, by name and by device+inode, so a hard link is refused too),
whatever the guard allowed.

The work itself (``fileops``, the same Python code and ``re`` dialect as ever) runs in the session's
helper process (``executor.ToolExecutor``), never in the process hosting the session: it
stops by itself at the call's deadline (``MAX_TOOL_SECONDS``, or the session's shorter
``toolTimeoutMs``) with what it found, and if it cannot — one regular expression that backtracks
without end, a read the kernel never completes — the helper is killed shortly after (``KILL_GRACE_S``) and the
call says so. An abort kills it at once. Only regular files are opened, checked without blocking, and
a kernel stream that would block on read is refused (``fileops``). ``edit`` handles files up
to ``MAX_EDIT_BYTES``; ``ls`` lists at most ``MAX_LS_ENTRIES``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from legion.workers.tools.base import ToolContext, ToolFailure, ToolResult
from legion.workers.tools.executor import DeadlineExceeded, HelperFailed
from legion.workers.tools.fileops import (
    MAX_BYTES,
    MAX_EDIT_BYTES,
    MAX_LINE_CHARS,
    MAX_LINES,
    MAX_LS_ENTRIES,
    is_ledger_file,
    ledger_ids,
    open_regular,
)
from legion.workers.tools.schema import Schema

__all__ = [
    "MAX_BYTES",
    "MAX_EDIT_BYTES",
    "MAX_LINES",
    "MAX_LINE_CHARS",
    "MAX_LS_ENTRIES",
    "EditTool",
    "FindTool",
    "GrepTool",
    "LsTool",
    "ReadTool",
    "WriteTool",
    "is_ledger_file",
    "ledger_ids",
    "open_regular",
]

MAX_TOOL_SECONDS = 60.0  # a file tool call's deadline unless toolTimeoutMs is shorter
KILL_GRACE_S = (1.0, 2.0)  # after the deadline the work has a quarter of it, within these bounds, to stop
                           # by itself (with what it found) before its helper is killed


def _time_limit(ctx: ToolContext) -> float:
    ms = ctx.session.budget.tool_timeout_ms
    return min(MAX_TOOL_SECONDS, ms / 1000) if ms else MAX_TOOL_SECONDS


def _grace(seconds: float) -> float:
    low, high = KILL_GRACE_S
    return min(high, max(low, seconds / 4))


_OVERRUN = {
    "grep": ("the search did not stop at its {s:g} s deadline and was killed. One line can make a regular "
             "expression backtrack without end (nested or overlapping repetition such as (a|aa)+ or (x+)+ "
             "on a long line), or a file can block its read: simplify the pattern, set literal=true, or "
             "narrow path/glob"),
    "read": ("reading {path} did not finish by its {s:g} s deadline and was killed: the file blocks on read "
             "(a kernel interface or a hung mount, not an ordinary file) — use bash with a timeout"),
}
_OVERRUN_ANY = "the call did not finish by its {s:g} s deadline and was killed: {path} blocks (a hung mount?)"


async def _run(ctx: ToolContext, op: str, args: dict[str, Any]) -> ToolResult:
    """Run one file operation in the session's helper process, bounded by the call's deadline."""
    seconds = _time_limit(ctx)
    request = {"op": op, "args": args, "cwd": ctx.cwd, "seconds": seconds,
               "ledgerPath": ctx.session.ledger_path, "runDir": ctx.session.run_dir}
    try:
        reply = await ctx.executor.call(ctx.pgids, request, seconds + _grace(seconds), idempotent=op != "edit")
    except DeadlineExceeded:
        path = args.get("path") or ctx.cwd
        raise ToolFailure(_OVERRUN.get(op, _OVERRUN_ANY).format(s=seconds, path=path)) from None
    except HelperFailed as exc:
        raise ToolFailure(f"{exc}; the call was not completed — try again") from None
    if reply.get("ok"):
        return ToolResult(str(reply.get("text", "")), details=reply.get("details"))
    if "failure" in reply:
        raise ToolFailure(str(reply["failure"]))
    if "unicode" in reply:
        reason, at = reply["unicode"]
        raise UnicodeEncodeError("utf-8", "", int(at), int(at) + 1, str(reason))
    if "oserror" in reply:
        number, message, filename = reply["oserror"]
        raise OSError(number, message, filename) if filename is not None else OSError(number, message)
    return ToolResult(f"{op}: internal error: {reply.get('internal', reply)}", True)


class ReadTool:
    name = "read"
    description = ("Read a text file. Output lines are prefixed with their 1-based line number. Use offset "
                   f"(first line, 1-based) and limit (line count) for large files; at most {MAX_LINES} lines "
                   f"or {MAX_BYTES // 1024} KB are returned per call; lines longer than {MAX_LINE_CHARS} "
                   "characters are cut.")
    parameters: ClassVar[Schema] = {"type": "object", "additionalProperties": False, "required": ["path"], "properties": {
        "path": {"type": "string", "minLength": 1, "description": "file path (relative to the cwd or absolute)"},
        "offset": {"type": "integer", "minimum": 1, "description": "first line to read (1-based)"},
        "limit": {"type": "integer", "minimum": 1, "description": "number of lines to read"}}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await _run(ctx, "read", args)


class WriteTool:
    name = "write"
    description = "Create or overwrite a file with the given content (parent directories are created)."
    parameters: ClassVar[Schema] = {"type": "object", "additionalProperties": False, "required": ["path", "content"],
                  "properties": {"path": {"type": "string", "minLength": 1}, "content": {"type": "string"}}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await _run(ctx, "write", args)


class EditTool:
    name = "edit"
    description = ("Replace exactly one occurrence of oldText with newText in a file. oldText must match the "
                   "file exactly (including whitespace; CRLF line endings are matched and kept) and occur "
                   "exactly once.")
    parameters: ClassVar[Schema] = {"type": "object", "additionalProperties": False, "required": ["path", "oldText", "newText"],
                  "properties": {"path": {"type": "string", "minLength": 1},
                                 "oldText": {"type": "string", "minLength": 1}, "newText": {"type": "string"}}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await _run(ctx, "edit", args)


class LsTool:
    name = "ls"
    description = ("List a directory (directories end with '/'), sorted by name; FIFOs, sockets and devices "
                   "are counted, not listed.")
    parameters: ClassVar[Schema] = {"type": "object", "additionalProperties": False, "properties": {
        "path": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await _run(ctx, "ls", args)


class FindTool:
    name = "find"
    description = ("Find files whose path (relative to the search directory) matches a glob pattern, e.g. "
                   "'*.py' or 'src/**/test_*.py'. A pattern without '/' matches file names at any depth.")
    parameters: ClassVar[Schema] = {"type": "object", "additionalProperties": False, "required": ["pattern"], "properties": {
        "pattern": {"type": "string", "minLength": 1}, "path": {"type": "string"},
        "limit": {"type": "integer", "minimum": 1}}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await _run(ctx, "find", args)


class GrepTool:
    name = "grep"
    description = ("Search file contents with a Python regular expression (matched per line, in 64 KB "
                   "pieces of very long lines). Output lines are 'path:line: text'. Optional glob filters file "
                   "names; literal treats the pattern as text.")
    parameters: ClassVar[Schema] = {"type": "object", "additionalProperties": False, "required": ["pattern"], "properties": {
        "pattern": {"type": "string", "minLength": 1}, "path": {"type": "string"}, "glob": {"type": "string"},
        "ignoreCase": {"type": "boolean"}, "literal": {"type": "boolean"},
        "limit": {"type": "integer", "minimum": 1}}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await _run(ctx, "grep", args)
