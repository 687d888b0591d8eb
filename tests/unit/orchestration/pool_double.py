"""The real root side of an in-process pool with its worker process replaced, for model-based tests of the orchestrator.

The `Host` the orchestrator holds here is the real one, `Nodes` (supervision/node_ops.py), with its real
`PoolSessions`, `Registry` and `Lifecycle` writing to the run's SQLite ledger, and session events relayed by the real
`dispatch.event`. Only the pool worker process is replaced: `PoolDouble` answers the `session.*` ops of the control
channel as `SessionService` does (workers/session_service.py: launch, prompt, steer, follow_up, abort, retire,
admission) and keeps each session's transcript with the real `Transcript`. Its sessions call no model: a run ends
when the test says so (`settle`), with the last turn a model would have written, and an abort or a retire cuts it as
`AgentSession` does (an aborted turn and a `legion.run_cut` entry of cause `abort` or `stop`).

`write_project` makes the project such runs use (three roles that may nest, and the run's budgets) and `start_run`
an orchestrator on a fresh run directory with this host.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from legion.agents import load_catalog, load_settings
from legion.agents.catalog import Catalog
from legion.agents.settings import Settings
from legion.bus.protocol import AGENT_SETTLED
from legion.ledger import open_ledger
from legion.ledger.ledger import Ledger
from legion.orchestration.launch import RunContext
from legion.orchestration.orchestrator import Orchestrator
from legion.supervision import dispatch
from legion.supervision.lifecycle import Lifecycle
from legion.supervision.node_ops import Nodes
from legion.supervision.pool_child import PoolSessions
from legion.supervision.registry import Registry
from legion.workers.outcome import outcome_of_messages
from legion.workers.session import CUT_ABORT, CUT_STOP, RUN_CUT_TYPE
from legion.workers.session_service import NO_SESSION
from legion.workers.transcript import FsyncPolicy, Transcript, now_ms
from legion.workers.tree_budget import TreeBudget

CARDS: dict[str, int | None] = {"lead": None, "mid": 2, "worker": 1}  # the project's roles -> maxSubagentDepth
POOL = "pool"
POOL_PID = 4_000_000  # no process has it: nothing here is ever signalled
STOP_REASONS = {"success": "stop", "failed": "error", "truncated": "length"}  # the last turn of each outcome


@dataclass
class _Session:
    node_id: str
    transcript: Transcript
    running: bool = False
    queued: list[str] = field(default_factory=list)  # input for the run in progress (its next turn boundary)


class _PoolHandle:
    """The pool worker's live incarnation as the root's registry holds it (an `RpcChild` for the parts read here)."""

    id = POOL
    pid = POOL_PID
    alive = True
    stopping = False
    settled = False

    async def wait_exit(self) -> None:
        await asyncio.Event().wait()  # it never exits


@dataclass
class _Reply:
    body: dict[str, Any]


class _Control:
    """The control channel to the pool worker: each request is answered by the double."""

    def __init__(self, pool: PoolDouble) -> None:
        self.pool = pool

    async def request(self, worker_id: str, type_: str, body: dict[str, Any], timeout: float) -> _Reply:
        return _Reply(await self.pool.handle(body))


class _RootState:
    """What `Nodes` reads of its root (`RootState`): the lifecycle and control channel; no supervisor is needed
    for in-pool sessions."""

    def __init__(self, lifecycle: Lifecycle, control: _Control) -> None:
        self.lifecycle = lifecycle
        self.control = control
        self.observer = None
        self.supervisor = None
        self.stopping = False

    def publish(self, type: str, body: dict[str, Any]) -> None: ...


class PoolDouble:
    """The pool worker's sessions (see the module docstring); `nodes` is the Host to hand the orchestrator."""

    def __init__(self, ledger: Ledger, run_id: str, *, run_cost: float) -> None:
        self.ledger = ledger
        self.run_cost = run_cost
        self.sessions: dict[str, _Session] = {}
        self.spent: dict[str, float] = {}  # each node's cumulative cost, as its usage rows say
        lifecycle = Lifecycle(ledger, run_id=run_id)
        lifecycle.infra.add(POOL)
        registry = Registry()
        self.nodes = Nodes(registry, root=cast(Any, _RootState(lifecycle, _Control(self))), host=cast(Any, None),
                           root_id="root", root_node=False, ledger_path=ledger.path, backoff=None)
        rec = registry.record(POOL, "pool")
        rec.kind, rec.state, rec.handle = "pool", "running", cast(Any, _PoolHandle())
        rec.sessions = PoolSessions(POOL, lifecycle, lambda body, timeout: self.handle(body), lambda: POOL_PID,
                                    lambda: False, registry)
        self._relay = SimpleNamespace(nodes=self.nodes, publish=lambda type, body: None)

    # ----- what the test commands ----------------------------------------------------------------
    async def settle(self, node_id: str, outcome: str) -> None:
        """The running session's run ends with `outcome` (success, failed, truncated)."""
        session = self.sessions[node_id]
        assert session.running, f"{node_id} has no run to end"
        self._take_queued(session)
        text = f"{node_id}: result" if outcome != "failed" else ""
        message: dict[str, Any] = {"role": "assistant", "content": [{"type": "text", "text": text}] if text else [],
                                   "stopReason": STOP_REASONS[outcome], "timestamp": now_ms()}
        if outcome == "failed":
            message["errorMessage"] = "the model failed"
        session.transcript.append_message(message)
        session.running = False
        self.spent[node_id] = self.spent.get(node_id, 0.0) + self.run_cost
        self.ledger.upsert_usage(node_id, 10, 10, self.spent[node_id])  # the worker writes its usage itself
        await self._settled(session, {"stopReason": message["stopReason"], "outcome": outcome})

    def running(self) -> list[str]:
        return [n for n, s in self.sessions.items() if s.running]

    def close(self) -> None:
        for session in self.sessions.values():
            session.transcript.close()
        self.ledger.close()

    # ----- the control channel (`SessionService.handle_request`) -----------------------------------
    async def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        op = body.get("op")
        if op == "session.launch":
            return self._launch(body["spec"])
        if op == "session.admission":
            return {"ok": True, "slots": list(self.sessions), "queued": [], "maxActive": 10_000, "maxQueued": 32}
        if op == "session.retire":  # (a session it does not host: nothing to dispose, `found` says so)
            return await self._retire(self.sessions.pop(str(body.get("nodeId")), None))
        session = self.sessions.get(str(body.get("nodeId")))
        if session is None:
            return {"ok": False, "code": NO_SESSION, "error": f"no session {body.get('nodeId')!r} in this worker"}
        if op in ("session.prompt", "session.steer", "session.follow_up"):
            return {"ok": True, "disposition": self._input(session, str(body["text"]))}
        if op == "session.abort":
            if not session.running:
                return {"ok": True, "outcome": "no-turn"}
            await self._cut(session, CUT_ABORT)
            return {"ok": True, "outcome": "interrupted"}
        return {"ok": False, "code": "UNKNOWN_OP", "error": f"unknown op {op!r}"}

    async def _retire(self, session: _Session | None) -> dict[str, Any]:
        """Dispose a session: a run in progress is cut as its worker's stop cuts it (cause `stop`)."""
        if session is not None:
            if session.running:
                await self._cut(session, CUT_STOP)
            session.transcript.close()
        return {"ok": True, "found": session is not None, "survivors": [], "wasQueued": False}

    def _launch(self, spec: dict[str, Any]) -> dict[str, Any]:
        node_id = str(spec["nodeId"])
        if node_id in self.sessions:
            return {"ok": False, "code": "DUPLICATE", "error": f"session {node_id!r} is already hosted"}
        # (durability is not under test here: no fsync)
        transcript = Transcript.open(spec["transcript"], cwd=str(spec.get("cwd", ".")), fsync=FsyncPolicy.NEVER)
        session = self.sessions[node_id] = _Session(node_id, transcript)
        history = [m for m in transcript.messages() if m.get("role") in ("user", "assistant") and not m.get("customType")]
        if history:  # relaunched: a run its worker's stop cut goes on, unless this is a resume with new input
            session.running = _continues(transcript, spec.get("continueRun", True) is not False)
        elif spec.get("prompt"):
            self._input(session, str(spec["prompt"]))
        reply: dict[str, Any] = {"ok": True, "status": "started", "resumed": bool(history)}
        if not session.running:
            reply.update(idle=True, outcome=outcome_of_messages(transcript.messages()))
        return reply

    def _input(self, session: _Session, text: str) -> str:
        if session.running:
            session.queued.append(text)
            return "queued"
        session.transcript.append_message({"role": "user", "content": text, "timestamp": now_ms()})
        session.running = True
        return "accepted"

    def _take_queued(self, session: _Session) -> None:
        for text in session.queued:
            session.transcript.append_message({"role": "user", "content": text, "timestamp": now_ms()})
        session.queued.clear()

    async def _cut(self, session: _Session, cause: str) -> None:
        session.queued.clear()
        session.transcript.append_message({"role": "assistant", "content": [], "stopReason": "aborted",
                                           "timestamp": now_ms()})
        session.transcript.append_custom(RUN_CUT_TYPE, {"cause": cause})
        session.running = False
        await self._settled(session, {"stopReason": "aborted", "outcome": "aborted", "cut": cause})

    async def _settled(self, session: _Session, body: dict[str, Any]) -> None:
        """`agent_settled`, relayed as the root relays a pool's events (the orchestrator first, then the pool's book)."""
        event = {"name": AGENT_SETTLED, "nodeId": session.node_id, "error": None, **body}
        await dispatch.event(cast(Any, self._relay), cast(Any, _PoolHandle()), event, False)


def _continues(transcript: Transcript, continue_cut: bool) -> bool:
    """`AgentSession.continue_run`: a run goes on when its last real message is not an assistant's, or is a turn its
    worker's stop cut (and this relaunch is not a resume with new input)."""
    real = [m for m in transcript.messages() if not m.get("customType")]
    if not real:
        return False
    if real[-1].get("role") != "assistant":
        return True
    return continue_cut and real[-1].get("stopReason") == "aborted" and _last_cut(transcript) == CUT_STOP


def _last_cut(transcript: Transcript) -> str | None:
    for entry in reversed(transcript.entries):
        if entry.get("type") == "custom" and entry.get("customType") == RUN_CUT_TYPE:
            data = entry.get("data")
            return str(data.get("cause")) if isinstance(data, dict) else None
        message = entry.get("message")
        if entry.get("type") == "message" and isinstance(message, dict) and message.get("role") == "assistant":
            return None
    return None


def transcripts(run_dir: Path) -> int:
    """How many transcripts the run has (each launch starts one)."""
    return len(list(run_dir.glob("*.jsonl")))


# ----- the project and the run ---------------------------------------------------------------------

@dataclass(frozen=True)
class Project:
    cwd: Path
    settings: Settings
    catalog: Catalog
    env: dict[str, str]


def write_project(cwd: Path, legion: dict[str, Any]) -> Project:
    """A project at `cwd` with the `CARDS` roles (each may nest, up to its maxSubagentDepth) and `legion` settings."""
    agents = cwd / ".legion" / "agents"
    agents.mkdir(parents=True)
    for role, cap in CARDS.items():
        depth = f"maxSubagentDepth: {cap}\n" if cap is not None else ""
        (agents / f"{role}.md").write_text(
            f"---\nname: {role}\ndescription: A test {role}.\nkind: native\nallowNestedSubagents: true\n{depth}"
            f"restart: transient\ntools: [subagent]\n---\nYou are a {role}.\n", encoding="utf-8")
    (cwd / ".legion" / "settings.json").write_text(json.dumps({"legion": legion}), encoding="utf-8")
    env = {"HOME": str(cwd), "PATH": "/usr/bin:/bin"}
    settings = load_settings(cwd, env=env)
    return Project(cwd, settings, load_catalog(cwd, env=env, settings=settings), env)


def start_run(run_dir: Path, project: Project, *, max_cost: float | None = None,
              run_cost: float = 0.0) -> tuple[Orchestrator, PoolDouble]:
    """An orchestrator on `run_dir` (its ledger a SQLite file there) with the double pool as its host; nothing
    launched yet. Close the orchestrator, then `PoolDouble.close`."""
    ledger = open_ledger(run_dir / "legion.db")
    pool = PoolDouble(ledger, "r1", run_cost=run_cost)
    budget = TreeBudget(max_cost_usd=max_cost) if max_cost is not None else None
    ctx = RunContext(run_dir=run_dir, run_id="r1", cwd=project.cwd, settings=project.settings,
                     catalog=project.catalog, ledger=ledger, env=project.env, budget=budget)
    return Orchestrator(pool.nodes, ctx), pool
