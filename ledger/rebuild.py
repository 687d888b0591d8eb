"""Rebuild nodes/events/usage/artifacts of legion.db from a run directory (docs/spec-conformance.md §4.6).

A best-effort recovery, not a restore. In one transaction it DELETEs consumptions, artifacts, usage,
events and nodes (and messages only with preserve_messages=False; no DROP/CREATE, so every index of
the versioned schema stays), then re-inserts what the run directory can tell: nodes from run.json,
one synthetic event per node, usage summed from each session file, artifacts from
`artifacts/<name>/r<round>.md`. The limits it cannot overcome are reported in every RebuildReport
(REBUILD_LIMITS) and the report never claims phase recovery.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from legion.ledger.constants import (
    NODE_BLOCKED,
    NODE_FAILED,
    NODE_KINDS,
    NODE_LAUNCHED,
    NODE_RETIRED,
    NODE_SETTLED,
    NODE_SLUG_RE,
    NODE_STATUSES,
)
from legion.ledger.errors import LedgerError
from legion.ledger.ledger import Ledger
from legion.ledger.runfile import LAUNCHES_DIR, WORKTREES_DIR, read_run_json
from legion.ledger.sql import RUN, Sql

REBUILD_LIMITS: Final[tuple[str, ...]] = (
    "phase, phase_since, rework_count, contract_path and task_summary are not recoverable (left NULL/0)",
    "events collapse to one synthetic event per node; phase_change, mail_sent, budget_refused and "
    "tree_finalized history is gone",
    "messages have no rebuild path (kept as they were, or deleted with preserve_messages=False)",
    "consumptions are not rebuilt: every artifact counts as unread (at worst one extra notice, never a lost one)",
    "the root's session file is not in run.json: mail to root stays ACCEPTED after a rebuild",
)

_STATUS_EVENT: Final = {
    "failed": NODE_FAILED,
    "retired": NODE_RETIRED,
    "settled": NODE_SETTLED,
    "blocked": NODE_BLOCKED,
}
_ROUND_RE: Final = re.compile(r"r([1-9][0-9]*)\.md")


@dataclass
class RebuildReport:
    """What a rebuild restored, what it skipped, and what it can never restore."""

    nodes: int = 0
    events: int = 0
    usage: int = 0
    artifacts: int = 0
    messages_preserved: bool = True
    phase_recovered: bool = False  # never: see REBUILD_LIMITS
    warnings: list[str] = field(default_factory=list)
    limits: tuple[str, ...] = REBUILD_LIMITS


def _records(data: dict[str, Any], report: RebuildReport) -> list[dict[str, Any]]:
    """Root + children as node records, parents before children; invalid ones skipped with a warning."""
    root = data.get("root")
    children = data.get("children")
    raw = ([root] if isinstance(root, dict) else []) + (children if isinstance(children, list) else [])
    by_id: dict[str, dict[str, Any]] = {}
    root_id = root.get("id") if isinstance(root, dict) else None
    for index, rec in enumerate(raw):
        if not isinstance(rec, dict) or not isinstance(rec.get("id"), str) or not rec["id"]:
            report.warnings.append(f"run.json node #{index}: no id, skipped")
            continue
        name = rec.get("name")
        if not isinstance(name, str) or NODE_SLUG_RE.fullmatch(name) is None:
            report.warnings.append(f"run.json node {rec['id']!r}: invalid name {name!r}, skipped")
            continue
        if rec["id"] in by_id:
            report.warnings.append(f"run.json node {rec['id']!r}: duplicate id, skipped")
            continue
        by_id[rec["id"]] = rec
    ordered: list[dict[str, Any]] = []
    placed: set[str] = set()

    def place(node_id: str, trail: tuple[str, ...]) -> bool:
        if node_id in placed:
            return True
        rec = by_id.get(node_id)
        if rec is None or node_id in trail:
            return False
        parent = rec.get("parent_id", root_id if node_id != root_id else None)
        if parent is not None and not place(parent, (*trail, node_id)):
            report.warnings.append(f"run.json node {node_id!r}: parent {parent!r} missing, skipped")
            return False
        ordered.append({**rec, "parent_id": parent})
        placed.add(node_id)
        return True

    for node_id in by_id:
        place(node_id, ())
    return ordered


def _session_usage(path: Path) -> tuple[int, int, float, int] | None:
    """Sum usage over a session JSONL (pi-style `message.usage` or a top-level `usage`); None if no file.

    As the sessions record it: tokens in = input + cache reads + cache writes; the tokens of a call whose
    `cost.unknown` is true are counted as unknown-price tokens (their cost is not 0, it is unknown)."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return None
    tokens_in = tokens_out = unknown = 0
    cost = 0.0
    for line in lines:
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(entry, dict):
            continue
        message = entry.get("message")
        usage = message.get("usage") if isinstance(message, dict) else entry.get("usage")
        if not isinstance(usage, dict):
            continue
        call_in = sum(_int(usage.get(k, 0)) for k in ("cacheRead", "cacheWrite"))
        call_in += _int(usage.get("input", usage.get("tokens_in", 0)))
        call_out = _int(usage.get("output", usage.get("tokens_out", 0)))
        tokens_in += call_in
        tokens_out += call_out
        raw_cost = usage.get("cost", usage.get("cost_usd", 0))
        cost += _num(raw_cost.get("total", 0) if isinstance(raw_cost, dict) else raw_cost)
        if isinstance(raw_cost, dict) and raw_cost.get("unknown") is True:
            unknown += call_in + call_out
    return tokens_in, tokens_out, cost, unknown


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _num(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else 0.0


def _restore_worktree(run_dir: Path, rec: dict[str, Any], report: RebuildReport) -> None:
    """A node's worktree_path from its launch record (<run>/launches/<id>.json): its session's cwd when that is one of
    the run's team worktrees (not the run's own cwd, nor an external directory it was admitted to); a node whose
    record cannot tell is listed in the report."""
    if isinstance(rec.get("worktree_path"), str):
        return
    path = run_dir / LAUNCHES_DIR / f"{rec['id']}.json"
    try:
        launch = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return  # launched by an older legion or never launched: nothing says it had a worktree
    except (OSError, orjson.JSONDecodeError) as exc:
        report.warnings.append(f"node {rec['id']!r}: launch record {path.name} unreadable ({exc}); its "
                               "worktree_path, if it had one, is not restored")
        return
    spec = launch.get("spec") if isinstance(launch, dict) else None
    cwd = spec.get("cwd") if isinstance(spec, dict) else None
    if isinstance(cwd, str) and cwd and Path(cwd).parent == run_dir / WORKTREES_DIR:
        rec["worktree_path"] = cwd


def _insert_node(tx: Ledger, rec: dict[str, Any], is_root: bool, run_id: str | None) -> str:
    status = rec.get("status") if rec.get("status") in NODE_STATUSES else "retired"
    kind = rec.get("kind") if rec.get("kind") in NODE_KINDS else "native"
    depth = rec.get("depth")

    def text(key: str) -> str | None:
        value = rec.get(key)
        return value if isinstance(value, str) else None

    tx.insert_node(
        id=rec["id"],
        name=rec["name"],
        role=text("role") or ("root" if is_root else "worker"),
        depth=depth if isinstance(depth, int) and not isinstance(depth, bool) and depth >= 0 else 0,
        parent_id=rec["parent_id"],
        kind=str(kind),
        status=str(status),
        run_id=text("run_id") or run_id,
        session_file=None if is_root else text("session_file"),
        worktree_path=text("worktree_path"),
        model=text("model"),
        team=text("team"),
    )
    return str(status)


def _rebuild_artifacts(tx: Ledger, run_dir: Path, nodes: list[dict[str, Any]], report: RebuildReport) -> None:
    by_name: dict[str, list[dict[str, Any]]] = {}
    for rec in nodes:
        by_name.setdefault(rec["name"], []).append(rec)
    base = run_dir / "artifacts"
    if not base.is_dir():
        return
    for name_dir in sorted(base.iterdir()):
        for file in sorted(name_dir.glob("r*.md")) if name_dir.is_dir() else []:
            match = _ROUND_RE.fullmatch(file.name)
            owners = by_name.get(name_dir.name, [])
            if match is None or len(owners) != 1:
                why = "not r<round>.md" if match is None else ("no node" if not owners else "ambiguous name")
                report.warnings.append(f"artifact {file.relative_to(run_dir)}: {why} in this run, skipped")
                continue
            stat = file.stat()
            tx.record_artifact(
                node_id=owners[0]["id"], name=name_dir.name, round=int(match.group(1)), bytes=stat.st_size,
                created_at=int(stat.st_mtime * 1000),
            )
            report.artifacts += 1


def _delete_all(table: str) -> Sql:
    """Every row of the table: the file's on SQLite, this run's on PostgreSQL."""
    return Sql(f"DELETE FROM {table}", f"DELETE FROM {table} WHERE run = {RUN}")


def rebuild_ledger(ledger: Ledger, run_dir: str | Path, *, preserve_messages: bool = True) -> RebuildReport:
    """Rebuild the ledger from run_dir in one transaction; raises LedgerError (changing nothing) without run.json."""
    directory = Path(run_dir)
    data = read_run_json(directory)
    if data is None:
        raise LedgerError(
            f"cannot rebuild from {directory}: run.json is missing or corrupt (a corrupt one is now run.json.corrupt); "
            "nothing was changed"
        )
    report = RebuildReport(messages_preserved=preserve_messages)
    records = _records(data, report)
    run_id = data.get("run_id") if isinstance(data.get("run_id"), str) else None
    root_id = data["root"].get("id") if isinstance(data.get("root"), dict) else None
    with ledger.transaction() as tx:
        raw = tx._db.raw
        for table in ("consumptions", "artifacts", "usage", "events"):
            raw.execute(_delete_all(table))
        if not preserve_messages:
            raw.execute(_delete_all("messages"))
        raw.execute(_delete_all("nodes"))
        for rec in records:
            _restore_worktree(directory, rec, report)
            status = _insert_node(tx, rec, rec["id"] == root_id, run_id)
            tx.append_event(rec["id"], _STATUS_EVENT.get(status, NODE_LAUNCHED), {"rebuilt": True, "status": status})
            report.nodes += 1
            report.events += 1
            session = rec.get("session_file")
            if isinstance(session, str) and session and rec["id"] != root_id:
                path = Path(session) if Path(session).is_absolute() else directory / session
                totals = _session_usage(path)
                if totals is None:
                    report.warnings.append(f"node {rec['id']!r}: session file {session} unreadable, no usage")
                else:
                    tx.upsert_usage(rec["id"], *totals)
                    report.usage += 1
        _rebuild_artifacts(tx, directory, records, report)
    return report
