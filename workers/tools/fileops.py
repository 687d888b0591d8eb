"""The file tools' work (``read``, ``write``, ``edit``, ``ls``, ``find``, ``grep``), run in a helper process.

A regular expression can backtrack for hours inside one ``re`` call, which holds the GIL, and a
``read()`` can block in the kernel for ever (``/proc/kmsg``, a tracefs ``trace_pipe``, a hung FUSE or
NFS mount): neither can be stopped from inside the process doing it. So this work never runs in a
process that hosts sessions: ``executor.ToolExecutor`` runs it here, in a warm helper process
(``python -I -S fileops.py``) that it SIGKILLs at the call's deadline (see ``executor``). The module
uses the standard library only, so the helper starts in a few milliseconds and runs exactly this code.

Bounded by construction as well: only regular files are opened, checked without blocking
(``O_NONBLOCK`` + ``fstat``), so a FIFO, socket or device never hangs a call, and reads stay
non-blocking, so a kernel stream that honours ``O_NONBLOCK`` is refused at once ("blocks on read")
instead of waiting for the deadline; walks skip non-regular entries and files that block; work
stops by itself at the call's deadline (``seconds``) with what it found, and the executor's kill is
the backstop for what cannot stop.

Helper protocol on stdin/stdout: frames of a 4-byte big-endian length and a JSON body. The helper
first sends an empty frame (ready); each request ``{"op", "args", "cwd", "seconds", "ledgerPath",
"runDir"}`` gets one reply (``serve``). EOF on stdin ends it.
"""

from __future__ import annotations

import errno
import fnmatch
import io
import json
import os
import re
import stat
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

MAX_LINES = 2000
MAX_BYTES = 50 * 1024
MAX_LINE_CHARS = 2000  # longer lines are shown cut, marked "[line truncated]"
MAX_EDIT_BYTES = 16 * 1024 * 1024  # edit reads the whole file; larger files are refused
MAX_LS_ENTRIES = 100_000  # directory entries read by one ls call
_PIECE_BYTES = 64 * 1024  # longest line piece read at once; the rest of a longer line is skipped
_LEDGER_NAMES = {"legion.db", "legion.db-wal", "legion.db-shm", "legion.db-journal"}
_LEDGER_SUFFIXES = ("", "-wal", "-shm", "-journal")
LEDGER_REFUSAL = "direct access to the legion ledger (legion.db) is refused; use the legion tools"
Ledger = frozenset[tuple[int, int]]


class ToolFailure(Exception):
    """An expected tool error; its message is shown to the model as the tool result."""


class WouldBlock(ToolFailure):
    """A regular file whose read would block: a kernel stream, not a file that ends."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"{path} blocks on read: it is a stream (a kernel interface such as /proc/kmsg or a "
                         "trace_pipe), not a file that ends; file tools read only files that end — use bash with "
                         f"a timeout (e.g. timeout 2 head -c 4096 {path})")


class Stop:
    """When the work must stop: the call's deadline passed."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def reached(self) -> bool:
        return time.monotonic() > self.deadline


class Job:
    """One call: its session cwd, its deadline and the ledger's (device, inode) pairs."""

    def __init__(self, cwd: str, seconds: float, ledger: Ledger = frozenset()) -> None:
        self.cwd = cwd
        self.stop = Stop(seconds)
        self.ledger = ledger

    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else Path(self.cwd) / p

    def file_arg(self, raw: str) -> Path:
        """The path argument resolved against the cwd; the ledger is refused whatever the guard allowed."""
        path = self.resolve(raw)
        if is_ledger_file(path):
            raise ToolFailure(LEDGER_REFUSAL)
        return path


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


def ledger_ids(ledger_path: str | None, run_dir: str | None = None) -> Ledger:
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


def kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def not_regular(path: Path, what: str) -> ToolFailure:
    return ToolFailure(f"{path} is {what}; file tools only open regular files")


def open_regular(path: Path, flags: int, ledger: Ledger = frozenset(), *, blocking: bool = True) -> int:
    """A descriptor for ``path`` if it is a regular file (and not the ledger), found without blocking:
    a FIFO, socket or device is refused before any read or write could wait on it. ``blocking=False``
    keeps ``O_NONBLOCK`` set (see ``open_reader``)."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO without a reader, or a socket, opened for writing
            raise not_regular(path, "not a regular file (a FIFO or socket)") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(path, kind(st.st_mode))
        if (st.st_dev, st.st_ino) in ledger:
            raise ToolFailure(LEDGER_REFUSAL)
        if blocking:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _NonBlockingFile(io.RawIOBase):
    """A regular file read with ``O_NONBLOCK`` kept: a read that would block raises ``WouldBlock``.

    A file on disk ignores ``O_NONBLOCK``; a kernel stream that is a "regular file" (``/proc/kmsg``,
    tracefs ``trace_pipe``) answers EAGAIN instead of blocking, so it is refused at once."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd, self.path = fd, path

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def readinto(self, buffer: Any) -> int:
        try:
            return os.readv(self.fd, [buffer])
        except BlockingIOError:
            raise WouldBlock(self.path) from None

    def close(self) -> None:
        if not self.closed:
            os.close(self.fd)
        super().close()


def open_reader(path: Path, ledger: Ledger) -> io.BufferedReader:
    """A buffered reader of a regular file whose reads never block (see ``_NonBlockingFile``)."""
    return io.BufferedReader(_NonBlockingFile(open_regular(path, os.O_RDONLY, ledger, blocking=False), path),
                             _PIECE_BYTES)


def _walk(root: Path, stop: Stop, ledger: Ledger = frozenset()) -> Iterator[Path]:
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


def _is_binary(f: io.BufferedReader) -> bool:
    """A NUL byte in the first 8 KB; peeked, so the file stays at its start (and need not be seekable)."""
    return b"\x00" in f.peek(8192)[:8192]


def _pieces(f: io.BufferedReader) -> Iterator[tuple[int, bytes, bool]]:
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


def _read_text(path: Path, ledger: Ledger) -> str:
    """The whole text file; bytes that are not UTF-8 become surrogate escapes, so it round-trips exactly."""
    with open_reader(path, ledger) as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_EDIT_BYTES:
            raise ToolFailure(f"{path} is {size} bytes, over the {MAX_EDIT_BYTES // (1024 * 1024)} MiB edit "
                              "limit; change it with bash (e.g. sed or a script)")
        data = f.read(MAX_EDIT_BYTES + 1)
    if b"\x00" in data[:8192]:
        raise ToolFailure(f"{path} looks like a binary file; read only text files")
    return data.decode("utf-8", "surrogateescape")


def _write_bytes(path: Path, data: bytes, ledger: Ledger) -> None:
    """Create or overwrite a regular file; the checks come before anything is truncated."""
    fd = open_regular(path, os.O_WRONLY | os.O_CREAT, ledger)
    with os.fdopen(fd, "wb") as f:
        f.truncate(0)
        f.write(data)


# ---- the operations: (arguments, job) -> (text, details); a ToolFailure is the error result -------------

Reply = tuple[str, dict[str, Any] | None]


def op_read(args: dict[str, Any], job: Job) -> Reply:
    path = job.file_arg(args["path"])
    if not path.exists():
        raise ToolFailure(f"{path} does not exist")
    start = args.get("offset", 1) - 1
    limit = min(args.get("limit", MAX_LINES), MAX_LINES)
    out, end, total, counted = _read_window(job.stop, path, start, limit, job.ledger)
    if start >= total and total and counted:
        raise ToolFailure(f"offset {start + 1} is beyond the end of {path} ({total} lines)")
    if not out and not counted:
        raise ToolFailure(f"reading {path} stopped at its deadline before line {start + 1}; "
                          "the file is too large for read — use bash (e.g. sed -n)")
    text = "\n".join(out)
    if end < total or not counted:
        more = f"{total - end} more lines" if counted else "more lines (not counted: the file is too large)"
        text += f"\n[{more}; continue with offset={end + 1}]"
    return text, {"path": str(path), "lines": total if counted else None}


def _read_window(stop: Stop, path: Path, start: int, limit: int,
                 ledger: Ledger) -> tuple[list[str], int, int, bool]:
    """Numbered rows of lines ``[start, start+limit)`` within ``MAX_BYTES``, the index after the last row
    shown, the file's line count and whether the count is complete (it stops at the deadline) — reading
    line pieces, never the whole file (or a whole giant line)."""
    out: list[str] = []
    size, end, total, full = 0, start, 0, False
    with open_reader(path, ledger) as f:
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


def op_write(args: dict[str, Any], job: Job) -> Reply:
    path = job.file_arg(args["path"])
    data = args["content"].encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_bytes(path, data, job.ledger)
    return f"Wrote {len(data)} bytes to {path}", {"path": str(path)}


def op_edit(args: dict[str, Any], job: Job) -> Reply:
    path = job.file_arg(args["path"])
    if not path.exists():
        raise ToolFailure(f"{path} does not exist; use write to create it")
    text = _read_text(path, job.ledger)
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
    _write_bytes(path, (text[:at] + new + text[at + len(old):]).encode("utf-8", "surrogateescape"), job.ledger)
    line = text.count("\n", 0, at) + 1
    return f"Edited {path} at line {line}", {"path": str(path), "line": line}


def op_ls(args: dict[str, Any], job: Job) -> Reply:
    path = job.resolve(args.get("path") or ".")
    if not path.is_dir():
        raise ToolFailure(f"{path} is not a directory")
    limit = args.get("limit", 500)
    names: list[str] = []
    special, complete = 0, True
    with os.scandir(path) as it:
        for n, entry in enumerate(it):
            if n >= MAX_LS_ENTRIES or (n % 1024 == 0 and job.stop.reached()):
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
    names.sort()
    text = "\n".join(names[:limit]) or "(empty directory)"
    if len(names) > limit:
        text += f"\n[{len(names) - limit} more entries; raise limit]"
    if special:
        text += f"\n[{special} special files (FIFOs, sockets, devices) not listed]"
    if not complete:
        text += f"\n[listing stopped after {len(names)} entries; the directory is too large for ls]"
    return text, None


def op_find(args: dict[str, Any], job: Job) -> Reply:
    root = job.resolve(args.get("path") or ".")
    if not root.is_dir():
        raise ToolFailure(f"{root} is not a directory")
    pattern = args["pattern"]
    limit = args.get("limit", 1000)
    patterns = {pattern, pattern.replace("**/", "")}  # '**/' also matches no directory at all
    hits: list[str] = []
    for file in _walk(root, job.stop, job.ledger):
        rel = file.relative_to(root).as_posix()
        target = rel if "/" in pattern else file.name
        if any(fnmatch.fnmatchcase(target, p) or fnmatch.fnmatchcase(rel, p) for p in patterns):
            hits.append(rel)
            if len(hits) > limit:
                break
    text = "\n".join(hits[:limit]) or f"no files match {pattern!r} under {root}"
    if len(hits) > limit:
        text += f"\n[more than {limit} matches; narrow the pattern]"
    elif job.stop.reached():
        text += f"\n[search stopped after {job.stop.seconds:g} s; narrow the path or pattern]"
    return text, None


def op_grep(args: dict[str, Any], job: Job) -> Reply:
    stop, ledger = job.stop, job.ledger
    root = job.resolve(args.get("path") or ".")
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
        raise not_regular(root, kind(root.stat().st_mode))
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
            with open_reader(file, ledger) as f:
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
                            return "\n".join(hits) + f"\n[stopped at {limit} matches; narrow the search]", None
        except WouldBlock:
            if file == root:  # the one file asked for: say why nothing was searched
                raise
            continue  # a kernel stream met in a walk (grep x /proc): skipped like a FIFO
        except (OSError, ToolFailure):  # unreadable, replaced by a FIFO meanwhile, or the ledger
            continue
    text = "\n".join(hits) or "no matches"
    if stop.reached():
        text += f"\n[search stopped after {stop.seconds:g} s; narrow the path or glob]"
    return text, None


OPS: dict[str, Callable[[dict[str, Any], Job], Reply]] = {
    "read": op_read, "write": op_write, "edit": op_edit, "ls": op_ls, "find": op_find, "grep": op_grep}


def serve(request: dict[str, Any]) -> dict[str, Any]:
    """Run one request; every outcome is a JSON-able reply (``ok`` with text and details, or the error)."""
    try:
        job = Job(request["cwd"], float(request["seconds"]),
                  ledger_ids(request.get("ledgerPath"), request.get("runDir")))
        text, details = OPS[request["op"]](request["args"], job)
        return {"ok": True, "text": text, "details": details}
    except ToolFailure as exc:
        return {"ok": False, "failure": str(exc)}
    except UnicodeEncodeError as exc:
        return {"ok": False, "unicode": [exc.reason, exc.start]}
    except OSError as exc:
        return {"ok": False, "oserror": [exc.errno, exc.strerror or str(exc),
                                         None if exc.filename is None else str(exc.filename)]}
    except Exception as exc:  # a bug: reported, the helper lives on
        return {"ok": False, "internal": traceback.format_exception_only(type(exc), exc)[-1].strip()}


def write_frame(out: Any, body: bytes) -> None:
    out.write(len(body).to_bytes(4, "big") + body)
    out.flush()


def _read_exact(inp: Any, n: int) -> bytes | None:
    data = inp.read(n)
    return data if len(data) == n else None


def main() -> None:
    """The helper: serve requests from stdin until EOF."""
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames may reach the parent's pipe
    write_frame(out, b"")
    while (head := _read_exact(inp, 4)) is not None:
        body = _read_exact(inp, int.from_bytes(head, "big"))
        if body is None:
            return
        write_frame(out, json.dumps(serve(json.loads(body))).encode())


if __name__ == "__main__":
    main()
