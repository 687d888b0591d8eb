"""File tools in pure Python: ``read``, ``write``, ``edit``, ``ls``, ``find``, ``grep``.

Paths are relative to the session's cwd. Walks skip ``.git`` directories and never open the ledger
(``legion.db`` and its WAL/SHM files), whatever the guard allowed.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

from legion.workers.tools.base import ToolContext, ToolFailure, ToolResult
from legion.workers.tools.schema import Schema

MAX_LINES = 2000
MAX_BYTES = 50 * 1024
MAX_LINE_CHARS = 2000  # longer lines are shown cut, marked "[line truncated]"
_PIECE_BYTES = 64 * 1024  # longest line piece read at once; the rest of a longer line is skipped
_LEDGER_NAMES = {"legion.db", "legion.db-wal", "legion.db-shm", "legion.db-journal"}


def is_ledger_file(path: str | Path) -> bool:
    """True for a ledger file name, or a path that resolves (through symlinks and ``..``) to one."""
    p = Path(path)
    if p.name in _LEDGER_NAMES:
        return True
    if p.name not in ("", ".", "..") and not p.is_symlink():
        return False  # only a symlink (or a trailing ``..``) can make the name differ from its target's
    try:
        return p.resolve().name in _LEDGER_NAMES
    except (OSError, RuntimeError):  # a symlink loop or an unreadable path is not the ledger
        return False


def _file_arg(ctx: ToolContext, raw: str) -> Path:
    """The path argument resolved against the session cwd; the ledger is refused whatever the guard allowed."""
    path = ctx.resolve(raw)
    if is_ledger_file(path):
        raise ToolFailure("direct access to the legion ledger (legion.db) is refused; use the legion tools")
    return path


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if not is_ledger_file(path):
                yield path


def _read_text(path: Path) -> str:
    """The whole text file; bytes that are not UTF-8 become surrogate escapes, so it round-trips exactly."""
    data = path.read_bytes()
    if b"\x00" in data[:8192]:
        raise ToolFailure(f"{path} looks like a binary file; read only text files")
    return data.decode("utf-8", "surrogateescape")


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
        path = _file_arg(ctx, args["path"])
        if not path.is_file():
            raise ToolFailure(f"{path} is not a file" if path.exists() else f"{path} does not exist")
        start = args.get("offset", 1) - 1
        limit = min(args.get("limit", MAX_LINES), MAX_LINES)
        # streamed in a thread: a huge file neither fills the pool's memory nor stalls its event loop
        out, end, total = await asyncio.to_thread(_read_window, path, start, limit)
        if start >= total and total:
            raise ToolFailure(f"offset {start + 1} is beyond the end of {path} ({total} lines)")
        text = "\n".join(out)
        if end < total:
            text += f"\n[{total - end} more lines; continue with offset={end + 1}]"
        return ToolResult(text, details={"path": str(path), "lines": total})


def _read_window(path: Path, start: int, limit: int) -> tuple[list[str], int, int]:
    """Numbered rows of lines ``[start, start+limit)`` within ``MAX_BYTES``, the index after the last row
    shown, and the file's line count — reading line pieces, never the whole file (or a whole giant line)."""
    out: list[str] = []
    size, end, total, full = 0, start, 0, False
    with path.open("rb") as f:
        if _is_binary(f):
            raise ToolFailure(f"{path} looks like a binary file; read only text files")
        for total, piece, first in _pieces(f):
            if not first or full or not start < total <= start + limit:
                continue
            text = _decode(piece)
            cut = len(text) > MAX_LINE_CHARS or (len(piece) == _PIECE_BYTES and not piece.endswith(b"\n"))
            row = f"{total:>6}\t{text[:MAX_LINE_CHARS]}" + (" [line truncated]" if cut else "")
            if size + len(row) > MAX_BYTES and out:
                full = True
            else:
                out.append(row)
                size += len(row) + 1
                end = total
    return out, end, total


def _is_binary(f: BinaryIO) -> bool:
    """A NUL byte in the first 8 KB; leaves the file at its start."""
    binary = b"\x00" in f.read(8192)
    f.seek(0)
    return binary


def _pieces(f: BinaryIO) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, piece, is the line's first piece) for pieces of at most ``_PIECE_BYTES``: a huge
    file or line never sits in memory whole."""
    number, continuing = 0, False
    while piece := f.readline(_PIECE_BYTES):
        if not continuing:
            number += 1
        yield number, piece, not continuing
        continuing = not piece.endswith(b"\n")


def _decode(piece: bytes) -> str:
    return piece.rstrip(b"\r\n").decode("utf-8", "replace")


class WriteTool:
    name = "write"
    description = "Create or overwrite a file with the given content (parent directories are created)."
    parameters: ClassVar[Schema] = {"type": "object", "additionalProperties": False, "required": ["path", "content"],
                  "properties": {"path": {"type": "string", "minLength": 1}, "content": {"type": "string"}}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        path = _file_arg(ctx, args["path"])
        path.parent.mkdir(parents=True, exist_ok=True)
        data = args["content"].encode("utf-8")
        path.write_bytes(data)
        return ToolResult(f"Wrote {len(data)} bytes to {path}", details={"path": str(path)})


class EditTool:
    name = "edit"
    description = ("Replace exactly one occurrence of oldText with newText in a file. oldText must match the "
                   "file exactly (including whitespace; CRLF line endings are matched and kept) and occur "
                   "exactly once.")
    parameters: ClassVar[Schema] = {"type": "object", "additionalProperties": False, "required": ["path", "oldText", "newText"],
                  "properties": {"path": {"type": "string", "minLength": 1},
                                 "oldText": {"type": "string", "minLength": 1}, "newText": {"type": "string"}}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        path = _file_arg(ctx, args["path"])
        if not path.is_file():
            raise ToolFailure(f"{path} does not exist; use write to create it")
        return await asyncio.to_thread(self._edit, path, args)  # a big file must not stall the pool's loop

    @staticmethod
    def _edit(path: Path, args: dict[str, Any]) -> ToolResult:
        text = _read_text(path)
        old, new = args["oldText"], args["newText"]
        if old not in text and "\r\n" in text and "\n" in old and "\r" not in old:
            # the model saw the file's lines without their CR: match and write in the file's line endings
            old, new = old.replace("\n", "\r\n"), new.replace("\r\n", "\n").replace("\n", "\r\n")
        count = text.count(old)
        if count == 0:
            raise ToolFailure(f"oldText was not found in {path}; read the file and copy the exact text "
                              "(whitespace and indentation must match)")
        if count > 1:
            raise ToolFailure(f"oldText occurs {count} times in {path}; include more surrounding lines so it "
                              "matches exactly once")
        at = text.index(old)
        path.write_bytes((text[:at] + new + text[at + len(old):]).encode("utf-8", "surrogateescape"))
        line = text.count("\n", 0, at) + 1
        return ToolResult(f"Edited {path} at line {line}", details={"path": str(path), "line": line})


class LsTool:
    name = "ls"
    description = "List a directory (directories end with '/'), sorted by name."
    parameters: ClassVar[Schema] = {"type": "object", "additionalProperties": False, "properties": {
        "path": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        path = ctx.resolve(args.get("path") or ".")
        if not path.is_dir():
            raise ToolFailure(f"{path} is not a directory")
        limit = args.get("limit", 500)
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
        text = "\n".join(names[:limit]) or "(empty directory)"
        if len(names) > limit:
            text += f"\n[{len(names) - limit} more entries; raise limit]"
        return ToolResult(text)


class FindTool:
    name = "find"
    description = ("Find files whose path (relative to the search directory) matches a glob pattern, e.g. "
                   "'*.py' or 'src/**/test_*.py'. A pattern without '/' matches file names at any depth.")
    parameters: ClassVar[Schema] = {"type": "object", "additionalProperties": False, "required": ["pattern"], "properties": {
        "pattern": {"type": "string", "minLength": 1}, "path": {"type": "string"},
        "limit": {"type": "integer", "minimum": 1}}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return await asyncio.to_thread(self._find, args, ctx)  # a big walk must not stall the pool's loop

    @staticmethod
    def _find(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        root = ctx.resolve(args.get("path") or ".")
        if not root.is_dir():
            raise ToolFailure(f"{root} is not a directory")
        pattern = args["pattern"]
        limit = args.get("limit", 1000)
        patterns = {pattern, pattern.replace("**/", "")}  # '**/' also matches no directory at all
        hits: list[str] = []
        for file in _walk(root):
            rel = file.relative_to(root).as_posix()
            target = rel if "/" in pattern else file.name
            if any(fnmatch.fnmatchcase(target, p) or fnmatch.fnmatchcase(rel, p) for p in patterns):
                hits.append(rel)
                if len(hits) > limit:
                    break
        text = "\n".join(hits[:limit]) or f"no files match {pattern!r} under {root}"
        if len(hits) > limit:
            text += f"\n[more than {limit} matches; narrow the pattern]"
        return ToolResult(text)


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
        return await asyncio.to_thread(self._grep, args, ctx)  # a big search must not stall the pool's loop

    @staticmethod
    def _grep(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        root = ctx.resolve(args.get("path") or ".")
        source = re.escape(args["pattern"]) if args.get("literal") else args["pattern"]
        try:
            rx = re.compile(source, re.IGNORECASE if args.get("ignoreCase") else 0)
        except re.error as exc:
            raise ToolFailure(f"invalid regular expression {args['pattern']!r}: {exc}; set literal=true "
                              "to search for the text itself") from exc
        limit = args.get("limit", 200)
        files = [root] if root.is_file() else list(_walk(root)) if root.is_dir() else []
        if not files:
            raise ToolFailure(f"{root} does not exist")
        glob = args.get("glob")
        hits: list[str] = []
        for file in files:
            if (glob and not fnmatch.fnmatchcase(file.name, glob)) or is_ledger_file(file):
                continue
            rel = file.name if file == root else file.relative_to(root).as_posix()
            try:
                with file.open("rb") as f:
                    if _is_binary(f):
                        continue
                    matched = 0  # line number of the last hit: one hit per line, whichever piece matched
                    for no, piece, _first in _pieces(f):
                        line = _decode(piece)
                        found = rx.search(line) if matched != no else None
                        if found:
                            matched = no
                            at = max(0, found.start() - 100) if found.end() > 500 else 0  # show the match
                            hits.append(f"{rel}:{no}: {line[at:at + 500]}")
                            if len(hits) >= limit:
                                return ToolResult("\n".join(hits) +
                                                  f"\n[stopped at {limit} matches; narrow the search]")
            except OSError:
                continue
        return ToolResult("\n".join(hits) or "no matches")
