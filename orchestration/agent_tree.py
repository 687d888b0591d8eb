"""The agent tree as the orchestrator holds it: one record per agent node (docs/architecture.md §7).

`AgentNode` is everything the root knows about one agent session — where it sits in the tree, what
launched it, where it is hosted, its session spec (the resume credential travels with it), its
lifecycle status (a mirror of `nodes.status`, written by the root only) and its results — and what the
orchestration layer has in flight for it: the orchestrator's `work` (its settle being recorded, notices
on their way to it, supervisor work held for it, the lock that serialises bringing it back and putting
it away) and the Postman's `mail` (delivery in flight, a wait/collect hold, the confirmation cursor, the
stall-detection window). Nothing about a node lives in a side table keyed by its id, as the supervision
layer's registry keeps one `NodeRecord` per node (`legion.supervision.registry`). `AgentTree` is the
single table of them, keyed by node id (= the node's name, unique within a run). Pools and team
supervisors are infrastructure and never appear here.

A name can be launched again: a new `AgentNode` then replaces the old one in the tree while tasks begun
for the old one (a settle being recorded, a delivery, a revive holding the lock) still run. `work` and
`mail` belong to the name, not to one incarnation: `AgentTree.add` hands the replaced node's to its
successor (the same objects, shared), so those tasks and the new incarnation see one state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from legion.ledger.constants import LIVE_STATUSES as LEDGER_LIVE
from legion.orchestration.stall import StallState

Backend = Literal["inprocess", "rpc"]
Status = Literal["starting", "running", "blocked", "settled", "failed", "retired"]
LIVE_STATUSES: frozenset[str] = frozenset(LEDGER_LIVE)  # (the ledger's set: one definition of "live")


@dataclass(eq=False)
class NodeWork:
    """What the orchestrator has in flight for one node (shared by its incarnations, see the module docstring)."""

    # serialises what brings the node back (revive, a relaunch of its name) with what puts it away (park)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    settling: bool = False  # a settle's results (artifact, outcome, notices) are still being recorded
    settles: int = 0  # agent_settled events seen (a check for an end it never saw defers to a settle seen since)
    notifying: bool = False  # a batch of completion notices to it is on its way
    early_outcome: str | None = None  # an rpc node's settle that overtook its launch fact: recorded once running
    holds: int = 0  # supervisor work in flight for it (`Orchestrator.hold`: a verification, a phase message)
    resuming: bool = False  # `legion resume` is bringing it back: notices to it wait (`Orchestrator.resuming`)


@dataclass
class Hold:
    """A parent blocked in wait/collect: the postman leaves its mail to the blocking call (§6.6)."""

    node_id: str
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    # mail may sit queued in the session, handed over just before it blocked: the call takes it back (at its first
    # poll, and again when a hand-over that was in flight as the hold began lands)
    reclaim: bool = True


@dataclass
class StallTrack:
    """What the session events of a live node's current run say (epoch ms), for stall detection."""

    run_started_ms: int
    last_event_ms: int
    tools: dict[str, tuple[str, int]] = field(default_factory=dict)
    stall: StallState = field(default_factory=StallState)


@dataclass(eq=False)
class MailState:
    """The Postman's book of one recipient (shared by its incarnations, see the module docstring)."""

    paused: bool = False  # retired by session shutdown: its mail waits for the run's resume
    delivering: bool = False  # a delivery loop runs for it
    again: bool = False  # woken while `delivering`: the loop goes round once more
    hold: Hold | None = None  # blocked in wait/collect: its mail goes into that tool result
    # mail handed to its running session as a queued steer or follow-up, by id, until it is confirmed or the
    # session settles (a settled session has consumed its queues): what a wait/collect may take back
    queued: dict[int, dict[str, Any]] = field(default_factory=dict)
    cursor: int = 0  # the last ACCEPTED mail id confirmed by the previous (full) confirmation batch
    confirm_due: bool = False  # a debounced confirmation is scheduled
    confirming: bool = False  # a confirmation runs (one at a time)
    track: StallTrack | None = None  # its current run's activity (None: not live, or no session event yet)
    orphan_alarm: bool = False  # the orphan scan found it live and hosted nowhere (orphan_detected written)


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
    model_switches: tuple[str, ...] = ()  # each switch to a fallback model, said as collect reports it
    blocked_on: dict[str, Any] | None = None  # the extension dialog its run waits on (`legion.orchestration.blocked`)
    changed: asyncio.Event = field(default_factory=asyncio.Event)  # set at every status change
    work: NodeWork = field(default_factory=NodeWork, compare=False, repr=False)
    mail: MailState = field(default_factory=MailState, compare=False, repr=False)

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
        # parent id → its children by id, in the order of `_nodes`: a launch, a wait or a collect asks for one
        # node's children, which must not cost a pass over a 1,000-node tree
        self._kids: dict[str | None, dict[str, AgentNode]] = {}

    def __iter__(self) -> Iterator[AgentNode]:
        return iter(list(self._nodes.values()))

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def get(self, node_id: str) -> AgentNode | None:
        return self._nodes.get(node_id)

    def add(self, node: AgentNode) -> None:
        """Put `node` in the tree; one that replaces a node of its name takes over that name's `work` and `mail`."""
        previous = self._nodes.get(node.id)
        if previous is not None and previous is not node:
            node.work, node.mail = previous.work, previous.mail
        self._nodes[node.id] = node
        kids = self._kids.setdefault(node.parent, {})
        if previous is None or previous.parent == node.parent:
            kids[node.id] = node  # a replacement keeps its place among its siblings
            return
        self._unindex(previous)  # the name moves to another parent: its place there follows `_nodes`' order
        self._kids[node.parent] = {n.id: n for n in self._nodes.values() if n.parent == node.parent}

    def remove(self, node_id: str) -> None:
        node = self._nodes.pop(node_id, None)
        if node is not None:
            self._unindex(node)

    def _unindex(self, node: AgentNode) -> None:
        kids = self._kids.get(node.parent)
        if kids is not None and kids.get(node.id) is node:
            del kids[node.id]

    def children(self, node_id: str) -> list[AgentNode]:
        return list(self._kids.get(node_id, {}).values())

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
        return [n for n in self.children(parent) if n.tool_call == call_id]
