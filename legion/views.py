"""Read-only views of a run's ledger for the operator: node rows, the tree, recent events."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.tree import Tree

from legion import fastread
from legion.runs import LEDGER_FILE

if TYPE_CHECKING:
    from legion.ledger import Event

NODE_COLUMNS = ("id", "parent_id", "name", "role", "status", "phase", "model", "team", "depth", "updated_at")


def read_nodes(run_dir: Path) -> list[dict[str, Any]]:
    """Every node of the run, in tree order (parents before children)."""
    with fastread.connect(run_dir / LEDGER_FILE) as conn:
        if conn is not None:
            return _tree_order(fastread.nodes(conn))
    from legion.ledger import open_ledger

    ledger = open_ledger(run_dir / LEDGER_FILE)
    try:
        rows = ledger.list_nodes()
    finally:
        ledger.close()
    return _tree_order(rows)


def read_events(run_dir: Path, *, after: int = 0, limit: int = 50) -> list[Event]:
    from legion.ledger import open_ledger

    ledger = open_ledger(run_dir / LEDGER_FILE)
    try:
        return ledger.events_after(after, limit=limit)
    finally:
        ledger.close()


def _tree_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_parent: dict[str | None, list[dict[str, Any]]] = {}
    ids = {r["id"] for r in rows}
    for row in rows:
        parent = row.get("parent_id") if row.get("parent_id") in ids else None
        by_parent.setdefault(parent, []).append(row)
    ordered: list[dict[str, Any]] = []
    stack = sorted(by_parent.get(None, []), key=lambda r: r["created_at"], reverse=True)
    while stack:
        row = stack.pop()
        ordered.append(row)
        stack.extend(sorted(by_parent.get(row["id"], []), key=lambda r: r["created_at"], reverse=True))
    return ordered


def _age(ms: int | None, now_ms: int) -> str:
    if not ms:
        return "-"
    seconds = max(0, (now_ms - ms) // 1000)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


def status_lines(rows: Iterable[dict[str, Any]], now_ms: int | None = None) -> list[str]:
    """One aligned line per node: indent by depth, status, phase, model, time since last update."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    lines = []
    for row in rows:
        name = "  " * int(row.get("depth") or 0) + str(row["name"])
        phase = row.get("phase") or "-"
        model = row.get("model") or "-"
        lines.append(f"{name:<28} {row['status']:<9} {phase:<13} {model:<32} {_age(row.get('updated_at'), now_ms)}")
    return lines


def node_tree(rows: list[dict[str, Any]], title: str) -> Tree:
    """A rich Tree of the nodes (parents before children, as `read_nodes` returns them)."""
    tree = Tree(title)
    branches: dict[str, Tree] = {}
    for row in rows:
        label = f"{row['name']} [dim]{row['role']}[/] · {row['status']}"
        if row.get("phase"):
            label += f" · {row['phase']}"
        parent = branches.get(row.get("parent_id") or "")
        branches[row["id"]] = (parent or tree).add(label)
    return tree
