"""`legion summary` and `legion timing`: per-node figures of a run from its ledger, transcripts and events.

Summary: role, model label, status, phase, turns, tool calls, tokens, cost, wall time, the final output's
first lines, and the branch and commit of a node's worktree. Timing: generation (each assistant message's
time since the message before it), tool (each tool result's time since the message before it), wall (the
time the node was active: its spans in the ledger's events, launched/resumed → settled/failed/retired/
abandoned or now while live, joined with the intervals counted as generation or tool) and waiting (the
rest of wall: idle between runs, waiting on children or input).

All figures are intervals on one timeline, the host's epoch clock, and a node's figures are combined as
intervals, never as totals from two sources: the ledger stamps a launch or a settle when the root's writer
commits it, which trails the worker (it may already be generating) by milliseconds, or seconds under load,
so the ledger's spans alone can be shorter than the work the transcript shows. Hence wall is the union of
both, and wall = generation + tool + waiting with waiting ≥ 0 for every node. Read-only; a finished
or a live run alike. Transcripts are parsed once per (size, mtime) and the figures cached in the run
directory (`.report-cache.json`), so a repeated report of a 300-node run reads only what changed.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from legion.ledger.constants import (
    NODE_ABANDONED,
    NODE_FAILED,
    NODE_LAUNCHED,
    NODE_RESUMED,
    NODE_RETIRED,
    NODE_SETTLED,
)
from legion.procs.durable import replace_file
from legion.reports import fastread
from legion.reports.costs import cost_text, unknown_note
from legion.reports.views import plural, printable
from legion.runs import open_run_ledger

CACHE_FILE = ".report-cache.json"
CACHE_VERSION = 3  # 3: the cache figures
START_EVENTS = frozenset({NODE_LAUNCHED, NODE_RESUMED})
END_EVENTS = frozenset({NODE_SETTLED, NODE_FAILED, NODE_RETIRED, NODE_ABANDONED})
FINAL_LINES = 3


@dataclass
class TranscriptStats:
    turns: int = 0
    tool_calls: int = 0
    generation_ms: int = 0
    tool_ms: int = 0
    first_ms: int | None = None
    last_ms: int | None = None
    final_text: str = ""
    cache_read: int = 0  # prompt tokens read from the provider's cache, over the assistant messages
    cache_write: int = 0  # prompt tokens written to it
    # the generation and tool intervals as [start, end] ms, contiguous ones merged (a handful per prompt)
    busy: list[list[int]] = field(default_factory=list)


@dataclass
class NodeReport:
    name: str
    parent: str | None
    depth: int
    role: str
    model: str | None
    status: str
    phase: str | None
    turns: int
    tool_calls: int
    tokens_in: int
    tokens_out: int
    cost_usd: float  # of the calls whose price is known
    wall_s: float
    generation_s: float
    tool_s: float
    waiting_s: float
    final: list[str] = field(default_factory=list)
    branch: str | None = None
    sha: str | None = None
    unknown_cost_tokens: int = 0  # tokens of calls whose price is unknown: the cost is then `cost_usd` + unknown
    bad: list[str] = field(default_factory=list)  # warnings about damaged ledger values (counted as 0 / skipped)
    id: str = ""  # the node's id (its ledger key; `name` is what the tree calls it)
    cache_read: int = 0  # prompt tokens read from the provider's cache (from the transcript)
    cache_write: int = 0  # prompt tokens written to it


def transcript_stats(path: Path) -> TranscriptStats:
    """One pass over a transcript file (malformed lines are skipped: a report never fails on one)."""
    stats = TranscriptStats()
    try:
        raw = path.read_bytes()
    except OSError:
        return stats
    previous: int | None = None

    def count(start: int, end: int) -> int:
        """Count [start, end] as busy; its length (0 if the clock went back: intervals never overlap)."""
        if end <= start:
            return 0
        if stats.busy and stats.busy[-1][1] == start:
            stats.busy[-1][1] = end
        else:
            stats.busy.append([start, end])
        return end - start

    for line in raw.splitlines():
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(entry, dict):
            continue
        if entry.get("type") in ("custom", "custom_message"):
            # a restart note or a cut: the clock restarts here (downtime is no generation time)
            restart = _iso_ms(entry.get("timestamp"))
            if restart is not None:
                previous = restart if previous is None else max(previous, restart)
            continue
        if entry.get("type") != "message":
            continue
        msg = entry.get("message")
        if not isinstance(msg, dict):
            continue
        ts = msg.get("timestamp")
        if not isinstance(ts, int):
            continue
        stats.first_ms = ts if stats.first_ms is None else stats.first_ms
        stats.last_ms = ts
        role = msg.get("role")
        if role == "assistant":
            stats.turns += 1
            raw_content = msg.get("content")
            content: list[Any] = raw_content if isinstance(raw_content, list) else []
            stats.tool_calls += sum(1 for c in content if isinstance(c, dict) and c.get("type") == "toolCall")
            _add_cache(stats, msg.get("usage"))
            text = "".join(c.get("text", "") for c in content if isinstance(c, dict) and c.get("type") == "text")
            stats.final_text = text  # the last turn's output (as workers/outcome.py reads it)
            if previous is not None:
                stats.generation_ms += count(previous, ts)
        elif role == "toolResult" and previous is not None:
            stats.tool_ms += count(previous, ts)
        previous = ts if previous is None else max(previous, ts)
    return stats


def _add_cache(stats: TranscriptStats, usage: Any) -> None:
    """An assistant message's cache figures (a malformed usage counts as none)."""
    if isinstance(usage, dict):
        for key, attr in (("cacheRead", "cache_read"), ("cacheWrite", "cache_write")):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                setattr(stats, attr, getattr(stats, attr) + value)


def _iso_ms(value: Any) -> int | None:
    if not isinstance(value, str):
        return None
    try:
        return int(datetime.fromisoformat(value).timestamp() * 1000)
    except ValueError:
        return None


class _Cache:
    """Transcript figures by path, valid while the file's size and mtime are unchanged."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / CACHE_FILE
        self.entries: dict[str, Any] = {}
        self.dirty = False
        with contextlib.suppress(OSError, orjson.JSONDecodeError, AttributeError):
            data = orjson.loads(self.path.read_bytes())
            if isinstance(data, dict) and data.get("version") == CACHE_VERSION:
                self.entries = dict(data.get("files") or {})

    def stats(self, transcript: Path) -> TranscriptStats:
        try:
            st = transcript.stat()
        except OSError:
            return TranscriptStats()
        key = [st.st_size, st.st_mtime_ns]
        hit = self.entries.get(str(transcript))
        if isinstance(hit, dict) and hit.get("key") == key:
            with contextlib.suppress(TypeError):
                return TranscriptStats(**hit["stats"])
        stats = transcript_stats(transcript)
        self.entries[str(transcript)] = {"key": key, "stats": asdict(stats)}
        self.dirty = True
        return stats

    def save(self) -> None:
        if not self.dirty:
            return
        with contextlib.suppress(OSError):  # a cache that cannot be written only costs time
            replace_file(self.path, orjson.dumps({"version": CACHE_VERSION, "files": self.entries}), durable=False)


def _span_intervals(events: list[tuple[str, int]], now_ms: int) -> list[list[int]]:
    """The [start, end] ms intervals between start and end events (an open one runs until now)."""
    out, started = [], None
    for type_, ts in events:
        if type_ in START_EVENTS:
            started = ts if started is None else started
        elif type_ in END_EVENTS and started is not None:
            out.append([started, max(started, ts)])
            started = None
    if started is not None:
        out.append([started, max(started, now_ms)])
    return out


def _measure(intervals: list[list[int]]) -> int:
    """Milliseconds covered by the union of [start, end] intervals."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def git_head(worktree: str | None) -> tuple[str | None, str | None]:
    """(branch, sha) of a worktree's HEAD, read from the files (no git process per node)."""
    if not worktree:
        return None, None
    git = Path(worktree) / ".git"
    try:
        gitdir = git if git.is_dir() else Path(git.read_text().split("gitdir:", 1)[1].strip())
        if not gitdir.is_absolute():
            gitdir = (Path(worktree) / gitdir).resolve()
        head = (gitdir / "HEAD").read_text().strip()
    except (OSError, IndexError):
        return None, None
    if not head.startswith("ref:"):
        return None, head or None
    ref = head[4:].strip()
    branch = ref.removeprefix("refs/heads/")
    common = gitdir
    with contextlib.suppress(OSError):
        common = (gitdir / (gitdir / "commondir").read_text().strip()).resolve()
    for base in (gitdir, common):
        with contextlib.suppress(OSError):
            return branch, (base / ref).read_text().strip()
    with contextlib.suppress(OSError):
        for line in (common / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return branch, line.split(" ", 1)[0]
    return branch, None


def run_report(run_dir: Path, name: str | None = None, *, now_ms: int | None = None) -> list[NodeReport]:
    """One report per node of the run (tree order), or only `name` and its subtree."""
    from legion.reports.views import _tree_order, is_operator_row

    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    with fastread.connect_run(run_dir) as conn:
        if conn is not None:
            rows = fastread.nodes(conn)
            usage = fastread.usage(conn)
            events = fastread.node_events(conn, START_EVENTS | END_EVENTS)
        else:
            rows, usage, events = _through_ledger(run_dir)
    rows = _tree_order(_with_root_session(run_dir, [r for r in rows if not is_operator_row(r)]))
    if name is not None:
        rows = _subtree(rows, name)
    cache = _Cache(run_dir)
    reports = [_node_report(row, usage.get(row["id"]) or {}, events.get(row["id"], []), cache, now_ms)
               for row in rows]
    cache.save()
    return reports


def _with_root_session(run_dir: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A rebuilt ledger has no root session file (a rebuild limit); run.json's sessionFile names it."""
    if all(row.get("session_file") or row.get("parent_id") for row in rows):
        return rows
    try:
        session = orjson.loads((run_dir / "run.json").read_bytes()).get("sessionFile")
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return rows
    return [{**row, "session_file": session} if not row.get("session_file") and not row.get("parent_id") else row
            for row in rows]


def _through_ledger(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, list[tuple[str, int]]]]:
    """The slow path for a ledger of another schema version (migrated if older; a newer one raises)."""
    ledger = open_run_ledger(run_dir)
    try:
        rows = ledger.list_nodes()
        usage = {row["id"]: ledger.get_usage(row["id"]) or {} for row in rows}
        events: dict[str, list[tuple[str, int]]] = {}
        cursor = 0
        while batch := ledger.events_after(cursor, limit=5000):
            for ev in batch:
                if ev.node_id and (ev.type in START_EVENTS or ev.type in END_EVENTS):
                    events.setdefault(ev.node_id, []).append((ev.type, ev.ts))
            cursor = batch[-1].id
        return rows, usage, events
    finally:
        ledger.close()


def _subtree(rows: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    keep = {name}
    out = []
    for row in rows:  # tree order: parents first
        if row["id"] in keep or row.get("parent_id") in keep:
            keep.add(row["id"])
            out.append(row)
    return out


def _node_report(row: dict[str, Any], usage: dict[str, Any], events: list[tuple[str, int]], cache: _Cache,
                 now_ms: int) -> NodeReport:
    from legion.reports.views import as_number, bad_value_lines

    bad = bad_value_lines("nodes", row.get("id"), row, ("depth",), "0")
    bad += bad_value_lines("usage", row.get("id"), usage,
                           ("tokens_in", "tokens_out", "cost_usd", "unknown_cost_tokens"), "'?' (counted as 0)")
    usage = {k: (v if as_number(v) is not None else None) for k, v in usage.items()}
    timed = [(t, ts) for t, ts in events if as_number(ts) is not None]
    if len(timed) != len(events):
        bad.append(f"⚠ ledger rows events[{printable(row.get('id'))}]: {len(events) - len(timed)} lifecycle event(s) "
                   "without a numeric ts; left out of the wall time")
    session = row.get("session_file")
    stats = cache.stats(Path(session)) if isinstance(session, str) and session else TranscriptStats()
    worktree = row.get("worktree_path")
    branch, sha = git_head(worktree if isinstance(worktree, str) else None)
    gen, tool = stats.generation_ms, stats.tool_ms
    wall = _measure(_span_intervals(timed, now_ms) + stats.busy)  # ≥ gen + tool: see the module docstring
    lines = [line for line in stats.final_text.strip().splitlines() if line.strip()][:FINAL_LINES]
    return NodeReport(
        name=str(row["name"]), parent=row.get("parent_id"), depth=int(as_number(row.get("depth")) or 0),
        role=str(row["role"]), model=_text(row.get("model")), status=str(row["status"]), phase=_text(row.get("phase")),
        turns=stats.turns,
        tool_calls=stats.tool_calls, tokens_in=int(usage.get("tokens_in") or 0),
        tokens_out=int(usage.get("tokens_out") or 0), cost_usd=float(usage.get("cost_usd") or 0.0),
        unknown_cost_tokens=int(usage.get("unknown_cost_tokens") or 0),
        wall_s=wall / 1000, generation_s=gen / 1000, tool_s=tool / 1000,
        waiting_s=max(0, wall - gen - tool) / 1000, final=lines, branch=branch, sha=sha, bad=bad, id=str(row["id"]),
        cache_read=stats.cache_read, cache_write=stats.cache_write)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def summary_lines(reports: list[NodeReport]) -> list[str]:
    out = []
    for r in reports:
        indent = "  " * r.depth
        where = f" · {printable(r.branch)}@{printable((r.sha or '')[:10])}" if r.branch else ""
        damaged = any(line.startswith("⚠ ledger row usage") for line in r.bad)
        tokens = "?" if damaged else str(r.tokens_in + r.tokens_out)
        cost = "?" if damaged else cost_text(r.cost_usd, r.unknown_cost_tokens)
        out.append(f"{indent}{printable(r.name)} [{printable(r.role)}] {printable(r.status)} · phase "
                   f"{printable(r.phase or '-')} · {printable(r.model or '-')} · "
                   f"{plural(r.turns, 'turn')} · {plural(r.tool_calls, 'tool')} · {tokens} tok · {cost} · "
                   f"{_dur(r.wall_s)}{where}")
        out.extend(f"{indent}  │ {printable(line[:160])}" for line in r.final)
    out.extend(line for r in reports for line in r.bad)
    total_cost = sum(r.cost_usd for r in reports)
    total_tok = sum(r.tokens_in + r.tokens_out for r in reports)
    unknown = sum(r.unknown_cost_tokens for r in reports)
    out.append(f"total: {plural(len(reports), 'node')} · {total_tok} tok · ${total_cost:.4f}{unknown_note(unknown)}")
    return out


def timing_lines(reports: list[NodeReport]) -> list[str]:
    out = [f"{'node':<30} {'wall':>9} {'generation':>11} {'tools':>9} {'waiting':>9}"]
    for r in reports:
        name = "  " * r.depth + printable(r.name)
        out.append(f"{name:<30} {_dur(r.wall_s):>9} {_dur(r.generation_s):>11} {_dur(r.tool_s):>9} "
                   f"{_dur(r.waiting_s):>9}")
    out.extend(line for r in reports for line in r.bad)
    return out


def _dur(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
