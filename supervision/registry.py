"""The root's node registry: one record per supervised node, as OTP's `supervisor.erl` keeps one `children` list.

A `NodeRecord` is everything the root knows of one node it supervises — a worker process, a team (a nested
supervisor), a pool worker, or a session hosted in a pool — in one place: its kind, its supervising parent,
its child spec (or, for an in-pool session, its session spec and restart type), its host, its attempt
count, the pid of its live incarnation, the cause it is being stopped for and its state. Nothing about a
node lives in a side table: the supervisor's callbacks, the pool's book of sessions and the control
channel's dispatch all read and write these records.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from legion.ledger.constants import LIVE_STATUSES
from legion.supervision.child_spec import ChildSpec, RestartType

if TYPE_CHECKING:
    from legion.supervision.pool_child import PoolSessions
    from legion.supervision.rpc_child import RpcChild
    from legion.supervision.supervisor import Supervisor

NodeKind = Literal["worker", "team", "pool", "session"]
# A node's status as the ledger writes it (`ledger.constants.NODE_STATUSES`), but for "blocked": the supervisor
# never sets that one (a blocked node's process is running; the orchestration layer records the wait). So which
# states are live is the ledger's one definition, `LIVE_STATUSES`, for a record as for a row.
NodeState = Literal["starting", "running", "settled", "retired", "failed"]


@dataclass(eq=False)
class NodeRecord:
    """One supervised node (see the module docstring)."""

    id: str
    kind: NodeKind = "worker"
    parent: str | None = None  # the team supervising it (None: the top supervisor); a session: its ledger parent
    host: str | None = None  # an in-pool session: the pool that hosts it
    spec: ChildSpec | None = None  # worker, team, pool: its child spec
    session_spec: dict[str, Any] | None = None  # a session: the SessionSpec dict it (re)starts from
    restart: RestartType = "transient"
    state: NodeState = "starting"
    attempt: int = 0  # starts so far (node_launched.attempt)
    pid: int | None = None  # of its live incarnation (a session: its pool's)
    cause: str | None = None  # why it is being stopped (a retire, a pause), until its stop is recorded
    after: str | None = None  # why its previous incarnation ended (node_launched.after)
    restart_pending: bool = False  # a session: its next launch is a relaunch after its pool died
    launching: bool = False  # a launch of it is in flight
    # its next start is a revive for new input (docs/spec-conformance.md §2.2): recorded as node_resumed, not
    # node_launched; started idle, only its status is restored (the input's run writes node_resumed)
    resuming: bool = False
    # settled and not hosted (its pool slot freed, its pool or its own idle worker gone), its status kept: new
    # input relaunches it from its transcript, with no restart note (nothing was cut)
    parked: bool = False
    handle: RpcChild | None = None  # worker, pool: the live incarnation
    team: Supervisor | None = None  # team: its nested supervisor
    members: list[ChildSpec] = field(default_factory=list)  # team: the member specs that restart with it
    sessions: PoolSessions | None = None  # pool: its book of sessions

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATUSES


class Registry:
    """The records by node id."""

    def __init__(self) -> None:
        self._records: dict[str, NodeRecord] = {}

    def __iter__(self) -> Iterator[NodeRecord]:
        return iter(list(self._records.values()))

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._records

    def get(self, node_id: str) -> NodeRecord | None:
        return self._records.get(node_id)

    def record(self, node_id: str, kind: NodeKind = "worker") -> NodeRecord:
        """The record of `node_id`, created (of `kind`) on first use."""
        rec = self._records.get(node_id)
        if rec is None:
            rec = self._records[node_id] = NodeRecord(node_id, kind)
        return rec

    def put(self, rec: NodeRecord) -> NodeRecord:
        self._records[rec.id] = rec
        return rec

    def handle(self, node_id: str) -> RpcChild | None:
        """The live worker incarnation of `node_id` (a worker or a pool), None between exit and restart."""
        rec = self._records.get(node_id)
        return rec.handle if rec is not None else None

    def workers(self) -> list[RpcChild]:
        return [r.handle for r in self._records.values() if r.handle is not None]

    def hosted_by(self, pool_id: str) -> list[NodeRecord]:
        return [r for r in self._records.values() if r.kind == "session" and r.host == pool_id]

    def busy(self, node_id: str) -> bool:
        """A launch is in flight, or the node runs somewhere (a worker, a running team, a live session)."""
        rec = self._records.get(node_id)
        if rec is None:
            return False
        if rec.launching or rec.handle is not None:
            return True
        if rec.kind == "team":
            return rec.team is not None and rec.team.state == "running"
        return rec.kind == "session" and rec.live
