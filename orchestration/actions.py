"""The handlers of the `subagent` tool's 13 actions (docs/spec-conformance.md §2.2), `vexillatio` and `legion_tree`,
registered in `legion.orchestration.commands` against their specs (`legion.workers.tools.action_specs`). Authority follows the tree: a node acts only on its own children
(`NOT_YOUR_CHILD`); the operator may act on any node of its run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, Final

import orjson

from legion.bus.protocol import NODE_ABORTED, NODE_STEERED
from legion.codes import INTERNAL
from legion.ledger.constants import BUDGET_REFUSED, NODE_ABANDONED, NODE_FAILED
from legion.orchestration.agent_tree import AgentNode
from legion.orchestration.blocked import answer as answer_blocked
from legion.orchestration.blocked import describe, notice_text
from legion.orchestration.commands import ACTIONS, Reply, action, tool
from legion.orchestration.launch import LaunchRequest
from legion.orchestration.orchestrator import OPERATOR, Orchestrator
from legion.orchestration.refusals import INVALID_PARAMS, SUBAGENT_NOT_STEERABLE, UNKNOWN_CHILD, ActionRefused
from legion.workers.session_service import NO_SESSION
from legion.workers.tools.action_specs import DECISIONS, SUBAGENT_ACTIONS

DEFAULT_WAIT_MS = 300_000


def _ok(text: str, **details: Any) -> Reply:
    return {"ok": True, "text": text, "details": details or None}


def _launch_line(node: AgentNode, status: str) -> str:
    queued = " (queued: the pool is full; it starts when a slot frees)" if status == "queued" else ""
    line = f"▶ {node.id} ({node.role}) on {node.backend}, model {node.model} [{node.model_origin}]{queued}"
    return "\n".join([line, *(f"  ⚠ {node.id}: {w}" for w in node.warnings)])


# ----- subagent ---------------------------------------------------------------------------------

@tool("subagent")
async def subagent(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    name = args.get("action")
    if name not in SUBAGENT_ACTIONS:  # the operator's own actions (mail, pause) are not the model's
        raise ActionRefused(f"/action: must be one of {', '.join(SUBAGENT_ACTIONS)}, got {name!r}", INVALID_PARAMS)
    return await ACTIONS[name](orch, caller, args)


@action("launch")
async def launch(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    tasks = args.get("tasks")
    if tasks:
        if args.get("task") not in (None, ""):  # one shape per request: the top-level task would be dropped
            raise ActionRefused("/task: a launch has either 'agent' + 'task' (one child) or 'tasks[]' (a batch, "
                                "each step with its own 'task'; a top-level 'agent' is their default), not both: "
                                "move the task into a step", INVALID_PARAMS)
        if not isinstance(tasks, list):
            raise ActionRefused(f"/tasks: must be a list of steps ({{\"agent\", \"task\", \"name\"?, \"model\"?}}), "
                              f"got {type(tasks).__name__}", INVALID_PARAMS)
        steps = [_step(args, t, i) for i, t in enumerate(tasks)]
    else:
        if not isinstance(args.get("task"), str) or not args["task"].strip():
            raise ActionRefused("/task: a launch needs a non-empty 'task' (or 'tasks[]')", INVALID_PARAMS)
        if not isinstance(args.get("agent"), str):
            raise ActionRefused("/agent: a launch needs 'agent' (a role such as worker, reviewer, planner)",
                              INVALID_PARAMS)
        steps = [_request(args, args["agent"], args["task"], args.get("name"), args.get("model"),
                          args.get("preset"), args.get("cwd"))]
    names = [s.name for s in steps if s.name]
    if len(set(names)) != len(names):
        raise ActionRefused("tasks[]: names must be unique within one launch", INVALID_PARAMS)
    results = await asyncio.gather(*(orch.launch(caller, s) for s in steps), return_exceptions=True)
    lines, launched, failed = [], [], []
    for step, result in zip(steps, results, strict=True):
        if isinstance(result, BaseException):
            code = getattr(result, "code", INTERNAL)
            failed.append({"name": step.name, "agent": step.agent, "code": code, "error": str(result)})
            lines.append(f"✗ {step.name or step.agent}: {code}: {result}")
        else:
            node, status = result
            launched.append({"name": node.id, "backend": node.backend, "model": node.model,
                             "origin": node.model_origin, "status": status, "warnings": list(node.warnings)})
            lines.append(_launch_line(node, status))
    reply = {"ok": not failed, "text": "\n".join(lines), "details": {"launched": launched, "refused": failed}}
    if failed and not launched:
        reply["code"] = failed[0]["code"]
    return reply


def _step(args: dict[str, Any], task: Any, i: int) -> LaunchRequest:
    """One `tasks[]` step, each field checked: a malformed step is INVALID_PARAMS naming its path."""
    if not isinstance(task, dict):
        raise ActionRefused(f"/tasks/{i}: each step must be an object ({{\"agent\", \"task\", \"name\"?, "
                          f"\"model\"?}}), got {type(task).__name__} {str(task)[:60]!r}", INVALID_PARAMS)
    agent = task.get("agent") or args.get("agent")
    if not isinstance(agent, str) or not agent:
        raise ActionRefused(f"/tasks/{i}/agent: each step needs an agent (in the step or at the top level)",
                          INVALID_PARAMS)
    text = task.get("task")
    if not isinstance(text, str) or not text.strip():
        raise ActionRefused(f"/tasks/{i}/task: each step needs a non-empty 'task' string", INVALID_PARAMS)
    for key in ("name", "model", "preset", "cwd"):
        if task.get(key) is not None and not isinstance(task[key], str):
            raise ActionRefused(f"/tasks/{i}/{key}: must be a string, got {type(task[key]).__name__}", INVALID_PARAMS)
    model = (task.get("model") or "").strip() or args.get("model")
    preset = (task.get("preset") or "").strip() or args.get("preset")
    return _request(args, agent, text, task.get("name"), model, preset, task.get("cwd") or args.get("cwd"))


def _request(args: dict[str, Any], agent: str, task: str, name: Any, model: Any, preset: Any,
             cwd: Any = None) -> LaunchRequest:
    return LaunchRequest(agent=agent.strip(), task=task, name=name, model=model or None, preset=preset or None,
                         team=args.get("team"), worktree=args.get("worktree"), phases=args.get("phases"),
                         start=args.get("start"), cwd=cwd, tool_call=args.get("_callId"))


@action("steer")
async def steer(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    """A running child queues the message for its next turn boundary (`queued`); a child with no turn in progress
    (settled, or retired or failed outside a terminal phase) starts a turn with it, as `continue` does (`accepted`:
    docs/spec-conformance.md §3.3). Only a child in a terminal phase is not steerable. A `blocked` child's run waits
    on an extension's dialog: the message answers it (docs/spec-conformance.md §2.1)."""
    child = orch.child_of(caller, args.get("name"))
    message = _message(args)
    phase = orch.terminal_phase(child)
    if phase is not None:
        raise ActionRefused(f"'{child.id}' is not steerable: it is in terminal phase '{phase}' (status {child.status}) "
                          "and takes no more input; its result stands — launch a new node for more work",
                          SUBAGENT_NOT_STEERABLE, state=child.status, phase=phase)
    if child.blocked_on is not None:  # its run waits on an extension's dialog: the message is the answer
        how = await answer_blocked(orch, child, message)
    elif not child.live:
        how = await orch.revive(child, message)
    else:
        reply = await orch.root.session_request(child.id, "session.steer", text=message)
        _check(reply, "steer")
        how = str(reply["disposition"])
    orch.root.publish(NODE_STEERED, {"node_id": child.id, "name": child.id, "disposition": how, "by": caller.id})
    return _ok(f"steer → {child.id}: {how}", disposition=how)


@action("abort")
async def abort(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    """Interrupt a child's current turn (docs/spec-conformance.md §3.3): `interrupted`, `timeout`, or `no-turn`
    when none is in progress (settled, parked, stopped, aborted already: nothing is done, no queue cleared), so
    an abort is safe to repeat. The reply states the child's status after it."""
    child = orch.child_of(caller, args.get("name"))
    if not orch.hosted(child):  # parked, stopped, its worker gone: no session, so no turn to interrupt
        return _abort_reply(orch, child, "no-turn")
    body: dict[str, Any] = {"clearQueued": args.get("clearQueued", True) is not False}
    if isinstance(args.get("timeoutMs"), int):
        body["timeoutMs"] = args["timeoutMs"]
    settles = child.work.settles  # the cut run's settle is the next one
    reply = await orch.root.session_request(child.id, "session.abort", **body)
    if reply.get("code") == NO_SESSION:  # put away between the look and the request
        return _abort_reply(orch, child, "no-turn")
    _check(reply, "abort")
    outcome = str(reply["outcome"])
    if outcome != "no-turn":
        orch.root.publish(NODE_ABORTED, {"node_id": child.id, "name": child.id, "outcome": outcome, "by": caller.id})
    if outcome == "interrupted":  # the cut run's settle decides its status (outcome aborted → retired, §2.1)
        recorded = await _until_recorded(orch, child, settles, ABORT_SETTLE_S)
        return _abort_reply(orch, child, outcome, recorded=recorded)
    return _abort_reply(orch, child, outcome)


ABORT_SETTLE_S: Final = 10.0  # how long an abort's reply waits for the cut run's settle to be recorded


async def _until_recorded(orch: Orchestrator, child: AgentNode, settles: int, timeout: float) -> bool:
    """Until the settle after the first `settles` (the cut run's) is recorded, or the timeout; whether it was. Not
    until the child is idle: the results its own children left it are delivered at that run boundary and start a
    new run at once (docs/spec-conformance.md §6.7)."""
    deadline = time.monotonic() + timeout
    while child.work.settles <= settles or child.work.settling:
        if (left := deadline - time.monotonic()) <= 0:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(child.changed.wait(), left)
    return True


def _abort_reply(orch: Orchestrator, child: AgentNode, outcome: str, *, recorded: bool = False) -> Reply:
    """The abort's outcome and what the child is now, in its real status's words."""
    now = f"{child.status}, outcome {child.outcome}" if child.outcome and not child.live else child.status
    phase = orch.terminal_phase(child)
    if recorded and orch.running(child):  # its cut run ended; the results it was owed started the next at once
        after = (f"its cut turn is recorded (round {child.rounds}), and results of its own children that waited for "
                 f"that run boundary started a new turn: it is {now} again; `abort` again to cut that one")
    elif orch.running(child):
        after = (f"it is still {now}: its turn did not end within the limit; `stop` tears it down"
                 if outcome == "timeout" else f"it is {now} (its cut turn is still being recorded)")
    elif phase is not None:
        after = f"it is {now}, in terminal phase '{phase}': its result stands"
    else:
        after = f"it is {now}, its conversation kept: `continue` or `steer` gives it new input"
    what = {"no-turn": "no turn was in progress, nothing was done", "interrupted": "its turn was cut",
            "timeout": "the interrupt was sent"}.get(outcome, outcome)
    return _ok(f"abort → {child.id}: {outcome}; {what}; {after}", outcome=outcome, status=child.status)


@action("continue")
async def continue_(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    child = orch.child_of(caller, args.get("name"))
    orch.require_not_terminal(child)
    message = _message(args, "task")
    if child.live:
        raise ActionRefused(f"'{child.id}' is still {child.status}; steer it instead, or wait for it", SUBAGENT_NOT_STEERABLE)
    how = await orch.revive(child, message)
    return _ok(f"continue → {child.id}: {how}")


@action("resume")
async def resume(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    child = orch.child_of(caller, args.get("name"))
    orch.require_not_terminal(child)
    if orch.hosted(child) and child.live:
        return _ok(f"'{child.id}' is running already; nothing to resume")
    message = args.get("message") or args.get("task")
    how = await orch.revive(child, message if isinstance(message, str) else None)
    return _ok(f"Resumed {child.id} from {child.transcript.name} ({how})")


@action("retire")
async def retire(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    child = orch.child_of(caller, args.get("name"))
    done = await orch.retire_subtree(child, cause="retire", force=bool(args.get("force")))
    if not done:
        return _ok(f"'{child.id}' was retired already")
    return _ok(f"retired {', '.join(done)}", retired=done)


@action("stop")
async def stop(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    child = orch.child_of(caller, args.get("name"))
    force = bool(args.get("force"))
    done = await orch.retire_subtree(child, cause="stop" if not force else "force_stop", force=force)
    return _ok(f"stopped {', '.join(done) or child.id}{' (forced)' if force else ''}", stopped=done)


@action("status")
async def status(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    name = args.get("name")
    if isinstance(name, str) and name:
        node = orch.tree.get(name)
        if node is None:
            raise ActionRefused(f"no node named '{name}' in this run", UNKNOWN_CHILD)
        return _ok(_node_line(orch, node) + ("\n" + orch.result_block(node) if node.final_text else ""))
    return _ok("\n".join(_tree_lines(orch, None, depth=64)) or "(no nodes)")


@action("list")
async def list_(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    children = orch.tree.children(caller.id)
    rows = [{"name": c.id, "role": c.role, "status": c.status, "model": c.model, "outcome": c.outcome}
            for c in children]
    return _ok("\n".join(_node_line(orch, c) for c in children) or "(no children)", children=rows)


@action("wait")
async def wait(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    names = args.get("names") or ([args["name"]] if isinstance(args.get("name"), str) else None)
    if names:
        targets = [orch.child_of(caller, n) for n in names]
    else:
        targets = orch.tree.children(caller.id) if caller.id != OPERATOR else [n for n in orch.tree if n.parent is None]
        if not targets:
            return _ok("you have no children to wait for")
    timeout_ms = _timeout_ms(args)
    async with _mail_hold(orch, caller) as hold:  # mail (docs/spec-conformance.md §6.6): merged into this result
        pending = await _wait_settled(orch, targets, timeout_ms / 1000, hold)
        blocks, read = [], []
        for child in targets:
            if orch.busy(child):
                blocks.append(_node_line(orch, child))
            else:
                blocks.append(orch.result_block(child))
                read.append(child)
        await orch.consume(caller.id, read)
        if hold.mail:
            text = (f"{_mail_text(hold.mail)}\n\nYour children, {len(pending)} still running (wait again after "
                    "you answer):\n" + "\n".join(blocks))
            return {"ok": True, "text": text, "details": {"mail": [int(m["id"]) for m in hold.mail],
                                                         "pending": [c.id for c in pending]}}
    blocked = [c for c in pending if c.blocked_on is not None]
    if blocked and len(blocked) == len(pending):
        text = "\n\n".join([*(notice_text(c.id, c.blocked_on or {}) for c in blocked), "\n".join(blocks)])
        return {"ok": True, "text": text, "details": {"blocked": [c.id for c in blocked],
                                                     "pending": [c.id for c in pending]}}
    if pending:
        text = (f"wait timed out after {timeout_ms} ms with {len(pending)} child(ren) still running (not a "
                f"failure). Decide: extend | steer_again | stop | force_stop (subagent action 'extend' to wait "
                f"more, 'steer' to redirect, 'stop' or stop with force to end them).\n" + "\n".join(blocks))
        return {"ok": True, "text": text, "details": {"timedOut": True, "pending": [c.id for c in pending],
                                                     "decisions": list(DECISIONS)}}
    return _ok("\n".join(blocks), settled=[c.id for c in targets])


@action("extend")
async def extend(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    """A wait/collect timeout's decision (docs/spec-conformance.md §2.2): `extend` (the default) waits again;
    `steer_again` steers each named child with `message`, then waits; `stop`/`force_stop` stop them."""
    decision = args.get("decision") or "extend"
    if decision not in DECISIONS:
        raise ActionRefused(f"/decision: must be one of {', '.join(DECISIONS)}, got {decision!r}", INVALID_PARAMS)
    if decision == "extend":
        return await wait(orch, caller, args)
    names = args.get("names") or ([args["name"]] if isinstance(args.get("name"), str) else [])
    if not names:
        raise ActionRefused(f"/names: decision '{decision}' needs the child(ren) it acts on ('name' or 'names')",
                            INVALID_PARAMS)
    if decision in ("stop", "force_stop"):
        replies = [await stop(orch, caller, {"name": n, "force": decision == "force_stop"}) for n in names]
        return _ok("\n".join(str(r["text"]) for r in replies), decision=decision)
    message = _message(args)
    steered = [await ACTIONS["steer"](orch, caller, {"name": n, "message": message}) for n in names]
    waited = await wait(orch, caller, {**args, "names": names})
    return {**waited, "text": "\n".join([*(str(r["text"]) for r in steered), str(waited["text"])])}


@action("collect")
async def collect(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    child = orch.child_of(caller, args.get("name"))
    timeout_ms = _timeout_ms(args)
    async with _mail_hold(orch, caller) as hold:  # mail (docs/spec-conformance.md §6.6): merged into this result
        pending = await _wait_settled(orch, [child], timeout_ms / 1000, hold)
        if child.blocked_on is not None and pending:
            return _blocked_result(child, child.blocked_on)
        if hold.mail:
            return {"ok": True, "text": f"{_mail_text(hold.mail)}\n\n'{child.id}' is still {child.status}; collect "
                    f"again after you answer.\n{_node_line(orch, child)}",
                    "details": {"mail": [int(m["id"]) for m in hold.mail], "pending": [c.id for c in pending]}}
    if pending:
        return {"ok": True, "text": f"collect timed out: '{child.id}' is still {child.status} (not a failure). "
                f"Decide: extend | steer_again | stop | force_stop.\n{_node_line(orch, child)}",
                "details": {"timedOut": True, "decisions": list(DECISIONS)}}
    text = child.final_text.strip() or f"(no final output; outcome {child.outcome})"
    await orch.consume(caller.id, [child], whole=True)
    head = f"{child.id} ({child.role}, {child.model}): {child.status}, outcome {child.outcome}"
    from legion.orchestration.teams import collect_checks  # teams: acceptance commands, branch from git

    checks, extra = await collect_checks(orch, child)
    tail = "".join(f"\n{line}" for line in [*checks, *(f"⚠ {switch}" for switch in child.model_switches)])
    # the report ends with where the whole conversation is, so the caller (or the operator) can open it
    return _ok(f"{head}\n\n{text}{tail}\nComplete conversation: {child.transcript}", status=child.status,
               outcome=child.outcome, round=child.rounds, transcript=str(child.transcript), **extra)


def _blocked_result(child: AgentNode, request: dict[str, Any]) -> Reply:
    """A collect of a child whose run waits on a dialog: its state and how to answer; nothing is verified (there is
    no result yet; docs/spec-conformance.md §2.8)."""
    return {"ok": True, "text": f"{notice_text(child.id, request)}\nNo result yet: collect again once it has settled."
            f"\nComplete conversation: {child.transcript}",
            "details": {"status": "blocked", "blocked": True, "request": request, "transcript": str(child.transcript)}}


DIAGNOSE_SECTIONS: Final = ("tree", "models", "errors")


@action("diagnose")
async def diagnose(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    """The caller's subtree, one `section` of it (docs/spec-conformance.md §2.2): `tree` (the default: each node
    with its host process), `models` (each node's model and where it came from), `errors` (its failure events)."""
    section = args.get("section") or "tree"
    if section not in DIAGNOSE_SECTIONS:
        raise ActionRefused(f"/section: must be one of {', '.join(DIAGNOSE_SECTIONS)}, got {section!r} (the "
                            "machine's own checks are `legion doctor SECTION`, run by the operator)", INVALID_PARAMS)
    nodes = [caller, *orch.tree.subtree(caller.id)]
    lines = [f"run {orch.ctx.run_id} at {orch.ctx.run_dir} — {section}",
             f"heldOverCap {orch.held_over_cap}: completion notices held over "
             f"{orch.ctx.settings.legion.max_pending_age_ms / 1000:g} s while their parent ran (a health signal)"]
    if section == "models":
        lines += [f"{node.id} [{node.role}]: {node.model} ({node.model_origin}), backend {node.backend}"
                  for node in nodes]
    elif section == "errors":
        failures = sorted((e for node in nodes for e in orch.ctx.ledger.events_after(0, limit=10_000, node_id=node.id)
                           if e.type in (NODE_FAILED, NODE_ABANDONED, BUDGET_REFUSED)), key=lambda e: e.id)
        lines += [f"{e.node_id}: {e.type} {orjson.dumps(e.data).decode()[:300]}" for e in failures[-50:]]
        if not failures:
            lines.append("no failures in this subtree")
    else:
        for node in nodes:
            host = orch.root.host_of(node.id if node.backend == "rpc" else orch.pool)
            lines.append(f"{_node_line(orch, node)}; host {node.backend} pid {host.pid if host else None}")
    return _ok("\n".join(lines), section=section)


def _timeout_ms(args: dict[str, Any]) -> int:
    value = args.get("timeoutMs")
    return value if isinstance(value, int) and not isinstance(value, bool) else DEFAULT_WAIT_MS


def _message(args: dict[str, Any], *alternatives: str) -> str:
    for key in ("message", *alternatives):
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return value
    raise ActionRefused("/message: a non-empty 'message' is required", INVALID_PARAMS)


def _check(reply: dict[str, Any], what: str) -> None:
    if not reply.get("ok"):
        raise ActionRefused(f"{what} failed: {reply.get('error')}", str(reply.get("code") or INTERNAL))


async def _wait_settled(orch: Orchestrator, targets: list[AgentNode], timeout: float,
                        hold: _MailHold | None = None) -> list[AgentNode]:
    """Wait until every target has settled and its result is recorded (or is blocked on a dialog), the timeout, or
    (with a hold) mail for the waiting parent; the targets still busy."""
    deadline = time.monotonic() + timeout
    # one waiter per live target, kept across wake-ups: a wake replaces only the waiters that fired (a lead
    # waiting on n workers would otherwise make n new ones at each of their n settles)
    waiting: dict[str, asyncio.Future[Any]] = {}
    arrival: asyncio.Future[Any] | None = None
    try:
        while True:
            live = [t for t in targets if orch.busy(t)]
            if live and all(t.blocked_on is not None for t in live):
                return live  # each waits on an answer only the caller can give: waiting longer cannot help
            left = deadline - time.monotonic()
            if hold is not None and (not live or left <= 0 or await hold.poll()):
                return live  # mail that came by the very end goes into the result too
            if not live or left <= 0:
                return live
            for n in live:
                if n.id not in waiting:
                    waiting[n.id] = asyncio.ensure_future(n.changed.wait())
            if hold is not None and arrival is None:
                arrival = asyncio.ensure_future(hold.arrival(MAIL_POLL_S))
            waits = {*waiting.values(), *([arrival] if arrival is not None else [])}
            done, _ = await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            for key in [k for k, w in waiting.items() if w in done]:
                del waiting[key]
            if arrival in done:
                arrival = None
    finally:
        for w in [*waiting.values(), *([arrival] if arrival is not None else [])]:
            w.cancel()


# ----- wait/collect mail preemption (docs/spec-conformance.md §6.6; the postman's hold and leases) -----------------------

MAIL_POLL_S = 0.25


class _MailHold:
    """While a parent is blocked: its mail is claimed (≤ 100) for the tool result; requeued if discarded."""

    def __init__(self, orch: Orchestrator, caller: AgentNode) -> None:
        self.postman = orch.mail if caller.id != OPERATOR else None
        self.node_id = caller.id
        self.mail: list[dict[str, Any]] = []
        self.hold: Any = None

    async def poll(self) -> bool:
        if self.postman is None or self.mail:
            return bool(self.mail)
        if self.hold is not None and self.hold.reclaim:
            self.hold.reclaim = False
            self.mail = await self.postman.withdraw(self.node_id)
        self.mail += await self.postman.take(self.node_id)
        return bool(self.mail)

    async def arrival(self, seconds: float) -> None:
        if self.hold is None:
            await asyncio.Event().wait()  # no mailbox: never
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.hold.arrived.wait(), seconds)
        self.hold.arrived.clear()


@contextlib.asynccontextmanager
async def _mail_hold(orch: Orchestrator, caller: AgentNode) -> AsyncIterator[_MailHold]:
    state = _MailHold(orch, caller)
    if state.postman is None:
        yield state
        return
    with state.postman.hold(caller.id) as hold:  # released on every exit path
        state.hold = hold
        try:
            yield state
        except BaseException:  # cancelled or failed: the result carrying the mail is discarded
            await asyncio.shield(state.postman.redeliver(state.mail))
            raise


def _mail_text(mail: list[dict[str, Any]]) -> str:
    from legion.orchestration.postman import format_mail

    head = f"✉ {len(mail)} mail(s) arrived while you were waiting (answer with legion_mail or subagent steer):"
    return "\n\n".join([head, *(format_mail(m) for m in mail)])


def _node_line(orch: Orchestrator, node: AgentNode) -> str:
    usage = orch.ctx.ledger.get_usage(node.id) or {}
    tokens = int(usage.get("tokens_in") or 0) + int(usage.get("tokens_out") or 0)
    cost = float(usage.get("cost_usd") or 0.0)
    extra = f", outcome {node.outcome}" if node.outcome and not node.live else ""
    if node.blocked_on is not None:
        extra = f" on {describe(node.blocked_on)}"
    return (f"{'  ' * node.depth}{node.id} [{node.role}] {node.status}{extra} · {node.model} · "
            f"{tokens} tok · ${cost:.4f}")


def _tree_lines(orch: Orchestrator, root: str | None, depth: int) -> list[str]:
    lines: list[str] = []
    for node in orch.tree:
        if node.parent == root and depth > 0:
            lines.append(_node_line(orch, node))
            lines.extend(_tree_lines(orch, node.id, depth - 1))
    return lines


# ----- other legion tools -----------------------------------------------------------------------

@tool("vexillatio")
async def vexillatio(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    tasks = args.get("tasks") or []
    for i, task in enumerate(tasks):
        if "name" in task:
            raise ActionRefused(f"tasks[] step {i} cannot include `name`; vexillatio allocates one handle per step "
                              "itself.", INVALID_PARAMS)
    agent = args.get("agent") or "scout"
    steps = [LaunchRequest(agent=agent, task=t["task"], model=t.get("model"), preset=t.get("preset"),
                           utility_only=True) for t in tasks]
    lines, names = [], []
    for step in steps:  # one at a time: each takes the next free `<role>-N`
        node, status = await orch.launch(caller, step)
        names.append(node.id)
        lines.append(_launch_line(node, status))
    return _ok("\n".join(lines) + "\nManage them with subagent (wait, collect, status).", launched=names)


@tool("legion_tree")
async def legion_tree(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    scope = args.get("scope", "children")
    depth = args["depth"] if isinstance(args.get("depth"), int) else 64
    if scope == "children":
        nodes = orch.tree.children(caller.id)
    elif scope == "squad":
        nodes = [n for n in orch.tree if n.parent == caller.parent and n.id != caller.id] if caller.parent else []
    elif scope == "subtree":
        nodes = [n for n in orch.tree.subtree(caller.id) if n.depth - caller.depth <= depth]
    elif scope == "tree":
        nodes = [n for n in orch.tree if n.depth <= depth]
    else:
        raise ActionRefused(f"/scope: one of children, squad, subtree, tree; got {scope!r}", INVALID_PARAMS)
    rows = [{"name": n.id, "parent": n.parent, "role": n.role, "status": n.status, "depth": n.depth} for n in nodes]
    return _ok("\n".join(_node_line(orch, n) for n in nodes) or "(none)", nodes=rows)
