"""The agent tree as the orchestrator holds it: one record per agent node (docs/architecture.md §7).

`AgentNode` is everything the root knows about one agent session — where it sits in the tree, what
launched it, where it is hosted, its session spec (the resume credential travels with it), its
lifecycle status (a mirror of `nodes.status`, written by the root only) and its results. `AgentTree`
is the single table of them, keyed by node id (= the node's name, unique within a run). Pools and
team supervisors are infrastructure and never appear here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Backend = Literal["inprocess", "rpc"]
Status = Literal["starting", "running", "blocked", "settled", "failed", "retired"]
LIVE_STATUSES: frozenset[str] = frozenset({"starting", "running", "blocked"})


@dataclass
class AgentNode:
    """One agent session of the run."""

    id: str
    parent: str | None
    depth: int
    role: str
    backend: Backend
    model: str  # the model label the session runs (model_label: model + effective thinking)
    model_origin: str
    transcript: Path
    spec: dict[str, Any]  # the SessionSpec dict it was (re)started with
    task: str
    generations: int  # how many generations its own subtree may still have (1 = leaf)
    team: str | None = None
    provider_pin: str | None = None
    thinking: str | None = None
    utility: bool = False
    status: Status = "starting"
    outcome: str | None = None  # of the last settle: success | failed | truncated | aborted | unknown
    final_text: str = ""
    error: str | None = None  # the last run's error message (a failed outcome's reason)
    rounds: int = 0  # artifacts written (r1, r2, …)
    reserved_usd: float = 0.0  # tree-cost reservation still held (released at settle)
    launched_at: float = field(default_factory=time.time)
    settled_at: float | None = None
    tool_call: str | None = None  # the launching tool call id (a replayed launch gets this node back)
    warnings: tuple[str, ...] = ()
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # set at every status change

    @property
    def live(self) -> bool:
        return self.status in LIVE_STATUSES

    def set_status(self, status: Status) -> None:
        self.status = status
        if status in LIVE_STATUSES:
            self.settled_at = None
        elif self.settled_at is None:
            self.settled_at = time.time()
        self.touch()

    def touch(self) -> None:
        """Wake everyone waiting on this node (a status change, or its settle's results recorded)."""
        self.changed.set()
        self.changed = asyncio.Event()  # waiters hold the old (set) one; later waiters get a fresh one


class AgentTree:
    """The run's agent nodes by id, with the tree queries the orchestrator needs."""

    def __init__(self) -> None:
        self._nodes: dict[str, AgentNode] = {}

    def __iter__(self) -> Iterator[AgentNode]:
        return iter(list(self._nodes.values()))

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def get(self, node_id: str) -> AgentNode | None:
        return self._nodes.get(node_id)

    def add(self, node: AgentNode) -> None:
        self._nodes[node.id] = node

    def remove(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)

    def children(self, node_id: str) -> list[AgentNode]:
        return [n for n in self._nodes.values() if n.parent == node_id]

    def subtree(self, node_id: str) -> list[AgentNode]:
        """`node_id`'s descendants, parents before children."""
        found: list[AgentNode] = []
        frontier = [node_id]
        while frontier:
            nxt: list[str] = []
            for parent in frontier:
                for child in self.children(parent):
                    found.append(child)
                    nxt.append(child.id)
            frontier = nxt
        return found

    def live(self) -> list[AgentNode]:
        return [n for n in self._nodes.values() if n.live]

    def by_tool_call(self, parent: str, call_id: str) -> list[AgentNode]:
        return [n for n in self._nodes.values() if n.parent == parent and n.tool_call == call_id]
