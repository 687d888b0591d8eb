"""The live tree's state, fed by monitor events only (no ledger polling), and its text rendering.

`TreeModel.apply(type, body)` folds one monitor event into per-node rows (status and parent from the
lifecycle events, role/model/depth from `agent_launched`, phase from `phase_change` or a status body's
`phase`, turns/tokens/cost from `usage`, all of them from a snapshot, elapsed from launch to settle; only agents
are shown: pools and other infrastructure never get an `agent_launched`); `lines(width, height)` renders the
visible part: the tree in launch order as a grid that fits the width (measured columns, long values cut on the
right with `…`), with the live nodes kept on screen and a `… N more` line when it does not fit the height. Thread
safe: the root's loop applies events while the display thread renders.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len, set_cell_size

from legion.bus.protocol import AGENT_LAUNCHED, TOOL_CALL
from legion.ledger.constants import LIVE_STATUSES, PHASE_CHANGE
from legion.reports.costs import cost_text
from legion.reports.views import plural, printable

SYMBOL = {"starting": "…", "running": "▶", "settled": "✔", "failed": "✗", "retired": "■", "blocked": "⏸"}
LIVE = frozenset(LIVE_STATUSES)
HEADER_LINES = 2


@dataclass
class Row:
    name: str
    parent: str | None = None
    status: str = "starting"
    role: str = ""
    model: str = ""
    phase: str | None = None
    depth: int | None = None
    turns: int = 0
    tokens: int = 0
    cost: float = 0.0
    unknown_cost: bool = False  # part of the cost is unknown (a model without a price)
    started: float | None = None
    ended: float | None = None
    infra: bool = False
    agent: bool = False  # an agent session (an `agent_launched` event named it), not infrastructure

    def elapsed(self, now: float) -> float:
        if self.started is None:
            return 0.0
        return (self.ended if self.ended is not None else now) - self.started


class TreeModel:
    def __init__(self) -> None:
        self.rows: dict[str, Row] = {}
        self.lock = threading.Lock()
        self.version = 0  # bumped at every change: a renderer redraws only when it moved
        self.t0 = time.monotonic()

    def apply(self, type_: str, body: dict[str, Any]) -> None:
        node = body.get("node_id")
        if not isinstance(node, str):
            return
        with self.lock:
            row = self.rows.get(node)
            if row is None:
                row = self.rows[node] = Row(node)
            if body.get("infra"):
                row.infra = True
            if isinstance(body.get("parent_id"), str):
                row.parent = body["parent_id"]
            status = body.get("status")
            if isinstance(status, str) and status in SYMBOL:
                self._status(row, status)
            if isinstance(body.get("phase"), str) and type_ != TOOL_CALL:
                row.phase = body["phase"]
            if type_ == PHASE_CHANGE and isinstance(body.get("to"), str):
                row.phase = body["to"]
            elif type_ == AGENT_LAUNCHED:
                row.role, row.model = str(body.get("role") or ""), str(body.get("model") or "")
                row.agent = True
                row.depth = body.get("depth") if isinstance(body.get("depth"), int) else row.depth
            elif type_ == "snapshot":
                _from_snapshot(row, body)
            elif type_ == "usage":
                row.turns = _int(body.get("turns"), row.turns)
                row.tokens = _int(body.get("input"), 0) + _int(body.get("output"), 0) or row.tokens
                cost = body.get("costUsd")
                row.cost = float(cost) if isinstance(cost, int | float) else row.cost
                row.unknown_cost = body.get("costUnknown") is True or row.unknown_cost
            self.version += 1

    def snapshot(self, state: dict[str, Any]) -> None:
        """A monitor snapshot (a late attach): per node its status, parent, role, model, phase and figures
        (docs/protocol.md §3.2); the clocks start at the attach."""
        nodes = state.get("nodes")
        for node, info in (nodes if isinstance(nodes, dict) else {}).items():
            if isinstance(info, dict):
                self.apply("snapshot", {"node_id": node, **info})

    def totals(self) -> dict[str, Any]:
        """The agent nodes counted by state, and their tokens and cost (the plain view's progress line)."""
        with self.lock:
            rows = [r for r in self.rows.values() if r.agent and not r.infra]
            return {"live": sum(r.status in LIVE for r in rows), "settled": sum(r.status == "settled" for r in rows),
                    "failed": sum(r.status == "failed" for r in rows), "tokens": sum(r.tokens for r in rows),
                    "cost": sum(r.cost for r in rows), "unknown_cost": any(r.unknown_cost for r in rows)}

    @staticmethod
    def _status(row: Row, status: str) -> None:
        now = time.monotonic()
        if status in LIVE:
            if row.started is None or row.ended is not None:
                row.started = now if row.started is None else row.started
                row.ended = None
        elif row.ended is None:
            row.ended = now
        row.status = status

    def ordered(self) -> list[tuple[Row, int]]:
        """The agent rows in tree order, each with its depth."""
        with self.lock:
            return self._tree_order()

    def lines(self, width: int, height: int) -> list[str]:
        """The header and the visible rows (at most `height` lines, each at most `width` cells)."""
        return [text for text, _ in self.styled_lines(width, height)]

    def styled_lines(self, width: int, height: int) -> list[tuple[str, str | None]]:
        """`lines` with each row's status (for its colour; None for the header and notes)."""
        now = time.monotonic()
        with self.lock:
            ordered = self._tree_order()
            title = _title(ordered, now - self.t0)
            shown, hidden = _visible(ordered, max(1, height - HEADER_LINES))
            cells = [(_cells(r, d, now), r.status) for r, d in shown]
        widths = _layout([c for c, _ in cells], width)
        out: list[tuple[str, str | None]] = [(fit(title, width).rstrip(), None), (_join(HEADINGS, widths, width), None)]
        out += [(_join(c, widths, width), status) for c, status in cells]
        if hidden:
            out.append((fit(_more(hidden), width).rstrip(), None))
        return out

    def _tree_order(self) -> list[tuple[Row, int]]:
        rows = [r for r in self.rows.values() if r.agent and not r.infra]
        names = {r.name for r in rows}
        children: dict[str | None, list[Row]] = {}
        for r in rows:
            children.setdefault(r.parent if r.parent in names else None, []).append(r)
        out: list[tuple[Row, int]] = []
        stack = [(r, 0) for r in reversed(children.get(None, []))]
        while stack:
            row, depth = stack.pop()
            out.append((row, depth))
            stack.extend((c, depth + 1) for c in reversed(children.get(row.name, [])))
        return out


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}:{s % 60:02d}" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}"


def _from_snapshot(row: Row, node: dict[str, Any]) -> None:
    row.agent = not node.get("infra")
    row.role = str(node.get("role") or row.role)
    row.model = str(node.get("model") or row.model)
    row.turns = _int(node.get("turns"), row.turns)
    row.tokens = _int(node.get("tokens_in"), 0) + _int(node.get("tokens_out"), 0) or row.tokens
    cost = node.get("cost_usd")
    row.cost = float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else row.cost
    row.unknown_cost = _int(node.get("unknown_cost_tokens"), 0) > 0 or row.unknown_cost


# ----- the grid: measured columns, values cut on the right with an ellipsis ------------------------------------------
# rich's Table lays out such a grid, but at ~16 ms for a 48-row frame it would cost the root about three times the
# view's CPU budget at 10 frames a second (bench/live_view.py); the cells are measured and cut with rich's cell
# functions instead, and the frame is one rich Text.
HEADINGS = ("node", "status", "phase", "model", "turns", "tokens", "cost", "elapsed")
_NODE, _STATUS, _PHASE, _MODEL = 0, 1, 2, 3
_FIGURES = frozenset({4, 5, 6, 7})  # turns, tokens, cost, elapsed: right-aligned, never cut
_MIN_CUT = 10  # node, model and phase are cut no narrower than this before the last resort
_EMPTY = "-"


def fit(text: str, width: int, *, right: bool = False) -> str:
    """`text` in exactly `width` cells: padded, or cut on the right with `…`."""
    size = cell_len(text)
    if size > width:
        return set_cell_size(text, width - 1) + "…" if width > 0 else ""
    pad = " " * (width - size)
    return pad + text if right else text + pad


def _cells(r: Row, depth: int, now: float) -> tuple[str, ...]:
    return (f"{'  ' * depth}{SYMBOL.get(r.status, '?')} {printable(r.name)}", printable(r.status),
            printable(r.phase or _EMPTY), printable(r.model or _EMPTY), str(r.turns), str(r.tokens),
            cost_text(r.cost, int(r.unknown_cost)), _clock(r.elapsed(now)))


def _layout(rows: list[tuple[str, ...]], width: int) -> list[int]:
    """Column widths for `width` cells (0: the column is left out). Each column is as wide as its widest value; when
    the grid is wider than the screen, an empty phase column goes first, then the status column (the node's symbol
    says it), then node, model and phase are cut, the widest first, down to `_MIN_CUT` cells, then further. The
    figures are never cut: on a screen too narrow even for them the line itself is cut (`_join`)."""
    widths = [max([cell_len(h)] + [cell_len(r[i]) for r in rows]) for i, h in enumerate(HEADINGS)]
    no_phase = all(r[_PHASE] == _EMPTY for r in rows)

    def excess() -> int:
        shown = [w for w in widths if w]
        return sum(shown) + len(shown) - 1 - width

    if excess() > 0 and no_phase:
        widths[_PHASE] = 0
    if excess() > 0:
        widths[_STATUS] = 0
    for floor in (_MIN_CUT, 1):
        while excess() > 0:
            cuttable = [c for c in (_NODE, _MODEL, _PHASE) if widths[c] > floor]
            if not cuttable:
                break
            widest = max(cuttable, key=lambda c: widths[c])
            widths[widest] -= min(widths[widest] - floor, excess())
    return widths


def _join(cells: tuple[str, ...], widths: list[int], width: int) -> str:
    line = " ".join(fit(cell, w, right=i in _FIGURES) for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
                    if w)
    return fit(line, width).rstrip()


def _title(ordered: list[tuple[Row, int]], elapsed: float) -> str:
    live = sum(1 for r, _ in ordered if r.status in LIVE)
    tokens = sum(r.tokens for r, _ in ordered)
    cost = cost_text(sum(r.cost for r, _ in ordered), int(any(r.unknown_cost for r, _ in ordered)))
    return f"legion · {elapsed:.0f}s · {plural(len(ordered), 'node')}, {live} live · {tokens} tok · {cost}"


def _visible(ordered: list[tuple[Row, int]], room: int) -> tuple[list[tuple[Row, int]], list[Row]]:
    """(the rows shown, in tree order; the rows hidden) for `room` lines. When the tree does not fit, one line goes
    to the `… N more` note and the live rows are kept first, then the most recent others."""
    if len(ordered) <= room:
        return ordered, []
    slots = room - 1
    keep = [n for n, (r, _) in enumerate(ordered) if r.status in LIVE][:slots]
    rest = [n for n in range(len(ordered) - 1, -1, -1) if ordered[n][0].status not in LIVE]
    chosen = set(keep + rest[:slots - len(keep)])
    return ([item for n, item in enumerate(ordered) if n in chosen],
            [r for n, (r, _) in enumerate(ordered) if n not in chosen])


def _more(hidden: list[Row]) -> str:
    """`… 21 more: 20 live, 1 settled`: the hidden rows by status, the live ones counted first."""
    counts: dict[str, int] = {}
    for r in hidden:
        key = "live" if r.status in LIVE else r.status
        counts[key] = counts.get(key, 0) + 1
    parts = ", ".join(f"{counts[k]} {k}" for k in sorted(counts, key=lambda k: (k != "live", k)))
    return f"… {len(hidden)} more: {parts} (`legion status` lists every node)"
