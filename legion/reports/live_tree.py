"""The live tree's state, fed by monitor events only (no ledger polling), and its text rendering.

`TreeModel.apply(type, body)` folds one monitor event into per-node rows (status and parent from the
lifecycle events, role/model/depth from `agent_launched`, phase from `phase_change` or a status body's
`phase`, turns/tokens/cost from `usage`, elapsed from launch to settle; only agents are shown: pools and
other infrastructure never get an `agent_launched`); `lines(width, height)` renders the
visible part: the tree in launch order with the live nodes kept on screen when it does not fit. Thread
safe: the root's loop applies events while the display thread renders.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from legion.ledger.constants import LIVE_STATUSES
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
            if isinstance(body.get("phase"), str) and type_ != "tool_call":
                row.phase = body["phase"]
            if type_ == "phase_change" and isinstance(body.get("to"), str):
                row.phase = body["to"]
            elif type_ == "agent_launched":
                row.role, row.model = str(body.get("role") or ""), str(body.get("model") or "")
                row.agent = True
                row.depth = body.get("depth") if isinstance(body.get("depth"), int) else row.depth
            elif type_ == "usage":
                row.turns = _int(body.get("turns"), row.turns)
                row.tokens = _int(body.get("input"), 0) + _int(body.get("output"), 0) or row.tokens
                cost = body.get("costUsd")
                row.cost = float(cost) if isinstance(cost, int | float) else row.cost
                row.unknown_cost = body.get("costUnknown") is True or row.unknown_cost
            self.version += 1

    def snapshot(self, state: dict[str, Any]) -> None:
        """A monitor snapshot (a late attach): nodes with status, parent and role."""
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

    def lines(self, width: int, height: int) -> list[str]:
        """The header and the visible rows (at most `height` lines, each cut to `width`)."""
        return [text for text, _ in self.styled_lines(width, height)]

    def styled_lines(self, width: int, height: int) -> list[tuple[str, str | None]]:
        """`lines` with each row's status (for its colour; None for the header and notes)."""
        now = time.monotonic()
        with self.lock:
            ordered = self._tree_order()
            total = len(ordered)
            live = sum(1 for r, _ in ordered if r.status in LIVE)
            tokens = sum(r.tokens for r, _ in ordered)
            cost = cost_text(sum(r.cost for r, _ in ordered), int(any(r.unknown_cost for r, _ in ordered)))
            room = max(1, height - HEADER_LINES)
            if len(ordered) > room:  # keep the live ones on screen, then the most recent others
                keep = {id(r) for r, _ in ordered if r.status in LIVE}
                for r, _ in reversed(ordered):
                    if len(keep) >= room - 1:
                        break
                    keep.add(id(r))
                hidden = len(ordered) - len(keep)
                ordered = [(r, d) for r, d in ordered if id(r) in keep][:room - 1]
            else:
                hidden = 0
            body: list[tuple[str, str | None]] = [(self._line(r, d, now), r.status) for r, d in ordered]
        head: list[tuple[str, str | None]] = [
            (f"legion · {now - self.t0:.0f}s · {plural(total, 'node')}, {live} live · {tokens} tok · {cost}", None),
            (f"{'node':<26} {'status':<8} {'phase':<12} {'model':<24} {'turns':>5} {'tokens':>8} {'cost':>8} "
             f"{'elapsed':>7}", None)]
        if hidden:
            body.append((f"… {hidden} more (`legion status` lists every node)", None))
        return [(line[:width], status) for line, status in head + body]

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

    @staticmethod
    def _line(r: Row, depth: int, now: float) -> str:
        name = f"{'  ' * depth}{SYMBOL.get(r.status, '?')} {printable(r.name)}"
        return (f"{name[:26]:<26} {printable(r.status):<8} {printable(r.phase or '-')[:12]:<12} "
                f"{printable(r.model or '-')[-24:]:<24} "
                f"{r.turns:>5} {r.tokens:>8} {cost_text(r.cost, int(r.unknown_cost)):>8} {_clock(r.elapsed(now)):>7}")


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}:{s % 60:02d}" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}"
