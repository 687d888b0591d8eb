"""The orchestrator (docs/architecture.md §7): the root's agent tree, its launches and the results loop.

It is the only writer of the agent tree's lifecycle decisions in the root process; the legion tools of
every session reach it through the root's control channel (`handle_tool`), each action a handler in
`legion.orchestration.actions`. The results loop (`on_session_event`): a session settles → its outcome
and final output come from its transcript (docs/spec-conformance.md §2.1) → an immutable artifact `r<round>.md` →
a completion notice owed to its parent (the ledger's `undelivered` projection is the outbox: an idle
parent is woken at once with one batch, a running parent gets the batch at its run boundary) → the
run is done when the root session has settled, nothing is live and no notice is owed to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

from legion.agents.spawn_hints import append_hint
from legion.bus.control import ControlServer, SocketTuning
from legion.bus.protocol import AGENT_SETTLED, UI_REQUEST, USAGE, Message
from legion.bus.security import ipc_endpoint
from legion.codes import DISK_FULL, INTERNAL, RETIRE_FAILED, START_FAILED
from legion.ledger import Ledger
from legion.ledger.constants import OPERATOR_NODE, TERMINAL_PHASES, TREE_FINALIZED, Delivery
from legion.ledger.delivery_rules import is_terminal
from legion.ledger.errors import LedgerUnreachable
from legion.ledger.runfile import OPERATOR_SOCKET
from legion.ledger.writer import DiskFullError, background_task
from legion.orchestration.admission import ADMISSION_QUERY_TIMEOUT_S, AdmissionGate
from legion.orchestration.agent_tree import AgentNode, AgentTree, NodeWork
from legion.orchestration.blocked import on_ui_event
from legion.orchestration.carried_usage import CarriedUsage, carried_usage
from legion.orchestration.commands import ACTIONS, TOOLS, load_handlers
from legion.orchestration.launch import LaunchRequest, RunContext, plan_launch
from legion.orchestration.refusals import (
    CHILD_TERMINAL,
    INVALID_PARAMS,
    NAME_TAKEN,
    NOT_YOUR_CHILD,
    UNKNOWN_CHILD,
    ActionRefused,
)
from legion.workers.outcome import final_result, run_ends
from legion.workers.session import CUT_STOP
from legion.workers.session_service import NO_SESSION
from legion.workers.tools.action_specs import OPERATOR_ACTIONS, OPERATOR_CANCELLABLE, OPERATOR_RESERVED

if TYPE_CHECKING:
    from legion.orchestration.host import Host, Incarnation
    from legion.orchestration.postman import Postman
    from legion.orchestration.teams import Teams

NOTICE_MARKER = "▣ legion · automatic completion notice"
NOTICE_HELD_OVER_CAP = "notice_held_over_cap"  # the monitor event of the heldOverCap health signal
OPERATOR = OPERATOR_NODE  # the pseudo caller of operator actions: acts on any node of its run
OPERATOR_TUNING = SocketTuning(max_inflight_per_peer=32)  # one client's waits cannot take every slot
NOTICE_TEXT_CAP = 4000  # characters of each child's result inlined in a notice or a wait reply
POOL = "pool"
BUDGET_WARNING = 0.8  # the root is told once when this share of the cost budget is spent
# a batch of completion notices that could not be handed over (its parent's host restarting) is tried again
NOTICE_RETRY_S = 1.0
NOTICE_ATTEMPTS = 30
RESULT_TASKS = ("settled:", "settled-unseen:", "notices:", "notices-retry:")  # task names that hold the run's end
PENDING_SCAN = 10_000  # PENDING mail rows looked at by the end-of-run check (any to a node of the tree holds it)


_asking_host: contextvars.ContextVar[Incarnation | None] = contextvars.ContextVar("legion_asking_host", default=None)


def _operator_reserved(msg: Message) -> bool:
    """An operator request for the reserved lane: stop, abort or status."""
    return msg.type == "request" and msg.body.get("action") in OPERATOR_RESERVED


def did_you_mean(name: str, known: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


class Orchestrator:
    """Launches, supervises and collects the agent tree of one run."""

    def __init__(self, root: Host, ctx: RunContext, *, pool: str = POOL) -> None:
        self.root = root  # the supervision layer, through its narrow interface (`legion.orchestration.host`)
        self.ctx = ctx
        self.pool = pool
        self.tree = AgentTree()
        self.done = asyncio.Event()
        self.root_id: str | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        # the `heldOverCap` health signal (docs/spec-conformance.md §6.7): notices held over maxPendingAgeMs, each once
        self.held_over_cap = 0
        self._held_counted: set[int] = set()  # their artifact ids
        self._notices_given_up: set[str] = set()  # parents whose notice failed NOTICE_ATTEMPTS times: they hold no run
        self._budget_warned = False
        # what it has in flight for one node is that node's `work` (`AgentNode.work`), not a table here
        self.operator_server: ControlServer | None = None
        # the run's Postman and Teams runtime (`attach`): handlers reach them through the orchestrator they are given
        self.mail: Postman | None = None
        self.teams: Teams | None = None
        # extension points for the mail, phase and view layers (each callback must be quick and never raise):
        # "planned"(node) once it is in the tree, before its session starts (so `agent_launched` precedes
        # everything the session publishes); "launched"(node) once started; "status"(node, status, event, data);
        # "settled"(node) once its result is recorded
        self.hooks: dict[str, list[Callable[..., Any]]] = {"planned": [], "launched": [], "status": [],
                                                           "settled": []}
        load_handlers()
        root.serve_tools(self.handle_tool)
        root.subscribe_sessions(self.on_session_event)
        root.subscribe_status(self._on_status)

    # ----- launching --------------------------------------------------------------------------
    async def launch(self, parent: AgentNode | None, request: LaunchRequest) -> tuple[AgentNode, str]:
        """Plan (refusals raise ActionRefused and create nothing) and start one session; (node, started|queued)."""
        if request.tool_call and parent is not None:
            replay = self.tree.by_tool_call(parent.id, request.tool_call)
            named = [n for n in replay if n.task == request.task and request.name in (None, n.id)]
            if named:
                return named[0], "replayed"
        existing = self.tree.get(request.name) if request.name else None
        if existing is not None:
            # a launch that reuses a node's name waits for a revive of that node in progress (a resumed lead that
            # relaunches a child `legion resume` is bringing back): two starts of one node must never race. The lock
            # is the name's: the node this launch puts in the tree takes it over (`AgentTree.add`)
            async with existing.work.lock:
                return await self._launch(parent, request)
        return await self._launch(parent, request)

    async def _launch(self, parent: AgentNode | None, request: LaunchRequest) -> tuple[AgentNode, str]:
        previous = self.tree.get(request.name) if request.name else None
        if previous is not None and not previous.live and self.hosted(previous):
            # its status may not show it yet (a revive just brought it back): the host's word decides, and the tree
            # keeps the node that runs
            raise ActionRefused(f"name '{previous.id}' is taken by a {previous.role} whose session is still hosted; "
                                "pick another name, or steer/continue the existing one", NAME_TAKEN)
        self._gate()  # made before `plan_launch` consults it
        plan = await plan_launch(self.ctx, self.tree, parent, request)
        node = plan.node
        if previous is not None:
            node.rounds = previous.rounds
        self.tree.add(node)
        if parent is None:
            self.root_id = node.id
        self.fire("planned", node)
        try:
            if node.backend == "inprocess":
                try:
                    status = await self.root.launch_session(node.spec, pool=self.pool, restart=_restart(plan.restart),
                                                            role=node.role, name=node.id, parent_id=node.parent,
                                                            reserved=True)
                finally:
                    self._gate().done(node.id)  # the pool has answered: its own state counts it from now on
            else:
                await self.root.launch_rpc_session(node.spec, restart=_restart(plan.restart), role=node.role,
                                                   name=node.id)
                status = "started"
        except Exception as exc:
            if node.live:
                node.set_status("failed")
            raise ActionRefused(append_hint(f"'{node.id}' could not be started: {exc}", START_FAILED),
                              START_FAILED) from exc
        logger.info("launched {} ({}, {}, {}) under {}: {}", node.id, node.role, node.backend, node.model,
                    node.parent or "-", status)
        self.fire("launched", node)
        return node, status

    async def revive(self, node: AgentNode, message: str | None = None) -> str:
        """Bring back a node that is not hosted any more (retired, or its worker gone) from its transcript, then
        give it `message` as its first input. A hosted, settled node just gets the message (a new run).
        Concurrent revives of one node (two mails, a mail and a notice) run one after the other: the second
        finds it hosted and only prompts it."""
        async with node.work.lock:
            return await self._revive(node, message)

    async def _revive(self, node: AgentNode, message: str | None) -> str:
        if self.hosted(node):
            if not message:
                return "running" if node.live else "idle"
            # a running session queues the input for its next run boundary ("queued"): a revive that waited
            # behind another one which left the node running must still hand its message over, not drop it
            reply = await self.root.session_request(node.id, "session.prompt", text=message)
            if reply.get("code") == NO_SESSION and not self.hosted(node):
                pass  # its host lost it (a restarted pool): revived from its transcript below, not asked again
            elif not reply.get("ok"):
                raise ActionRefused(f"'{node.id}' did not take the input: {reply.get('error')}", INTERNAL)
            else:  # (an rpc node's `node_resumed` is written by `session_request`, as an in-pool one's)
                return str(reply.get("disposition", "accepted"))
        spec = {k: v for k, v in node.spec.items() if k != "prompt"}  # its transcript carries the conversation
        if self.root.parked(node.id):
            spec["restarted"] = False  # parked after it settled: nothing was cut, no "worker restarted" note
        if message and message.strip():
            # a resume with the caller's message (docs/spec-conformance.md §2.2): a run a stop or pause cut is not
            # continued first (no unprompted turn on a restart note); the message is its first model input
            spec["continueRun"] = False
        if node.backend == "inprocess":
            with self._gate().sending(node.id):  # not refused here, but counted for the launches meanwhile
                await self.root.launch_session(spec, pool=self.pool, role=node.role, name=node.id,
                                               parent_id=node.parent, resume=True)
        else:
            await self.root.launch_rpc_session(spec, role=node.role, name=node.id, resume=True)
        if message and message.strip():
            reply = await self.root.session_request(node.id, "session.prompt", text=message)
            if not reply.get("ok"):
                raise ActionRefused(f"'{node.id}' resumed but did not take the input: {reply.get('error')}", INTERNAL)
            return str(reply.get("disposition", "accepted"))
        return "resumed"

    def restore(self, rows: list[dict[str, Any]], records: dict[str, dict[str, Any]]) -> list[AgentNode]:
        """Rebuild the agent tree of an earlier root of this run (`legion resume`): one node per ledger row
        that has a launch record (`legion.orchestration.run` stores each node's fields and spec at launch); statuses and
        rounds come from the ledger, a finished node's outcome and final output from its transcript. Nothing
        is started: `revive` brings back the nodes asked for."""
        restored: list[AgentNode] = []
        for row in rows:
            record = records.get(str(row["id"]))
            if record is None:  # infrastructure (the pool) or a node launched by something else
                continue
            node = AgentNode(
                id=str(row["id"]), parent=row.get("parent_id"), depth=int(row.get("depth") or 0),
                role=str(row.get("role") or record.get("role") or ""), backend=record.get("backend", "inprocess"),
                model=str(row.get("model") or record.get("model") or ""), model_origin=str(record.get("model_origin", "")),
                transcript=Path(row.get("session_file") or record["transcript"]), spec=dict(record.get("spec") or {}),
                task=str(record.get("task", "")), generations=int(record.get("generations") or 1),
                team=row.get("team"), provider_pin=record.get("provider_pin"), thinking=record.get("thinking"),
                utility=bool(record.get("utility")), status=row["status"],
                # the launching call: a lead revived mid-launch replays that call and must get these nodes back
                tool_call=record.get("tool_call") if isinstance(record.get("tool_call"), str) else None,
                rounds=max((int(a["round"]) for a in self.ctx.ledger.list_artifacts(node_id=str(row["id"]))),
                           default=0))
            if not node.live:
                node.outcome, node.final_text = final_result(node.transcript)
                node.settled_at = (row.get("updated_at") or 0) / 1000 or None
            self.tree.add(node)
            if node.parent is None and node.depth == 0:
                self.root_id = node.id
            restored.append(node)
        return restored

    def subscribe(self, event: str, fn: Callable[..., Any]) -> None:
        self.hooks[event].append(fn)

    def attach(self, *, mail: Postman | None = None, teams: Teams | None = None) -> None:
        """The run's Postman and Teams runtime (one of each per orchestrator), for the handlers."""
        if mail is not None:
            self.mail = mail
        if teams is not None:
            self.teams = teams

    def detach(self, part: Postman | Teams) -> None:
        """`part` has closed: handlers no longer reach it."""
        if self.mail is part:
            self.mail = None
        if self.teams is part:
            self.teams = None

    def fire(self, event: str, *args: Any) -> None:
        for fn in list(self.hooks[event]):
            try:
                fn(*args)
            except Exception as exc:  # an extension never breaks the orchestrator
                logger.opt(exception=exc).error("orchestrator hook {} failed", event)

    # ----- lifecycle mirror and session events ------------------------------------------------
    def _on_status(self, node_id: str, status: str, event: str | None, data: dict[str, Any]) -> None:
        node = self.tree.get(node_id)
        if node is not None and node.status != status:
            node.set_status(status)  # type: ignore[arg-type]
            if status == "starting" or not node.live:  # its run (and any dialog it waited on) is over
                node.blocked_on = None
            work = node.work
            early = work.early_outcome if status == "running" else None
            if early is not None:
                work.early_outcome = None
                self.root.settled_outcome(node_id, early)
            self.fire("status", node, status, event, data)
            if not node.live and data.get("resumed") and not work.settling:
                # relaunched idle: its host may have died after its run ended but before its settle was seen
                work.settling = True
                ends = data.get("ends")
                self._spawn(self._settled_unseen(node, ends if isinstance(ends, int) else None),
                            f"settled-unseen:{node.id}")
            if not node.live:  # (a settle's own check waits until its results are recorded: `work.settling`)
                self.ctx.release(node.id)
                self._check_done()

    def on_session_event(self, worker_id: str, name: str, body: dict[str, Any]) -> None:
        """A session event relayed by the root (after the pool's own bookkeeping)."""
        node_id = body.get("nodeId") if isinstance(body.get("nodeId"), str) else worker_id
        node = self.tree.get(str(node_id))
        if node is None:
            return
        if name == USAGE:
            self._check_budget_warning()
        if name == UI_REQUEST:
            on_ui_event(self, node, body)
        if name == AGENT_SETTLED:
            node.blocked_on = None  # (its dialogs ended with its run; the worker says `expired` too)
            node.error = body.get("error") if isinstance(body.get("error"), str) else None
            usage = carried_usage(body) if node.backend == "rpc" and worker_id == node.id else None
            if body.get("cut") == CUT_STOP:
                # its worker stopped under the run (a pause, a stop, a retire, a team's restart): the run is not
                # over — a relaunch continues it — so it is no round: no artifact, no notice (docs/spec-conformance.md
                # §2.9); the status is the stop's own
                node.outcome = str(body.get("outcome") or "aborted")
                if usage is not None:
                    self._spawn(self.ctx.write(self._usage_op(node, usage)), f"usage:{node.id}")
                return
            outcome = body.get("outcome") if isinstance(body.get("outcome"), str) else "unknown"
            if node.backend == "rpc":
                if node.status == "starting":  # it settled before its launch was recorded: record it after
                    node.work.early_outcome = str(outcome)
                else:
                    self.root.settled_outcome(node.id, str(outcome))
            node.work.settling = True
            node.work.settles += 1
            self._spawn(self._settled(node, usage), f"settled:{node.id}")

    async def _settled_unseen(self, node: AgentNode, ends: int | None) -> None:
        """Record the end of a run the root never saw settle (its transcript held more ended runs than the node has
        results when it was relaunched): its result and notices, as for a settle. Otherwise nothing happens.

        `ends` is the count its worker took at the relaunch, before any new input: the transcript read here may
        already hold the end of the run that input started, whose own settle is still on its way."""
        seen = node.work.settles
        try:
            if ends is None:
                ends = await asyncio.to_thread(run_ends, node.transcript)
            recorded = max(node.rounds, len(self.ctx.ledger.list_artifacts(node_id=node.id)))
        except Exception as exc:
            logger.warning("checking {} for an unrecorded run end failed: {!r}", node.id, exc)
            ends, recorded = 0, 0
        if node.work.settles != seen:
            # it ran again meanwhile (new input after its relaunch) and that settle records its own round; counting
            # ends against artifacts now would record that round twice
            return
        if ends > recorded and not node.live:
            logger.info("{}: its last run ended unseen (its host died); recording its result", node.id)
            await self._settled(node)
            return
        node.work.settling = False  # (the task's end checks the run's end: `_task_done`)

    async def _settled(self, node: AgentNode, usage: CarriedUsage | None = None) -> None:
        """Artifact of this round (and the usage its settle carried), then notices owed to its parent and to itself."""
        try:
            await self._record_settle(node, usage)
        finally:
            node.work.settling = False
            node.touch()
            self.fire("settled", node)  # (the task's end checks the run's end: `_task_done`)

    @staticmethod
    def _usage_op(node: AgentNode, usage: CarriedUsage) -> Callable[[Ledger], None]:
        """The write of the usage a cut run's settle carried (no round to record it with), after its transcript is
        durable (docs/architecture.md §5, "Durability": the row names the settle's lines)."""
        transcript = node.transcript

        def record(led: Ledger) -> None:
            if transcript.exists():
                led.make_durable(transcript)
            usage.record(led, node.id)

        return record

    async def _record_settle(self, node: AgentNode, usage: CarriedUsage | None) -> None:
        outcome, text = (final_result(node.transcript) if _small_file(node.transcript)
                         else await asyncio.to_thread(final_result, node.transcript))
        node.outcome, node.final_text = outcome, text
        node.reserved_usd = 0.0
        self.ctx.release(node.id)
        try:
            # the node's rounds are this root's own count (only the root writes artifacts; a rebuilt node starts
            # from its last recorded round): no ledger read per settle
            node.rounds += 1
            body, run_dir, rnd = text or f"(no final output; outcome {outcome})", self.ctx.run_dir, node.rounds
            transcript = node.transcript

            def record(led: Ledger) -> int:
                # the result was read from the transcript: both are on disk before the row lands (with the
                # writer's batch: one sync for every file of it; docs/architecture.md §5, "Durability")
                if transcript.exists():
                    led.make_durable(transcript)
                if usage is not None:  # (an rpc settle's: its row names the same lines)
                    usage.record(led, node.id)
                return led.write_artifact(run_dir, node_id=node.id, name=node.id, round=rnd, text=body)

            await self.ctx.write(record)
        except Exception as exc:  # a result that cannot be recorded is logged, the tree goes on
            logger.error("artifact of {} round {} not written: {!r}", node.id, node.rounds, exc)
        if node.parent is not None:
            await self.deliver_notices(node.parent)
        if self.tree.children(node.id):  # (a leaf is owed nothing: no ledger read per worker)
            await self.deliver_notices(node.id)  # its own children finished while it was busy
        if node.parent is not None and node.backend == "inprocess":
            # under the node's lock, and only if it is still settled then: this settle's task can lag behind a
            # revive that relaunched the node for new input, and parking would dispose that new session
            async with node.work.lock:
                if not node.live and self.hosted(node):
                    await self.root.park(node.id)  # its pool slot is free; new input relaunches it from its transcript

    def _check_budget_warning(self) -> None:
        """One notice to the root session when the run has spent 80 % of its cost budget."""
        budget = self.ctx.budget
        if self._budget_warned or budget is None or not budget.max_cost_usd or self.root_id is None:
            return
        limit = budget.max_cost_usd
        spent = budget.charged_usd(self.ctx.ledger.usage_totals())
        if spent < BUDGET_WARNING * limit:
            return
        self._budget_warned = True
        text = (f"{NOTICE_MARKER} (not from the operator): the run has spent ${spent:.4f} of its ${limit:.4f} "
                f"cost budget ({spent / limit:.0%}). Launches that would exceed it are refused and a session "
                "whose next turn would exceed it stops; finish with what you have.")
        self._spawn(self._steer_root(text), "budget-warning")

    async def _steer_root(self, text: str) -> None:
        assert self.root_id is not None
        root = self.tree.get(self.root_id)
        op = "session.steer" if root is not None and root.live else "session.follow_up"
        try:
            await self.root.session_request(self.root_id, op, text=text)
        except Exception as exc:
            logger.warning("budget notice to the root session not delivered: {!r}", exc)

    # ----- completion notices -----------------------------------------------------------------
    async def deliver_notices(self, parent_id: str, attempt: int = 1) -> None:
        """Wake an idle parent with one batch of the results it is owed (the ledger's undelivered)."""
        parent = self.tree.get(parent_id)
        if parent is None or parent.live or parent.work.notifying or parent.work.resuming:
            return  # a running parent gets the batch when it settles (its run boundary); a resuming one after it is back
        pending = self.ctx.ledger.undelivered(parent_id)
        if not pending:
            return
        work = parent.work
        work.notifying = True
        try:
            text = self.notice_text(pending)
            await self.revive(parent, text)  # a parked or retired-but-resumable parent is relaunched first
            ids = [int(art["id"]) for art in pending]
            await self.ctx.write(lambda led: _each(led.mark_notified, [(i, parent_id) for i in ids]))
            self._notices_given_up.discard(parent_id)
        except Exception as exc:  # the projection still owes it: tried again shortly, and at the next boundary
            if attempt >= NOTICE_ATTEMPTS:
                logger.error("completion notice to {} not delivered after {} attempts: {!r}", parent_id, attempt, exc)
                self._notices_given_up.add(parent_id)
                return
            logger.warning("completion notice to {} not delivered ({!r}); trying again in {:g} s", parent_id, exc,
                           NOTICE_RETRY_S)
            # the retry holds the run open (`_check_done`): with nothing else left to happen (its host restarting
            # after every other node settled) the owed result would otherwise never reach the parent
            work.holds += 1
            self._spawn(self._notices_later(parent_id, work, attempt + 1), f"notices-retry:{parent_id}")
            return
        finally:
            work.notifying = False
            # the parent may have run and settled while this batch was in flight: its settle's own check of
            # the run's end saw the delivery busy, so the check is made again now
            self._check_done()
        # (teams) the parent may have run and settled while this batch was in flight: its settle saw the
        # delivery busy and skipped the results that arrived meanwhile, so they are delivered now
        if not parent.live and self.ctx.ledger.undelivered(parent_id):
            self._spawn(self.deliver_notices(parent_id), f"notices:{parent_id}")

    async def _notices_later(self, parent_id: str, work: NodeWork, attempt: int) -> None:
        try:
            await asyncio.sleep(NOTICE_RETRY_S)
            await self.deliver_notices(parent_id, attempt)  # (a failure holds the run again, for its own retry)
        finally:
            work.holds -= 1  # (the task's end checks the run's end: `_task_done`)

    def count_held_notices(self, now_ms: int) -> int:
        """Count toward `heldOverCap` each completion notice held (its parent's run still going: it is delivered at
        the run boundary) longer than maxPendingAgeMs, once; a health signal on the monitor and in the log that
        sends nothing. Returns the count so far."""
        cap = self.ctx.settings.legion.max_pending_age_ms
        parents = {n.parent for n in self.tree if n.parent}
        for node in self.tree:
            if node.id not in parents or not self.running(node):
                continue
            for art in self.ctx.ledger.undelivered(node.id):
                age = now_ms - int(art["created_at"])
                if int(art["id"]) in self._held_counted or age < cap:
                    continue
                self._held_counted.add(int(art["id"]))
                self.held_over_cap += 1
                logger.warning("completion notice of {} round {} held {} ms for {} (still running): heldOverCap {}",
                               art["node_id"], art["round"], age, node.id, self.held_over_cap)
                self.root.publish(NOTICE_HELD_OVER_CAP, {"node_id": node.id, "child": art["node_id"],
                                                         "round": art["round"], "ageMs": age,
                                                         "heldOverCap": self.held_over_cap})
        return self.held_over_cap

    def notice_text(self, artifacts: list[dict[str, Any]]) -> str:
        lines = [f"{NOTICE_MARKER} (not from the operator): {len(artifacts)} result(s) arrived."]
        for art in artifacts:
            child = self.tree.get(str(art["node_id"]))
            lines.append("")
            lines.append(self.result_block(child, art) if child else f"- {art['name']}: {art['path']}")
        lines.append("")
        lines.append("Use `subagent collect` for a full result, `subagent status` for the tree.")
        return "\n".join(lines)

    def result_block(self, child: AgentNode, art: dict[str, Any] | None = None) -> str:
        """One child's result for a wait or a notice: its round's own text (from the artifact when one is named:
        a batch listing two rounds of one child shows each), then where its whole conversation is."""
        head = f"- {child.id} ({child.role}, {child.model}): {child.status}"
        if child.outcome:
            head += f", outcome {child.outcome}"
        if art is not None:
            head += f" — artifacts/{child.id}/r{art['round']}.md ({art['bytes']} bytes)"
        text = (self._round_text(art) if art is not None else None) or child.final_text
        text = text.strip()
        if len(text) > NOTICE_TEXT_CAP:
            text = text[:NOTICE_TEXT_CAP] + f"\n  … [{len(text) - NOTICE_TEXT_CAP} more characters: collect it]"
        lines = [head, *("  " + line for line in text.splitlines())]
        lines.append(f"  Complete conversation: {child.transcript}")
        return "\n".join(lines)

    def _round_text(self, art: dict[str, Any]) -> str | None:
        """The text of one recorded round (its artifact file), None when it cannot be read."""
        try:
            with (self.ctx.run_dir / str(art["path"])).open("rb") as fh:
                return fh.read(NOTICE_TEXT_CAP * 4 + 4096).decode("utf-8", "replace")
        except (OSError, KeyError):
            return None

    def running(self, node: AgentNode) -> bool:
        """Its run goes on, or its settle's results (artifact, outcome) are not yet recorded."""
        return node.live or node.work.settling

    def busy(self, node: AgentNode) -> bool:
        """`running`, or held by a layer that has work in flight for it (`hold`)."""
        return self.running(node) or node.work.holds > 0

    @contextlib.asynccontextmanager
    async def resuming(self, node: AgentNode) -> AsyncIterator[None]:
        """While `legion resume` brings `node` back: it counts as busy (the run's end waits for it) and completion
        notices to it wait, so that its own resume input comes first (docs/spec-conformance.md §2.10); what it
        is owed meanwhile reaches it at its next run boundary, or is delivered by the caller once it is back."""
        work = node.work
        work.holds += 1
        work.resuming = True
        try:
            yield
        finally:
            work.resuming = False
            work.holds = max(0, work.holds - 1)
            node.touch()
            self._check_done()

    def hold(self, node: AgentNode, coro: Any, name: str) -> None:
        """Run `coro` (supervisor work for `node`: a verification, a phase message) in the background while
        `node` counts as busy: a parent's wait and the run's end wait for it."""
        work = node.work
        work.holds += 1

        async def held() -> None:
            try:
                await coro
            finally:
                work.holds -= 1
                if work.holds <= 0:
                    work.holds = 0
                    node.touch()
                    self._check_done()

        self._spawn(held(), name)

    def spawn(self, coro: Any, name: str) -> None:
        """A background task of the orchestrator (cancelled at close; a failure is logged)."""
        self._spawn(coro, name)

    async def consume(self, reader: str, children: list[AgentNode], *, whole: bool = False) -> None:
        """`reader` has read these children's results in full (a wait inlines them up to a cap; collect reads them
        whole): it no longer owes a notice for them — unless the worker that asked died meanwhile (its reply
        is lost with it, so the results stay owed and reach the restarted reader as a notice). One write for
        them all (a wait that returns a lead's hundred results is one write, not a hundred in a row)."""
        asking = _asking_host.get()
        if asking is not None and (asking is not self._host_of(self.tree.get(reader)) or not asking.alive):
            return
        reads = [(int(a["id"]), reader, int(a["bytes"])) for child in children
                 if whole or len(child.final_text) <= NOTICE_TEXT_CAP
                 for a in self.ctx.ledger.list_artifacts(node_id=child.id) if a["parent_id"] == reader]
        if reads:
            with contextlib.suppress(Exception):
                await self.ctx.write(lambda led: _each(led.record_consumption, reads))

    # ----- run completion ---------------------------------------------------------------------
    def _check_done(self) -> None:
        root = self.tree.get(self.root_id) if self.root_id else None
        # a batch of completion notices on its way to any node holds the run: it reopens that node (a summons, as
        # mail is), whose settle checks again
        if root is None or root.live or any(n.live or n.work.settling or n.work.holds > 0 or n.work.notifying
                                            for n in self.tree):
            return
        if self._results_in_flight():
            return
        if self.ctx.ledger.undelivered(root.id):
            return
        if self._notice_owed():
            return
        if self._mail_owed():
            return
        self.done.set()

    def _results_in_flight(self) -> bool:
        """A settle or a batch of notices spawned and not finished (other than the caller's own task): what it records
        or delivers may wake a node, so the run is not over yet; its end checks again (`_task_done`)."""
        me = asyncio.current_task()
        return any(t is not me and not t.done() and t.get_name().startswith(RESULT_TASKS) for t in self._tasks)

    def _notice_owed(self) -> bool:
        """A result still owed to a node that can take it holds the run, as mail does: its delivery wakes that node,
        whose own result then goes up the tree. (A batch that finds new results on its way back spawns their
        delivery after the check in its `finally` has run: without this the run could end just before it.) The
        delivery is started here when none is on its way."""
        owed = False
        for node_id in self.ctx.ledger.owed_consumers():
            node = self.tree.get(node_id)
            if (node is None or node_id in self._notices_given_up or node.status not in ("settled", "retired")
                    or node.mail.paused or is_terminal(self.ctx.ledger.get_node(node_id))):
                continue
            owed = True
            if not node.work.notifying:
                self._spawn(self.deliver_notices(node_id), f"notices:{node_id}")
        return owed

    def _mail_owed(self) -> bool:
        """PENDING mail to a node of this tree: mail is a summons (the postman prompts or revives its recipient, or
        bounces it when it can never take mail), so the run ends only when none is left."""
        pending = self.ctx.ledger.messages_in_state(Delivery.PENDING, limit=PENDING_SCAN)
        return any(str(row["to_node"]) in self.tree for row in pending)

    async def finalize(self, status: str) -> None:
        """The run's tree is final (its root's work is done, nothing is live, no notice is owed): `tree_finalized`
        on the root, in the ledger and on the monitor. A pause or a timeout is not final (`legion resume`)."""
        if self.root_id is None:
            return
        statuses: dict[str, int] = {}
        for node in self.tree:
            statuses[node.status] = statuses.get(node.status, 0) + 1
        data = {"status": status, "nodes": len(self.tree), "statuses": statuses, "heldOverCap": self.held_over_cap}
        root_id = self.root_id
        try:
            await self.ctx.write(lambda led: led.append_event(root_id, TREE_FINALIZED, data))
        except Exception as exc:  # the run's result stands; only its final event is missing
            logger.error("tree_finalized not recorded: {!r}", exc)
            return
        self.root.publish(TREE_FINALIZED, {"node_id": root_id, **data})

    # ----- tools ------------------------------------------------------------------------------
    async def handle_tool(self, node_id: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        """A legion tool call from session `node_id`; never raises (errors are replies)."""
        caller = self.tree.get(node_id)
        if caller is None:
            return {"ok": False, "code": UNKNOWN_CHILD, "text": f"{tool}: node {node_id!r} is not part of this run"}
        handler = TOOLS.get(tool)
        if handler is None:
            return {"ok": False, "code": INVALID_PARAMS,
                    "text": f"unknown legion tool {tool!r}; known: {', '.join(sorted(TOOLS))}"}
        started = time.monotonic()
        token = _asking_host.set(self._host_of(caller))
        try:
            reply = await handler(self, caller, args)
        except ActionRefused as exc:
            reply = {"ok": False, "code": exc.code, "text": f"{exc.code}: {exc}", "details": exc.details or None}
        except DiskFullError as exc:  # the run pauses; `legion resume` continues once there is space
            reply = {"ok": False, "code": DISK_FULL, "text": f"{tool}: not done, {exc}; the run is pausing (free "
                                                               "space, then `legion resume` continues it)"}
        except LedgerUnreachable as exc:  # an outage the writer rides out (or the run pauses for): no traceback
            logger.warning("legion tool {} from {} not done: {}", tool, node_id, exc)
            reply = {"ok": False, "code": INTERNAL, "text": f"{tool}: not done, {exc}; try again shortly"}
        except Exception as exc:
            logger.exception("legion tool {} from {} failed", tool, node_id)
            reply = {"ok": False, "code": INTERNAL, "text": f"{tool} failed inside the root: {type(exc).__name__}: {exc}"}
        finally:
            _asking_host.reset(token)
        logger.debug("{} {} from {} in {:.1f} ms", tool, args.get("action", ""), node_id,
                     (time.monotonic() - started) * 1000)
        return {k: v for k, v in reply.items() if v is not None}

    # ----- the operator ---------------------------------------------------------------------------
    async def serve_operator(self) -> str:
        """Serve operator actions (`legion steer|launch|… RUN`) on ipc://<run_dir>/op.sock; returns the endpoint.

        A separate socket from the workers' control channel: the workers' ROUTER admits only the identities it
        handed out, while an operator is any process of the same user (the socket's permissions)."""
        self.operator_server = ControlServer(ipc_endpoint(self.ctx.run_dir, OPERATOR_SOCKET),
                                             on_message=self._on_operator, name="operator", tuning=OPERATOR_TUNING,
                                             reserved=_operator_reserved, cancel_on_disconnect=True)
        return await self.operator_server.start()

    async def _on_operator(self, peer: str, msg: Message) -> dict[str, Any] | None:
        if msg.corr is None:
            return None
        body = msg.body
        action = body.get("action")
        raw = body.get("args")
        args: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if msg.type != "request" or action not in OPERATOR_ACTIONS:
            return {"ok": False, "code": INVALID_PARAMS,
                    "text": f"unknown operator action {action!r}; known: {', '.join(OPERATOR_ACTIONS)}"}
        if action in OPERATOR_CANCELLABLE:  # a gone client's waits end with it
            return await self.handle_operator(str(action), dict(args))
        # an action that changes the tree runs to its end even if its client goes: a launch cut after its row was
        # reserved would leave a live `starting` node that nothing settles (and a launch record resume revives)
        return await asyncio.shield(self.handle_operator(str(action), dict(args)))

    async def handle_operator(self, action: str, args: dict[str, Any]) -> dict[str, Any]:
        """An operator action, with the same handlers, replies and refusals as the `subagent` tool."""
        if action == "launch":
            parent = args.pop("parent", None) or self.root_id
            caller = self.tree.get(str(parent)) if parent else None
            if caller is None:
                return {"ok": False, "code": UNKNOWN_CHILD, "text": f"no node {parent!r} to launch under"}
        else:
            caller = self.operator
        try:
            reply = await ACTIONS[action](self, caller, {**args, "action": action})
        except ActionRefused as exc:
            reply = {"ok": False, "code": exc.code, "text": f"{exc.code}: {exc}", "details": exc.details or None}
        except Exception as exc:
            logger.exception("operator action {} failed", action)
            reply = {"ok": False, "code": INTERNAL, "text": f"{action} failed inside the root: {exc}"}
        return {k: v for k, v in reply.items() if v is not None}

    @property
    def operator(self) -> AgentNode:
        """The operator as a caller: the parent of the root session, with authority over every node."""
        return AgentNode(id=OPERATOR, parent=None, depth=-1, role="operator", backend="inprocess", model="",
                         model_origin="", transcript=self.ctx.run_dir, spec={}, task="", generations=64)

    def child_of(self, caller: AgentNode, name: Any) -> AgentNode:
        """The caller's own child `name` (authority follows the tree; the operator may act on any node)."""
        if not isinstance(name, str) or not name:
            raise ActionRefused("'name' is required: the child to act on", INVALID_PARAMS)
        node = self.tree.get(name)
        if caller.id == OPERATOR:
            if node is None:
                raise ActionRefused(f"no node named '{name}' in this run{did_you_mean(name, [n.id for n in self.tree])}",
                                  UNKNOWN_CHILD)
            return node
        mine = [c.id for c in self.tree.children(caller.id)]
        if node is None:
            raise ActionRefused(f"no node named '{name}'{did_you_mean(name, mine)}; your children: "
                              f"{', '.join(mine) or '(none)'}", UNKNOWN_CHILD)
        if node.parent != caller.id:
            raise ActionRefused(f"'{name}' is not your child (its parent is '{node.parent or 'the operator'}'); "
                              f"you can act only on your own children: {', '.join(mine) or '(none)'}", NOT_YOUR_CHILD)
        return node

    def terminal_phase(self, node: AgentNode) -> str | None:
        """The node's phase when it is a terminal one (its result stands: nothing revives it), else None."""
        phase = (self.ctx.ledger.get_node(node.id) or {}).get("phase")
        return str(phase) if phase in TERMINAL_PHASES else None

    def require_not_terminal(self, node: AgentNode) -> None:
        phase = self.terminal_phase(node)
        if phase is not None:
            raise ActionRefused(f"'{node.id}' is in terminal phase '{phase}'; launch a new node instead", CHILD_TERMINAL)

    # ----- retire -----------------------------------------------------------------------------
    async def retire_subtree(self, node: AgentNode, *, cause: str, force: bool = False) -> list[str]:
        """Retire `node` and its live descendants (children first); returns the retired ids."""
        done: list[str] = []
        for child in reversed(self.tree.subtree(node.id)):
            if await self._retire_one(child, cause, force):
                done.append(child.id)
        if await self._retire_one(node, cause, force):
            done.append(node.id)
        return done

    async def _retire_one(self, node: AgentNode, cause: str, force: bool) -> bool:
        if node.status == "retired" and not self.hosted(node):
            return False
        try:
            await self.root.retire(node.id, cause=cause, force=force)
        except Exception as exc:
            if not self.hosted(node):
                return False
            raise ActionRefused(f"retiring '{node.id}' failed: {exc}", RETIRE_FAILED) from exc
        return True

    def _host_of(self, node: AgentNode | None) -> Incarnation | None:
        """The live worker incarnation hosting `node` (its pool's, or its own), None if none."""
        if node is None or node.id == OPERATOR:
            return None
        return self.root.host_of(node.id if node.backend == "rpc" else self.pool)

    def hosted(self, node: AgentNode) -> bool:
        return self.root.hosted(node.id)

    def _in_pool(self) -> set[str]:
        """The nodes that may hold a pool slot or wait in its queue: in-process ones live or hosted."""
        return {n.id for n in self.tree if n.backend == "inprocess" and (n.live or self.hosted(n))}

    def _gate(self) -> AdmissionGate:
        """The run's admission gate for this orchestrator's pool (made on first use)."""
        if self.ctx.admission is None:
            def capacity() -> int:
                limits = self.ctx.settings.inprocess
                return limits.max_active + limits.max_queued_launches

            self.ctx.admission = AdmissionGate(
                lambda: self.root.session_request(self.pool, "session.admission", timeout=ADMISSION_QUERY_TIMEOUT_S),
                capacity=capacity, known=self._in_pool, bound=lambda: len(self.tree))
        return self.ctx.admission

    # ----- helpers ----------------------------------------------------------------------------
    def _spawn(self, coro: Any, name: str) -> None:
        task = background_task(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.opt(exception=task.exception()).error("orchestrator task {} failed", task.get_name())
        if task.get_name().startswith(RESULT_TASKS) and not task.cancelled():  # (cancelled: the run is closing)
            try:
                self._check_done()
            except Exception as exc:  # a callback must not raise; the next settle or sweep checks again
                logger.warning("end-of-run check after {} failed: {!r}", task.get_name(), exc)

    async def close_operator(self) -> None:
        """Stop serving the operator socket (the first part of a run to stop)."""
        server, self.operator_server = self.operator_server, None
        if server is not None:
            with contextlib.suppress(Exception):
                await server.close()
            with contextlib.suppress(OSError):  # no socket file of a finished run invites a hanging request
                (self.ctx.run_dir / OPERATOR_SOCKET).unlink()

    async def close(self) -> None:
        await self.close_operator()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task


def _each(fn: Callable[..., None], calls: list[tuple[Any, ...]]) -> None:
    for args in calls:
        fn(*args)


INLINE_READ_BYTES = 64 * 1024  # a transcript this small is read on the loop: quicker than a hop to a thread and back


def _small_file(path: Path) -> bool:
    try:
        return os.stat(path).st_size <= INLINE_READ_BYTES
    except OSError:  # unreadable: `final_result` says so, in a thread like any other
        return False


def _restart(value: str) -> Any:
    return value if value in ("permanent", "transient", "temporary") else "transient"
