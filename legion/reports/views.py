"""Read-only views of a run's ledger for the operator: node rows, the tree, recent events."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.tree import Tree

from legion.ledger.constants import OPERATOR_NODE
from legion.reports import fastread
from legion.runs import open_run_ledger

if TYPE_CHECKING:
    from legion.ledger import Event

NODE_COLUMNS = ("id", "parent_id", "name", "role", "status", "phase", "model", "team", "depth", "updated_at")
# C0 and C1 controls, DEL, zero-width and bidirectional overrides, line/paragraph separators, BOM
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def iso_time(ms: Any) -> str:
    """A ledger time (epoch milliseconds) as ISO 8601 local time with its UTC offset; `?` for a damaged value."""
    from datetime import datetime

    if as_number(ms) is None:
        return "?"
    try:
        return datetime.fromtimestamp(ms / 1000).astimezone().isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return "?"


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`1 turn`, `2 turns` (`many` for an irregular plural)."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


def printable(value: Any, *, lines: bool = False) -> str:
    """`value` as text that is safe on a terminal: control characters (newlines, ANSI escapes, bidi overrides)
    shown escaped (`\\n`, `\\x1b`, `\\u202e`), so model or user text can neither add lines nor drive the terminal.
    Every human view prints user- or model-provided strings through it; JSON output stays raw. With `lines`
    (a multi-line answer), newlines and tabs are kept and only the other control characters are escaped."""
    text = value if isinstance(value, str) else str(value)
    if lines:
        return _UNPRINTABLE.sub(lambda m: m.group() if m.group() in "\n\t" else _escaped(m), text)
    return _UNPRINTABLE.sub(_escaped, text)


def _escaped(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def read_nodes(run_dir: Path) -> list[dict[str, Any]]:
    """Every node of the run, in tree order (parents before children)."""
    with fastread.connect_run(run_dir) as conn:
        if conn is not None:
            return _tree_order(fastread.nodes(conn))
    ledger = open_run_ledger(run_dir)
    try:
        rows = ledger.list_nodes()
    finally:
        ledger.close()
    return _tree_order(rows)


def read_events(run_dir: Path, *, after: int = 0, limit: int = 50) -> list[Event]:
    ledger = open_run_ledger(run_dir)
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
    stack = sorted(by_parent.get(None, []), key=_created, reverse=True)
    while stack:
        row = stack.pop()
        ordered.append(row)
        stack.extend(sorted(by_parent.get(row["id"], []), key=_created, reverse=True))
    return ordered


def _created(row: dict[str, Any]) -> tuple[int, float, str]:
    """Sort key by creation time; a wrongly typed value (a damaged row) sorts last instead of raising."""
    value = row.get("created_at")
    number = as_number(value)
    return (0, number, "") if number is not None else (1, 0.0, str(value))


def as_number(value: Any) -> float | None:
    """A ledger value that should be a number, or None when the row holds something else (a damaged row)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def _int(value: Any) -> int:
    number = as_number(value)
    return int(number) if number is not None else 0


def bad_value_lines(table: str, key: Any, row: dict[str, Any], columns: Iterable[str], shown: str) -> list[str]:
    """A warning line per column of `row` that holds no number although it should (reports never raise on it)."""
    return [f"⚠ ledger row {table}[{printable(key)}]: {col} = {printable(repr(row[col]))[:60]} is not a number; "
            f"shown as {shown}" for col in columns if row.get(col) is not None and as_number(row.get(col)) is None]


def _age(ms: Any, now_ms: int) -> str:
    if ms is None or ms == 0:
        return "-"
    if as_number(ms) is None:
        return "?"
    seconds = max(0, (now_ms - ms) // 1000)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"




def is_operator_row(row: dict[str, Any]) -> bool:
    """The operator's pseudo-node (written when `legion mail send` first mails a run): a sender, not a node."""
    return row.get("id") == OPERATOR_NODE and row.get("role") == "operator"


def status_lines(rows: Iterable[dict[str, Any]], now_ms: int | None = None) -> list[str]:
    """A header, then one aligned line per node (the operator's pseudo-node left out): indent by depth, status,
    phase, model, time since last update; [] without a node."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    lines: list[str] = []
    warnings: list[str] = []
    for row in rows:
        if is_operator_row(row):
            continue
        warnings += bad_value_lines("nodes", row.get("id"), row, ("depth", "updated_at", "created_at"), "'?'")
        name = "  " * _int(row.get("depth")) + printable(row["name"])
        phase = printable(row.get("phase") or "-")
        model = printable(row.get("model") or "-")
        lines.append(f"{name:<28} {printable(row['status']):<9} {phase:<13} {model:<32} "
                     f"{_age(row.get('updated_at'), now_ms)}")
    header = f"{'node':<28} {'status':<9} {'phase':<13} {'model':<32} updated"
    return ([header] if lines else []) + lines + warnings


def node_tree(rows: list[dict[str, Any]], title: str) -> Tree:
    """A rich Tree of the nodes (parents before children, as `read_nodes` returns them)."""
    tree = Tree(title)
    branches: dict[str, Tree] = {}
    for row in rows:
        if is_operator_row(row):
            continue
        label = f"{_safe(row['name'])} [dim]{_safe(row['role'])}[/] · {_safe(row['status'])}"
        if row.get("phase"):
            label += f" · {_safe(row['phase'])}"
        parent = branches.get(row.get("parent_id") or "")
        branches[row["id"]] = (parent or tree).add(label)
    return tree


def _safe(value: Any) -> str:
    """`printable`, with rich markup escaped too (a `[` in a name is text, not a style)."""
    return escape(printable(value))
