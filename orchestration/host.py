"""What the orchestration layer may ask of the supervision layer: the root, seen through one narrow interface.

The orchestrator, the Postman and the Teams runtime hold the run's root as a `Host`: start, stop and send
to a node; publish on the monitor; one subscription each for legion tool calls, session events and the
nodes' status changes; and the few queries orchestration needs (is a node hosted, parked, which process
hosts it). They never reach into the root's registry, lifecycle or supervisor
(`tests/unit/meta/test_host_interface.py` reads the source for that). The root's nodes
(`RootSupervisor.nodes`, a `legion.supervision.node_ops.Nodes`) are the one implementation; the Run
(`legion.orchestration.run`) composes the root and hands its nodes over as the `Host`.
"""

from __future__ import annotations

from typing import Any, Protocol

from legion.supervision.child_spec import RestartType
from legion.supervision.lifecycle import Listener as StatusListener
from legion.supervision.node_ops import SessionEventHook as SessionListener
from legion.supervision.node_ops import ToolHandler


class Incarnation(Protocol):
    """The live worker process that hosts a node (its own, or its pool's)."""

    @property
    def pid(self) -> int | None: ...

    @property
    def alive(self) -> bool: ...


class Host(Protocol):
    """The supervision layer as orchestration sees it (see the module docstring)."""

    # ----- subscriptions (each listener quick, never raising) -----------------------------------
    def serve_tools(self, handler: ToolHandler) -> None:
        """Route the workers' legion tool calls to `handler` (one per root)."""

    def subscribe_sessions(self, listener: SessionListener) -> None:
        """Every session event, in subscription order."""

    def subscribe_status(self, listener: StatusListener) -> None:
        """Every status the root writes for a node (its lifecycle), after it is written."""

    # ----- start, stop, send --------------------------------------------------------------------
    async def launch_session(self, spec: dict[str, Any], *, pool: str = ..., restart: RestartType = ...,
                             role: str | None = ..., name: str | None = ..., parent_id: str | None = ...,
                             resume: bool = ..., reserved: bool = ...) -> str:
        """Start an inprocess session in a pool; `started` or `queued`. `resume`: a revive, recorded as one.
        `reserved`: the node's row is `starting` in the ledger already (the orchestrator's reservation wrote it)."""
        ...

    async def launch_rpc_session(self, spec: dict[str, Any], *, restart: RestartType = ..., role: str | None = ...,
                                 name: str | None = ..., resume: bool = ...) -> object:
        """Start an rpc session in its own worker process. `resume`: a revive, recorded as one."""
        ...

    async def session_request(self, node_id: str, op: str, *, timeout: float = ..., **body: Any) -> dict[str, Any]:
        """A `session.*` op (prompt, steer, follow_up, abort, …) for the worker hosting `node_id`; its reply."""
        ...

    async def park(self, node_id: str) -> bool:
        """Free the pool slot of a settled in-pool session, its status kept."""
        ...

    async def retire(self, node_id: str, *, cause: str = ..., force: bool = ...) -> None:
        """Stop a node with the retire ladder; raises if something survived."""

    # ----- status the orchestration layer decides -----------------------------------------------
    def settled_outcome(self, node_id: str, outcome: str) -> None:
        """Record the outcome of a node's run (an rpc node's settle, read from its transcript)."""

    def mark_blocked(self, node_id: str, *, waiting: bool, **request: Any) -> None:
        """Record a node's run waiting on an extension's dialog (`node_blocked`); `blocked` while `waiting`."""

    def mark_unblocked(self, node_id: str, **detail: Any) -> None:
        """The dialog a blocked node waited on was answered or expired: `running` again."""

    def mark_failed(self, node_id: str, reason: str) -> None:
        """Record a node failed for an orchestration reason (an orphan, a team whose phase failed)."""

    # ----- publish ------------------------------------------------------------------------------
    def publish(self, type: str, body: dict[str, Any]) -> None:
        """An event on the run's monitor."""

    # ----- queries ------------------------------------------------------------------------------
    def hosted(self, node_id: str) -> bool:
        """The node's session lives in a worker now and can take input."""
        ...

    def parked(self, node_id: str) -> bool:
        """The node settled and was put away (`park`, or its worker idled out): nothing of its run was cut."""
        ...

    def host_of(self, node_id: str) -> Incarnation | None:
        """The live worker process of `node_id` (an rpc node, or a pool), None between exit and restart."""
        ...
