"""Session transcripts in pi's session JSONL v3 format (pi-mono `packages/coding-agent/docs/session.md`).

Layout: line 1 is the header ``{"type":"session","version":3,"id":<uuid>,"timestamp":<iso>,"cwd":…}``;
every other line is an entry ``{"type":…,"id":<8 hex>,"parentId":<id|null>,"timestamp":<iso>,…}``.
legion writes ``message`` entries (pi ``AgentMessage``: ``user`` / ``assistant`` / ``toolResult``),
``model_change`` / ``thinking_level_change`` at creation, ``custom`` entries (``customType`` ``legion.*``,
not part of the LLM context — pi ignores them when building context) for audit records such as
empty-generation retries, and ``custom_message`` entries (in context, shown by pi) for marked system
notes such as "the worker restarted".

Durability: every append is one ``os.write`` of one complete line on an ``O_APPEND`` descriptor, so a
concurrent reader sees whole lines and a crash of the writing *process* never loses a line whose write
returned (the data is in the kernel page cache). ``fsync`` policy (``FsyncPolicy``): ``always`` fsyncs
after every line; ``settle`` (default) makes the file durable whenever the session settles or closes — it
only matters for a machine crash; ``never`` leaves it to the OS. With ``settle``, a worker that writes the
ledger hands that sync to its ledger writer (``Transcript.sync_through``): the writer makes every transcript
that settled meanwhile durable with one sync before its next group commit, instead of one fsync per file on
the event loop (docs/architecture.md §5, "Durability").

A torn last line (a crash mid-write of an earlier writer) is tolerated on open: it is moved to
``<file>.torn-<epoch ms>`` and the file is truncated to the last complete line before appending.

A damaged line elsewhere (not JSON, or not an object) loses only itself: every valid entry is kept, and
an entry whose ``parentId`` names an entry that is not there (its line was the damaged one) is re-attached
to the nearest earlier valid entry, so the branch through it stays whole. On open for appending, such a
file is repaired so that ``pi`` reading it sees the same conversation: the original is kept as
``<file>.damaged-<epoch ms>``, and the file is atomically replaced by the valid lines (re-attached
entries rewritten, every other line byte for byte); ``Transcript.repair`` says what was done.
"""

from __future__ import annotations

import enum
import os
import re
import secrets
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from loguru import logger

from legion.bus.protocol import valid_unicode
from legion.procs.durable import replace_file

SESSION_VERSION = 3
Entry = dict[str, Any]
Message = dict[str, Any]


class TranscriptError(Exception):
    """A transcript file is unusable (bad header, unwritable path)."""


class FsyncPolicy(enum.StrEnum):
    ALWAYS = "always"
    SETTLE = "settle"
    NEVER = "never"


def iso_now() -> str:
    """ISO-8601 UTC timestamp with milliseconds, as pi writes it."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def now_ms() -> int:
    return int(time.time() * 1000)


def create_empty(path: str | Path) -> Path:
    """Pre-create the transcript file (empty, mode 0600) before the session starts (docs/spec-conformance.md §10 item 44)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)
    return p


@dataclass
class TranscriptData:
    """A parsed transcript: header (None when the file is empty), entries, and damage found."""

    header: dict[str, Any] | None
    entries: list[Entry] = field(default_factory=list)
    torn_tail: bytes = b""
    bad_lines: list[int] = field(default_factory=list)
    reattached: dict[str, str | None] = field(default_factory=dict)  # entry id -> its new parentId

    def leaf_path(self) -> list[Entry]:
        """Entries from the root to the current leaf (the last entry), following ``parentId``."""
        return leaf_path(self.entries)


def _parse_lines(raw: bytes) -> TranscriptData:
    data = TranscriptData(header=None)
    if not raw:
        return data
    body, sep, tail = raw.rpartition(b"\n")
    if not sep:  # no newline at all: the whole content is one (possibly torn) line
        body, tail = b"", raw
    if tail:
        try:  # a complete JSON line that only lacks its newline is kept
            obj = orjson.loads(tail)
            body = body + b"\n" + tail if body else tail
            tail = b""
            del obj
        except orjson.JSONDecodeError:
            data.torn_tail = tail
    for lineno, line in enumerate(body.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            data.bad_lines.append(lineno)
            continue
        if not isinstance(obj, dict):
            data.bad_lines.append(lineno)
        elif data.header is None and obj.get("type") == "session":
            data.header = obj
        else:
            data.entries.append(obj)
    data.reattached = _reattach_orphans(data.entries)
    return data


def _reattach_orphans(entries: list[Entry]) -> dict[str, str | None]:
    """Point each entry whose parent is missing (a damaged line) at the nearest earlier valid entry;
    returns entry id -> new parentId for those changed."""
    known: set[str] = set()
    previous: str | None = None
    changed: dict[str, str | None] = {}
    for entry in entries:
        parent, eid = entry.get("parentId"), entry.get("id")
        if isinstance(parent, str) and parent not in known:
            entry["parentId"] = previous
            if isinstance(eid, str):
                changed[eid] = previous
        if isinstance(eid, str):
            known.add(eid)
            previous = eid
    return changed


@dataclass(frozen=True)
class Repair:
    """What opening a damaged transcript did: the lines dropped, the entries re-attached, the copy kept."""

    bad_lines: list[int]
    reattached: dict[str, str | None]
    original: Path

    def describe(self) -> str:
        return (f"{len(self.bad_lines)} unreadable line(s) ({', '.join(map(str, self.bad_lines[:10]))}"
                f"{', …' if len(self.bad_lines) > 10 else ''}) dropped, {len(self.reattached)} entr"
                f"{'y' if len(self.reattached) == 1 else 'ies'} re-attached; the original is kept at "
                f"{self.original}")


def _repaired_bytes(kept: bytes, data: TranscriptData) -> bytes:
    """The file's valid lines (numbered as ``_parse_lines`` numbers them), re-attached entries rewritten."""
    bad = set(data.bad_lines)
    out: list[bytes] = []
    for lineno, line in enumerate(kept.split(b"\n"), start=1):
        if lineno in bad or not line.strip():
            continue
        if data.reattached:
            obj = orjson.loads(line)
            eid = obj.get("id") if obj.get("type") != "session" else None
            if isinstance(eid, str) and eid in data.reattached:
                line = orjson.dumps({**obj, "parentId": data.reattached[eid]})
        out.append(line + b"\n")
    return b"".join(out)


def read_transcript(path: str | Path) -> TranscriptData:
    """Read a transcript leniently (never raises on content; a missing file raises FileNotFoundError)."""
    return _parse_lines(Path(path).read_bytes())


def leaf_path(entries: list[Entry]) -> list[Entry]:
    """The branch ending at the last entry, root first (pi's leaf is the last appended entry)."""
    if not entries:
        return []
    by_id = {e.get("id"): e for e in entries if isinstance(e.get("id"), str)}
    path: list[Entry] = []
    cur: Entry | None = entries[-1]
    seen: set[str] = set()
    while cur is not None:
        path.append(cur)
        pid = cur.get("parentId")
        if not isinstance(pid, str) or pid in seen:
            break
        seen.add(pid)
        cur = by_id.get(pid)
    path.reverse()
    return path


# pi's wording (coding-agent core/messages.ts), so a compacted or branched pi session reads the same here
COMPACTION_PREFIX = "The conversation history before this point was compacted into the following summary:\n\n<summary>\n"
COMPACTION_SUFFIX = "\n</summary>"
BRANCH_PREFIX = "The following is a summary of a branch that this conversation came back from:\n\n<summary>\n"
BRANCH_SUFFIX = "</summary>"


def context_messages(entries: Iterable[Entry]) -> list[Message]:
    """LLM context from a branch, as pi builds it: ``message`` entries (a user-run ``bashExecution`` as pi's
    "Ran `cmd`" text), ``custom_message`` entries as user messages, and — when pi compacted the branch — the last compaction's summary followed by the entries
    from its ``firstKeptEntryId`` on (``branch_summary`` entries become summary messages too).
    Derived summary/note messages carry a ``customType`` so they never count as turns."""
    branch = list(entries)
    compaction = next((i for i in range(len(branch) - 1, -1, -1) if branch[i].get("type") == "compaction"), None)
    out: list[Message] = []
    if compaction is not None:
        comp = branch[compaction]
        out.append(_note("compactionSummary", f"{COMPACTION_PREFIX}{comp.get('summary', '')}{COMPACTION_SUFFIX}"))
        first_kept = comp.get("firstKeptEntryId")
        kept_from = next((i for i, e in enumerate(branch[:compaction]) if e.get("id") == first_kept), compaction)
        branch = branch[kept_from:compaction] + branch[compaction + 1:]
    for e in branch:
        t = e.get("type")
        if t == "message" and isinstance(e.get("message"), dict):
            m = e["message"]
            if m.get("role") == "bashExecution":
                if not m.get("excludeFromContext"):  # pi's `!!` commands stay out of the context
                    out.append(_note("bashExecution", [{"type": "text", "text": _bash_execution_text(m)}]))
            elif m.get("role") == "custom":  # an extension message stored as a message entry (v3 role)
                out.append(_note(str(m.get("customType")), m.get("content", "")))
            else:
                out.append(m)
        elif t == "custom_message":
            out.append(_note(str(e.get("customType")), e.get("content", "")))
        elif t == "branch_summary":
            out.append(_note("branchSummary", f"{BRANCH_PREFIX}{e.get('summary', '')}{BRANCH_SUFFIX}"))
    return out


def _bash_execution_text(m: Message) -> str:
    """pi's ``bashExecutionToText``: a user-run command (``!cmd``) as the model sees it."""
    text = f"Ran `{m.get('command', '')}`\n"
    text += f"```\n{m['output']}\n```" if m.get("output") else "(no output)"
    if m.get("cancelled"):
        text += "\n\n(command cancelled)"
    elif m.get("exitCode") not in (None, 0):
        text += f"\n\nCommand exited with code {m.get('exitCode')}"
    if m.get("truncated") and m.get("fullOutputPath"):
        text += f"\n\n[Output truncated. Full output: {m['fullOutputPath']}]"
    return text


def _note(custom_type: str, content: Any) -> Message:
    return {"role": "user", "content": content, "timestamp": now_ms(), "customType": custom_type}


def text_of(message: Message) -> str:
    """Concatenated text blocks of a message (string content counts as one text block)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content
                       if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str))
    return ""


def user_texts_last_turns(path: str | Path, turns: int = 20) -> list[str]:
    """User texts of the last ``turns`` turns — the DELIVERED criterion input (docs/spec-conformance.md §6.3).

    A turn starts at a user message that follows a non-user message (consecutive user messages, e.g.
    several steers consumed at one boundary, belong to one turn). Marked system notes are not turns.
    """
    if turns <= 0:
        return []
    msgs = [m for m in context_messages(read_transcript(path).leaf_path()) if not m.get("customType")]
    groups: list[list[str]] = []
    previous_user = False
    for m in msgs:
        is_user = m.get("role") == "user"
        if is_user:
            if not previous_user:
                groups.append([])
            groups[-1].append(text_of(m))
        previous_user = is_user
    return [text for group in groups[-turns:] for text in group]


@dataclass(frozen=True)
class HeaderRepair:
    """What `repair_header` did: the header it wrote and where the damaged original is kept."""

    header: dict[str, Any]
    original: Path
    dropped_first_line: bool

    def describe(self) -> str:
        first = "its unreadable first line replaced" if self.dropped_first_line else "the missing header added"
        return f"header rebuilt ({first}, session id {self.header['id']}); the original is kept at {self.original}"


_UUID = re.compile(rb'"id"\s*:\s*"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"')
_STAMP = re.compile(rb'"timestamp"\s*:\s*"(\d{4}-\d\d-\d\dT[0-9:.]+Z)"')


def repair_header(path: str | Path, *, cwd: str) -> HeaderRepair | None:
    """Rebuild a transcript's damaged or missing header (its first line) so that it can be continued.

    The header holds only the format version, the session id, its creation time and the session's cwd:
    `cwd` comes from the caller (the ledger's record of the node), the id and time are salvaged from the
    damaged line when they can be read in it, else a new id and the first entry's time. The original is kept
    as ``<file>.damaged-<ms>``; the file is replaced atomically. Returns None when the header is intact or the
    file is empty or missing; raises TranscriptError when the file cannot be read or written, or when not one entry of
    the conversation survives (a header alone would silently start it over)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        return None  # never created (its root died before the session started): it starts afresh
    except OSError as exc:
        raise TranscriptError(f"cannot read {p}: {exc.strerror or exc}") from exc
    data = _parse_lines(raw)
    if data.header is not None or not raw.strip():
        return None
    if not data.entries:
        raise TranscriptError(f"{p} has no readable entry: its header and conversation are damaged beyond repair "
                              f"(kept as it is; its node cannot be continued — relaunch its task)")
    first, _, rest = raw.partition(b"\n")
    dropped = 1 in data.bad_lines
    salvaged_id = _UUID.search(first) if dropped else None
    salvaged_at = _STAMP.search(first) if dropped else None
    first_entry_at = data.entries[0].get("timestamp")
    header = {"type": "session", "version": SESSION_VERSION,
              "id": salvaged_id.group(1).decode() if salvaged_id else str(uuid.uuid4()),
              "timestamp": (salvaged_at.group(1).decode() if salvaged_at
                            else first_entry_at if isinstance(first_entry_at, str) else iso_now()),
              "cwd": cwd}
    body = rest if dropped else raw
    original = p.with_name(f"{p.name}.damaged-{now_ms()}")
    try:
        replace_file(original, raw)
        replace_file(p, orjson.dumps(header) + b"\n" + body, prefix=f"{p.name}.repair-")
    except OSError as exc:
        raise TranscriptError(f"cannot rewrite {p} with a repaired header: {exc.strerror or exc}") from exc
    repair = HeaderRepair(header, original, dropped)
    logger.warning("transcript {}: {}", p, repair.describe())
    return repair


class Transcript:
    """An open, appendable transcript file (one per session)."""

    def __init__(self, path: Path, fd: int, data: TranscriptData, fsync: FsyncPolicy) -> None:
        self.path = path
        self._fd = fd
        self.header: dict[str, Any] = data.header or {}
        self.entries: list[Entry] = data.entries
        self._ids = {e["id"] for e in self.entries if isinstance(e.get("id"), str)}
        self.leaf_id: str | None = self.entries[-1].get("id") if self.entries else None
        self._context: list[Message] = context_messages(leaf_path(self.entries))  # appends keep it current
        self.fsync = fsync
        self.resumed = bool(data.entries)
        self.recovered_torn = data.torn_tail
        self.repair: Repair | None = None
        self._defer_sync: Callable[[Path], bool] | None = None  # `sync_through`
        # written since its last sync (at open: what an earlier process wrote may not be on disk yet); a settled
        # session's transcript is synced at its settle, and its close (parking) then has nothing to sync
        self._unsynced = True

    @classmethod
    def open(cls, path: str | Path, *, cwd: str, provider: str | None = None, model_id: str | None = None,
             thinking: str | None = None, fsync: FsyncPolicy = FsyncPolicy.SETTLE,
             session_id: str | None = None) -> Transcript:
        """Open (creating if absent) and continue a transcript; write the header if the file is empty."""
        p = Path(path)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(p, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            raise TranscriptError(f"cannot open transcript {p}: {exc.strerror}; check the directory exists "
                                  "and is writable") from exc
        try:
            raw = p.read_bytes()
            data = _parse_lines(raw)
            if data.torn_tail:
                cls._quarantine_tail(p, fd, len(raw) - len(data.torn_tail), data.torn_tail)
            kept = raw[: len(raw) - len(data.torn_tail)]
            if kept.strip() and data.header is None:
                raise TranscriptError(f"{p} is not a pi session file (first line is not a "
                                      '{"type":"session"} header); refusing to append to it')
            repair = None
            if data.bad_lines or data.reattached:
                fd, repair = cls._repair(p, fd, kept, data)
            elif kept and not kept.endswith(b"\n"):
                os.write(fd, b"\n")  # a complete last line without newline: terminate it
            t = cls(p, fd, data, fsync)
            t.repair = repair
            if data.header is None:
                t._write_header(cwd, session_id)
                if provider and model_id:
                    t.append({"type": "model_change", "provider": provider, "modelId": model_id})
                if thinking:
                    t.append({"type": "thinking_level_change", "thinkingLevel": thinking})
            return t
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def _repair(p: Path, fd: int, kept: bytes, data: TranscriptData) -> tuple[int, Repair]:
        """Keep the damaged file as ``<file>.damaged-<ms>`` and atomically replace it by its valid lines;
        returns a descriptor on the new file and what was done."""
        original = p.with_name(f"{p.name}.damaged-{now_ms()}")
        replace_file(original, kept)
        replace_file(p, _repaired_bytes(kept, data), prefix=f"{p.name}.repair-")
        new_fd = os.open(p, os.O_RDWR | os.O_APPEND, 0o600)
        os.close(fd)
        repair = Repair(list(data.bad_lines), dict(data.reattached), original)
        logger.warning("transcript {}: {}", p, repair.describe())
        return new_fd, repair

    @staticmethod
    def _quarantine_tail(p: Path, fd: int, keep: int, tail: bytes) -> None:
        replace_file(p.with_name(f"{p.name}.torn-{now_ms()}"), tail)  # on disk before the tail is cut off
        os.ftruncate(fd, keep)

    def _write_header(self, cwd: str, session_id: str | None) -> None:
        self.header = {"type": "session", "version": SESSION_VERSION, "id": session_id or str(uuid.uuid4()),
                       "timestamp": iso_now(), "cwd": cwd}
        self._write_line(self.header)

    def _write_line(self, obj: dict[str, Any]) -> None:
        if self._fd < 0:
            raise TranscriptError(f"transcript {self.path} is closed (its session was disposed); not appending")
        try:
            line = orjson.dumps(obj) + b"\n"
        except orjson.JSONEncodeError:  # surrogates (e.g. an emoji split across stream chunks): repair them
            line = orjson.dumps(valid_unicode(obj)) + b"\n"
        view = memoryview(line)
        self._unsynced = True
        while view:  # regular files take the whole buffer in one write; the loop is for the pathological case
            n = os.write(self._fd, view)
            view = view[n:]
        if self.fsync is FsyncPolicy.ALWAYS:
            os.fsync(self._fd)
            self._unsynced = False

    def _new_id(self) -> str:
        while True:
            eid = secrets.token_hex(4)
            if eid not in self._ids:
                self._ids.add(eid)
                return eid

    def append(self, entry: dict[str, Any]) -> str:
        """Append one entry (``type`` and payload given; ``id``/``parentId``/``timestamp`` filled); return its id."""
        eid = self._new_id()
        full = {"type": entry["type"], "id": eid, "parentId": self.leaf_id, "timestamp": iso_now()}
        full.update({k: v for k, v in entry.items() if k != "type"})
        self._write_line(full)
        self.entries.append(full)
        self.leaf_id = eid
        if full["type"] in ("compaction", "branch_summary"):  # they reshape the whole context
            self._context = context_messages(leaf_path(self.entries))
        else:
            self._context.extend(context_messages((full,)))
        return eid

    def append_message(self, message: Message) -> str:
        return self.append({"type": "message", "message": message})

    def append_custom(self, custom_type: str, data: dict[str, Any]) -> str:
        """Audit record outside the LLM context (pi ignores ``custom`` entries when building context)."""
        return self.append({"type": "custom", "customType": custom_type, "data": data})

    def append_note(self, custom_type: str, text: str, details: dict[str, Any] | None = None) -> str:
        """A marked system note that *is* part of the context (pi ``custom_message``, displayed)."""
        entry: dict[str, Any] = {"type": "custom_message", "customType": custom_type, "content": text,
                                 "display": True}
        if details is not None:
            entry["details"] = details
        return self.append(entry)

    def messages(self) -> list[Message]:
        """The LLM context of the current branch (a fresh list; the messages themselves are shared)."""
        return list(self._context)

    def sync_through(self, take: Callable[[Path], bool] | None) -> None:
        """Hand the settle-time syncs to `take(path)` (a ledger writer's batch) instead of an fsync here; `take`
        returns False when it cannot (its writer is closed): the file is fsynced in place then."""
        self._defer_sync = take

    def sync(self) -> None:
        """Make every line written so far durable (nothing to do when none was written since the last sync)."""
        if self._fd < 0 or self.fsync is FsyncPolicy.NEVER or not self._unsynced:
            return
        self._unsynced = False  # before the hand-over: a line written after it marks the file again
        if self.fsync is FsyncPolicy.SETTLE and self._defer_sync is not None and self._defer_sync(self.path):
            return
        try:
            os.fsync(self._fd)
        except OSError:
            self._unsynced = True
            raise

    def close(self) -> None:
        if self._fd >= 0:
            try:
                self.sync()
            finally:
                os.close(self._fd)
                self._fd = -1

    @property
    def closed(self) -> bool:
        return self._fd < 0


def derive_outcome(path: str | Path) -> str:
    """success | failed | truncated | aborted | unknown — see ``legion.workers.outcome`` (re-exported here)."""
    from legion.workers.outcome import derive_outcome as _derive

    return _derive(path)
