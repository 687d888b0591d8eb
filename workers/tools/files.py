"""File tools in pure Python: ``read``, ``write``, ``edit``, ``ls``, ``find``, ``grep``.

Paths are relative to the session's cwd. Walks skip ``.git`` directories and never open the ledger
(``legion.db`` and its WAL/SHM files, by name and by device+inode, so a hard link is refused too),
whatever the guard allowed.

Bounded by construction (issue 13): only regular files are opened, checked without blocking
(``O_NONBLOCK`` + ``fstat``), so a FIFO, socket or device never hangs a call; walks skip non-regular
entries; blocking I/O runs in a thread that stops at the call's deadline (``MAX_TOOL_SECONDS``, or the
session's shorter ``toolTimeoutMs``) or as soon as the call is aborted, so no thread outlives its call
for long. ``edit`` handles files up to ``MAX_EDIT_BYTES``; ``ls`` lists at most ``MAX_LS_ENTRIES``.
"""

from __future__ import annotations

import asyncio
import errno
import fnmatch
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, TypeVar

from legion.workers.tools.base import ToolContext, ToolFailure, ToolResult
from legion.workers.tools.schema import Schema

MAX_LINES = 2000
MAX_BYTES = 50 * 1024
MAX_LINE_CHARS = 2000  # longer lines are shown cut, marked "[line truncated]"
MAX_TOOL_SECONDS = 60.0  # a file tool call's deadline unless toolTimeoutMs is shorter
MAX_EDIT_BYTES = 16 * 1024 * 1024  # edit reads the whole file; larger files are refused
MAX_LS_ENTRIES = 100_000  # directory entries read by one ls call
_PIECE_BYTES = 64 * 1024  # longest line piece read at once; the rest of a longer line is skipped
_LEDGER_NAMES = {"legion.db", "legion.db-wal", "legion.db-shm", "legion.db-journal"}
_LEDGER_SUFFIXES = ("", "-wal", "-shm", "-journal")
_LEDGER_REFUSAL = "direct access to the legion ledger (legion.db) is refused; use the legion tools"
T = TypeVar("T")


class _Stop:
    """When a tool's worker thread must stop: the call's deadline passed or the call was aborted."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.aborted = threading.Event()

    def reached(self) -> bool:
        return self.aborted.is_set() or time.monotonic() > self.deadline


def _time_limit(ctx: ToolContext) -> float:
    ms = ctx.session.budget.tool_timeout_ms
    return min(MAX_TOOL_SECONDS, ms / 1000) if ms else MAX_TOOL_SECONDS


async def _off_loop(ctx: ToolContext, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(stop, *args)`` in a thread; an abort tells the thread to stop at its next check."""
    stop = _Stop(_time_limit(ctx))
    try:
        return await asyncio.to_thread(fn, stop, *args)
    except asyncio.CancelledError:
        stop.aborted.set()
        raise


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


def ledger_ids(ledger_path: str | None, run_dir: str | None = None) -> frozenset[tuple[int, int]]:
    """(device, inode) of the ledger's files that exist: another name for one of them (a hard link)
    is the ledger too."""
    bases = {b for b in (ledger_path, run_dir and os.path.join(run_dir, "legion.db")) if b}
    ids = set()
    for base in bases:
        for suffix in _LEDGER_SUFFIXES:
            try:
                st = os.stat(base + suffix)
            except OSError:
                continue
            ids.add((st.st_dev, st.st_ino))
    return frozenset(ids)


def _ctx_ledger_ids(ctx: ToolContext) -> frozenset[tuple[int, int]]:
    return ledger_ids(ctx.session.ledger_path, ctx.session.run_dir)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def _not_regular(path: Path, what: str) -> ToolFailure:
    return ToolFailure(f"{path} is {what}; file tools only open regular files")


def open_regular(path: Path, flags: int, ledger: frozenset[tuple[int, int]] = frozenset()) -> int:
    """A descriptor for ``path`` if it is a regular file (and not the ledger), found without blocking:
    a FIFO, socket or device is refused before any read or write could wait on it."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO without a reader, or a socket, opened for writing
            raise _not_regular(path, "not a regular file (a FIFO or socket)") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_regular(path, _kind(st.st_mode))
        if (st.st_dev, st.st_ino) in ledger:
            raise ToolFailure(_LEDGER_REFUSAL)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _file_arg(ctx: ToolContext, raw: str) -> Path:
    """The path argument resolved against the session cwd; the ledger is refused whatever the guard allowed."""
    path = ctx.resolve(raw)
    if is_ledger_file(path):
        raise ToolFailure(_LEDGER_REFUSAL)
    return path


def _walk(root: Path, stop: _Stop, ledger: frozenset[tuple[int, int]] = frozenset()) -> Iterator[Path]:
    """Regular files under ``root`` (symlinks followed for files, not for directories), sorted per
    directory, without ``.git`` or the ledger; ends early once ``stop`` is reached."""
    pending = [root]
    while pending and not stop.reached():
        top = pending.pop()
        try:
            with os.scandir(top) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        dirs = []
        for entry in entries:
            if stop.reached():
                return
            try:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != ".git":
                        dirs.append(Path(entry.path))
                    continue
                if not entry.is_file():  # a FIFO, socket, device or dangling link: never opened
                    continue
                st = entry.stat()
            except OSError:
                continue
            path = Path(entry.path)
            if (st.st_dev, st.st_ino) not in ledger and not is_ledger_file(path):
                yield path
        pending.extend(reversed(dirs))


def _read_text(path: Path, ledger: frozenset[tuple[int, int]]) -> str:
    """The whole text file; bytes that are not UTF-8 become surrogate escapes, so it round-trips exactly."""
    fd = open_regular(path, os.O_RDONLY, ledger)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if size > MAX_EDIT_BYTES:
            raise ToolFailure(f"{path} is {size} bytes, over the {MAX_EDIT_BYTES // (1024 * 1024)} MiB edit "
                              "limit; change it with bash (e.g. sed or a script)")
        data = f.read(MAX_EDIT_BYTES + 1)
    if b"\x00" in data[:8192]:
        raise ToolFailure(f"{path} looks like a binary file; read only text files")
    return data.decode("utf-8", "surrogateescape")


def _write_bytes(path: Path, data: bytes, ledger: frozenset[tuple[int, int]]) -> None:
    """Create or overwrite a regular file; the checks come before anything is truncated."""
    fd = open_regular(path, os.O_WRONLY | os.O_CREAT, ledger)
    with os.fdopen(fd, "wb") as f:
        f.truncate(0)
        f.write(data)


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
        if not path.exists():
            raise ToolFailure(f"{path} does not exist")
        start = args.get("offset", 1) - 1
        limit = min(args.get("limit", MAX_LINES), MAX_LINES)
        # streamed in a thread: a huge file neither fills the pool's memory nor stalls its event loop
        out, end, total, counted = await _off_loop(ctx, _read_window, path, start, limit, _ctx_ledger_ids(ctx))
        if start >= total and total and counted:
            raise ToolFailure(f"offset {start + 1} is beyond the end of {path} ({total} lines)")
        if not out and not counted:
            raise ToolFailure(f"reading {path} stopped at its deadline before line {start + 1}; "
                              "the file is too large for read — use bash (e.g. sed -n)")
        text = "\n".join(out)
        if end < total or not counted:
            more = f"{total - end} more lines" if counted else "more lines (not counted: the file is too large)"
            text += f"\n[{more}; continue with offset={end + 1}]"
        return ToolResult(text, details={"path": str(path), "lines": total if counted else None})


def _read_window(stop: _Stop, path: Path, start: int, limit: int,
                 ledger: frozenset[tuple[int, int]]) -> tuple[list[str], int, int, bool]:
    """Numbered rows of lines ``[start, start+limit)`` within ``MAX_BYTES``, the index after the last row
    shown, the file's line count and whether the count is complete (it stops at the deadline) — reading
    line pieces, never the whole file (or a whole giant line)."""
    out: list[str] = []
    size, end, total, full = 0, start, 0, False
    with os.fdopen(open_regular(path, os.O_RDONLY, ledger), "rb") as f:
        if _is_binary(f):
            raise ToolFailure(f"{path} looks like a binary file; read only text files")
        for total, piece, first in _pieces(f):
            if total % 4096 == 0 and first and stop.reached():
                return out, end, total, False
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
    return out, end, total, True


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
        data = args["content"].encode("utf-8")
        await _off_loop(ctx, self._write, path, data, _ctx_ledger_ids(ctx))
        return ToolResult(f"Wrote {len(data)} bytes to {path}", details={"path": str(path)})

    @staticmethod
    def _write(stop: _Stop, path: Path, data: bytes, ledger: frozenset[tuple[int, int]]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_bytes(path, data, ledger)


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
        if not path.exists():
            raise ToolFailure(f"{path} does not exist; use write to create it")
        # a big file must not stall the pool's loop
        return await _off_loop(ctx, self._edit, path, args, _ctx_ledger_ids(ctx))

    @staticmethod
    def _edit(stop: _Stop, path: Path, args: dict[str, Any], ledger: frozenset[tuple[int, int]]) -> ToolResult:
        text = _read_text(path, ledger)
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
        _write_bytes(path, (text[:at] + new + text[at + len(old):]).encode("utf-8", "surrogateescape"), ledger)
        line = text.count("\n", 0, at) + 1
        return ToolResult(f"Edited {path} at line {line}", details={"path": str(path), "line": line})


class LsTool:
    name = "ls"
    description = ("List a directory (directories end with '/'), sorted by name; FIFOs, sockets and devices "
                   "are counted, not listed.")
    parameters: ClassVar[Schema] = {"type": "object", "additionalProperties": False, "properties": {
        "path": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        path = ctx.resolve(args.get("path") or ".")
        if not path.is_dir():
            raise ToolFailure(f"{path} is not a directory")
        limit = args.get("limit", 500)
        names, special, complete = await _off_loop(ctx, self._list, path)
        text = "\n".join(names[:limit]) or "(empty directory)"
        if len(names) > limit:
            text += f"\n[{len(names) - limit} more entries; raise limit]"
        if special:
            text += f"\n[{special} special files (FIFOs, sockets, devices) not listed]"
        if not complete:
            text += f"\n[listing stopped after {len(names)} entries; the directory is too large for ls]"
        return ToolResult(text)

    @staticmethod
    def _list(stop: _Stop, path: Path) -> tuple[list[str], int, bool]:
        """Sorted names (directories with '/'), the count of non-regular entries skipped, and whether
        the whole directory was read."""
        names: list[str] = []
        special, complete = 0, True
        with os.scandir(path) as it:
            for n, entry in enumerate(it):
                if n >= MAX_LS_ENTRIES or (n % 1024 == 0 and stop.reached()):
                    complete = False
                    break
                try:
                    if entry.is_dir():
                        names.append(entry.name + "/")
                    elif entry.is_file() or entry.is_symlink():  # a dangling link is still listed
                        names.append(entry.name)
                    else:
                        special += 1
                except OSError:
                    names.append(entry.name)
        return sorted(names), special, complete


class FindTool:
    name = "find"
    description = ("Find files whose path (relative to the search directory) matches a glob pattern, e.g. "
                   "'*.py' or 'src/**/test_*.py'. A pattern without '/' matches file names at any depth.")
    parameters: ClassVar[Schema] = {"type": "object", "additionalProperties": False, "required": ["pattern"], "properties": {
        "pattern": {"type": "string", "minLength": 1}, "path": {"type": "string"},
        "limit": {"type": "integer", "minimum": 1}}}

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        # a big walk must not stall the pool's loop
        return await _off_loop(ctx, self._find, args, ctx, _ctx_ledger_ids(ctx))

    @staticmethod
    def _find(stop: _Stop, args: dict[str, Any], ctx: ToolContext, ledger: frozenset[tuple[int, int]]) -> ToolResult:
        root = ctx.resolve(args.get("path") or ".")
        if not root.is_dir():
            raise ToolFailure(f"{root} is not a directory")
        pattern = args["pattern"]
        limit = args.get("limit", 1000)
        patterns = {pattern, pattern.replace("**/", "")}  # '**/' also matches no directory at all
        hits: list[str] = []
        for file in _walk(root, stop, ledger):
            rel = file.relative_to(root).as_posix()
            target = rel if "/" in pattern else file.name
            if any(fnmatch.fnmatchcase(target, p) or fnmatch.fnmatchcase(rel, p) for p in patterns):
                hits.append(rel)
                if len(hits) > limit:
                    break
        text = "\n".join(hits[:limit]) or f"no files match {pattern!r} under {root}"
        if len(hits) > limit:
            text += f"\n[more than {limit} matches; narrow the pattern]"
        elif stop.reached():
            text += f"\n[search stopped after {stop.seconds:g} s; narrow the path or pattern]"
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
        # a big search must not stall the pool's loop
        return await _off_loop(ctx, self._grep, args, ctx, _ctx_ledger_ids(ctx))

    @staticmethod
    def _grep(stop: _Stop, args: dict[str, Any], ctx: ToolContext, ledger: frozenset[tuple[int, int]]) -> ToolResult:
        root = ctx.resolve(args.get("path") or ".")
        source = re.escape(args["pattern"]) if args.get("literal") else args["pattern"]
        try:
            rx = re.compile(source, re.IGNORECASE if args.get("ignoreCase") else 0)
        except re.error as exc:
            raise ToolFailure(f"invalid regular expression {args['pattern']!r}: {exc}; set literal=true "
                              "to search for the text itself") from exc
        limit = args.get("limit", 200)
        if not root.exists():
            raise ToolFailure(f"{root} does not exist")
        if not root.is_dir() and not root.is_file():
            raise _not_regular(root, _kind(root.stat().st_mode))
        if root.is_file():
            os.close(open_regular(root, os.O_RDONLY, ledger))  # a single file's refusal is the result
        files = [root] if root.is_file() else _walk(root, stop, ledger)
        glob = args.get("glob")
        hits: list[str] = []
        for file in files:
            if (glob and not fnmatch.fnmatchcase(file.name, glob)) or is_ledger_file(file):
                continue
            rel = file.name if file == root else file.relative_to(root).as_posix()
            try:
                with os.fdopen(open_regular(file, os.O_RDONLY, ledger), "rb") as f:
                    if _is_binary(f):
                        continue
                    matched = 0  # line number of the last hit: one hit per line, whichever piece matched
                    for no, piece, _first in _pieces(f):
                        if stop.reached():  # every line: one regex search can cost far more than this check
                            break
                        line = _decode(piece)
                        found = rx.search(line) if matched != no else None
                        if found:
                            matched = no
                            at = max(0, found.start() - 100) if found.end() > 500 else 0  # show the match
                            hits.append(f"{rel}:{no}: {line[at:at + 500]}")
                            if len(hits) >= limit:
                                return ToolResult("\n".join(hits) +
                                                  f"\n[stopped at {limit} matches; narrow the search]")
            except (OSError, ToolFailure):  # unreadable, replaced by a FIFO meanwhile, or the ledger
                continue
        text = "\n".join(hits) or "no matches"
        if stop.reached():
            text += f"\n[search stopped after {stop.seconds:g} s; narrow the path or glob]"
        return ToolResult(text)
