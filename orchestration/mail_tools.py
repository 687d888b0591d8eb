"""`legion_mail`: routing along tree edges, the ledger's limits, then the postman.

docs/spec-conformance.md §6.1, docs/architecture.md §9.6.

Targets: `parent`, `children`, `squad` (the caller's siblings), or one sibling or child by name or node id.
Anything else is refused with a routing hint naming who the caller can reach (there is no skip-level
channel). The send is one writer-thread transaction per recipient (limits and the rate are the ledger's);
the postman is woken for the recipients at once. The operator sends through the `mail` operator action.
"""

from __future__ import annotations

from typing import Any

from legion.codes import MAIL_INVALID_FIELD, MAIL_INVALID_TEXT, MAIL_RATE_LIMITED, MAIL_TOO_LARGE
from legion.ledger.errors import MailRefusedError
from legion.ledger.ledger import Ledger
from legion.ledger.mail import MailSent
from legion.orchestration.agent_tree import AgentNode
from legion.orchestration.commands import Reply, action, tool
from legion.orchestration.orchestrator import OPERATOR, Orchestrator, did_you_mean
from legion.orchestration.postman import OPERATOR_SENDER
from legion.orchestration.refusals import (
    INVALID_PARAMS,
    MAIL_CROSS_SUBTREE,
    MAIL_NO_RECIPIENT,
    MAIL_UNKNOWN_TARGET,
    ActionRefused,
)

FIXES = {
    MAIL_TOO_LARGE: "shorten it, or write the content to a file and mail the path",
    MAIL_INVALID_TEXT: "remove the NUL character(s) (U+0000) and send again",
    MAIL_RATE_LIMITED: "wait a few minutes, or put everything into one mail",
    MAIL_INVALID_FIELD: "kind is one of question, report, handoff, notice; urgency is info or action-needed",
}


def reachable(orch: Orchestrator, caller: AgentNode) -> list[AgentNode]:
    """Everyone `caller` may mail: its parent, its children and its siblings."""
    tree = orch.tree
    out = [tree.get(caller.parent)] if caller.parent else []
    out += tree.children(caller.id)
    if caller.parent:
        out += [n for n in tree.children(caller.parent) if n.id != caller.id]
    return [n for n in out if n is not None]


def resolve(orch: Orchestrator, caller: AgentNode, to: Any) -> list[AgentNode]:
    """The recipients of `to` for `caller`, or a ActionRefused with a routing hint."""
    if not isinstance(to, str) or not to.strip():
        raise ActionRefused("/to: a recipient is required: parent, children, squad, or a sibling's or child's name",
                          INVALID_PARAMS)
    to = to.strip()
    if caller.id == OPERATOR:  # the operator may mail any node of its run
        node = orch.tree.get(to) if to != "root" or orch.root_id is None else orch.tree.get(orch.root_id)
        if node is None:
            raise ActionRefused(f"no node '{to}' in this run{did_you_mean(to, [n.id for n in orch.tree])}",
                              MAIL_UNKNOWN_TARGET)
        return [node]
    if to == "parent":
        parent = orch.tree.get(caller.parent) if caller.parent else None
        if parent is None:
            raise ActionRefused("you are the root session and have no parent; the operator reads your final answer",
                              MAIL_NO_RECIPIENT)
        return [parent]
    if to == "children":
        kids = orch.tree.children(caller.id)
        if not kids:
            raise ActionRefused(f"you have no children to mail{_hint(orch, caller)}", MAIL_NO_RECIPIENT)
        return kids
    if to == "squad":
        squad = [n for n in orch.tree.children(caller.parent) if n.id != caller.id] if caller.parent else []
        if not squad:
            raise ActionRefused(f"you have no siblings (squad) to mail{_hint(orch, caller)}", MAIL_NO_RECIPIENT)
        return squad
    node = orch.tree.get(to)
    names = [n.id for n in reachable(orch, caller)]
    if node is None:
        other = orch.ctx.ledger.get_node(to) is not None
        where = " (a node of another run, or not a node of this one)" if not other else ""
        raise ActionRefused(f"no node '{to}' in this run{where}{did_you_mean(to, names)}{_hint(orch, caller)}",
                          MAIL_UNKNOWN_TARGET)
    if node.id == caller.id:
        raise ActionRefused(f"'{to}' is yourself{_hint(orch, caller)}", MAIL_UNKNOWN_TARGET)
    if node.id not in names:
        raise ActionRefused(f"'{to}' is outside your reach (mail goes along tree edges only; there is no skip-level "
                          f"channel){_hint(orch, caller)}; ask your parent to pass it on", MAIL_CROSS_SUBTREE)
    return [node]


def _hint(orch: Orchestrator, caller: AgentNode) -> str:
    parent = caller.parent or "(none: you are the root)"
    kids = ", ".join(n.id for n in orch.tree.children(caller.id)) or "(none)"
    sibs = ", ".join(n.id for n in orch.tree.children(caller.parent) if n.id != caller.id) if caller.parent else ""
    return f". You can reach: parent {parent}; children {kids}; squad {sibs or '(none)'}"


def _field(args: dict[str, Any], key: str, default: str | None = None) -> Any:
    value = args.get(key, default)
    return default if value is None else value


async def send(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    """Route, store (one transaction per recipient) and wake the postman."""
    recipients = resolve(orch, caller, args.get("to"))
    subject, body = _field(args, "subject", ""), _field(args, "body", "")
    if not isinstance(subject, str) or not subject.strip():
        raise ActionRefused("/subject: a non-empty subject is required (≤ 256 bytes)", INVALID_PARAMS)
    if not isinstance(body, str):
        raise ActionRefused("/body: the body must be a string", INVALID_PARAMS)
    kind, urgency = args.get("kind"), _field(args, "urgency", "info")
    sender = OPERATOR_SENDER if caller.id == OPERATOR else caller.id
    rate = orch.ctx.settings.legion.mail_rate_per_5min
    sent: list[tuple[str, MailSent]] = []
    refusal: MailRefusedError | None = None
    for node in recipients:
        to = node.id

        def write(led: Ledger, to: str = to) -> MailSent:
            led._mail_rate_per_5_min = rate  # the run's `mailRatePer5Min` (the ledger enforces it)
            if sender == OPERATOR_SENDER and led.get_node(OPERATOR_SENDER) is None:
                led.insert_node(id=OPERATOR_SENDER, name="operator", role="operator", depth=0, status="retired")
            return led.send_mail(sender, to, subject, body, kind=kind, urgency=urgency)

        try:
            sent.append((to, await orch.ctx.write(write)))
        except MailRefusedError as exc:
            refusal = exc
            break
    postman = orch.mail
    if postman is not None and sent:
        postman.wake(*(to for to, _ in sent))
    if refusal is not None and not sent:
        raise ActionRefused(f"{refusal}. Fix: {FIXES.get(refusal.code, 'correct the field and send again')}",
                          refusal.code)
    lines = [f"✉ #{m.id} → {to} (queued; delivery is asynchronous, do not wait for a reply)" for to, m in sent]
    warnings = sorted({w for _, m in sent for w in m.warnings})
    lines += [f"⚠ {w}" for w in warnings]
    if refusal is not None:
        missed = [n.id for n in recipients[len(sent):]]
        lines.append(f"✗ not sent to {', '.join(missed)}: {refusal}. Fix: {FIXES.get(refusal.code, '')}")
    reply: Reply = {"ok": refusal is None, "text": "\n".join(lines),
                    "details": {"sent": [{"id": m.id, "to": to} for to, m in sent], "warnings": warnings or None}}
    if refusal is not None:
        reply["code"] = refusal.code
    return reply


@tool("legion_mail")
async def legion_mail(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    return await send(orch, caller, args)


@action("mail")
async def operator_mail(orch: Orchestrator, caller: AgentNode, args: dict[str, Any]) -> Reply:
    """The operator's `legion mail send RUN TO`: the same path, as the operator, to any node of the run."""
    if caller.id != OPERATOR:
        raise ActionRefused("'mail' is an operator action; agents send mail with the legion_mail tool",
                          INVALID_PARAMS)
    return await send(orch, caller, args)
