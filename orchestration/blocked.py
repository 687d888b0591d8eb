"""Blocked children: a run waiting on an extension's dialog, the card's `onBlocked` policy, and the answer.

docs/spec-conformance.md §2.1 (blocked). A `kind: pi` child's extension may ask a dialog (pi's extension UI:
`confirm`, `select`, `input`, `editor`) that only the host can answer. The worker reports it as a `ui_request`
session event (`phase` open | answered | expired). On `open`, with the card's `onBlocked: ask` (the default), the
node becomes `blocked` with `node_blocked {request, policy}` and its parent gets an `action-needed` notice; the
parent answers with `subagent steer` (the message is the answer, `answer_for` below). With `onBlocked: reject`
the dialog is cancelled at once (pi's `cancelled: true`; a confirm reads it as "no"), `node_blocked` records it
and the node stays `running`. An answer, or pi resolving the dialog itself (its timeout, the run's end), sets the
node `running` again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from loguru import logger

from legion.codes import INTERNAL
from legion.ledger.ledger import Ledger
from legion.orchestration.postman import system_send
from legion.orchestration.refusals import INVALID_PARAMS, ActionRefused

if TYPE_CHECKING:
    from legion.orchestration.agent_tree import AgentNode
    from legion.orchestration.orchestrator import Orchestrator

APPROVE_WORDS: Final = ("approve", "approved", "yes", "y", "allow", "ok", "confirm", "true")
REJECT_WORDS: Final = ("reject", "rejected", "no", "n", "deny", "cancel", "false")
_REQUEST_KEYS: Final = ("requestId", "method", "title", "message", "options", "placeholder", "prefill", "timeout")


def on_ui_event(orch: Orchestrator, node: AgentNode, body: dict[str, Any]) -> None:
    """A `ui_request` session event of `node` (quick, never raising)."""
    phase = body.get("phase")
    request: dict[str, Any] = {k: body[k] for k in _REQUEST_KEYS if k in body}
    if not isinstance(request.get("requestId"), str):
        return
    if phase == "open":
        _opened(orch, node, request)
    elif phase in ("answered", "expired") and node.blocked_on is not None \
            and node.blocked_on.get("requestId") == request["requestId"]:
        node.blocked_on = None
        orch.root.mark_unblocked(node.id, requestId=request["requestId"], how=str(phase))


def _opened(orch: Orchestrator, node: AgentNode, request: dict[str, Any]) -> None:
    card = orch.ctx.catalog.cards.get(node.role)
    policy = card.on_blocked if card is not None else "ask"
    if policy == "reject":
        orch.root.mark_blocked(node.id, waiting=False, request=request, policy=policy, answer="rejected")
        orch.spawn(_respond(orch, node, str(request["requestId"]), {"cancelled": True}), f"ui-reject:{node.id}")
        return
    node.blocked_on = request
    orch.root.mark_blocked(node.id, waiting=True, request=request, policy=policy)
    if node.parent is not None and node.parent in orch.tree:
        orch.spawn(_notify(orch, node.id, node.parent, request), f"blocked-notice:{node.id}")


async def _respond(orch: Orchestrator, node: AgentNode, request_id: str, response: dict[str, Any]) -> None:
    reply = await orch.root.session_request(node.id, "session.ui_respond", requestId=request_id, response=response)
    if not reply.get("ok"):
        logger.warning("{}: answering its dialog {} failed: {}", node.id, request_id, reply.get("error"))


async def _notify(orch: Orchestrator, child: str, parent: str, request: dict[str, Any]) -> None:
    subject, text = f"{child} is blocked: {describe(request)}"[:200], notice_text(child, request)

    def write(led: Ledger) -> None:
        system_send(led, child, parent, subject, text, kind="notice", urgency="action-needed")

    try:
        await orch.ctx.write(write)
    except Exception as exc:  # the node_blocked event and `status` still show it
        logger.warning("blocked notice of {} not sent: {!r}", child, exc)
        return
    if orch.mail is not None:
        orch.mail.wake(parent)


def describe(request: dict[str, Any]) -> str:
    """One line: the dialog's kind and its question."""
    method = request.get("method")
    words = " — ".join(str(request[k]) for k in ("title", "message") if request.get(k))
    return f"{method} \"{words}\"" if words else str(method)


def how_to_answer(child: str, request: dict[str, Any]) -> str:
    method = request.get("method")
    if method == "confirm":
        what = "message 'approve' or 'reject'"
    elif method == "select":
        options = ", ".join(f"'{o}'" for o in request.get("options") or [])
        what = f"message one of {options}, or 'reject'"
    else:
        what = "message the text to enter, or 'reject' to cancel"
    return f"answer with subagent steer (name '{child}', {what})"


def notice_text(child: str, request: dict[str, Any]) -> str:
    lines = [f"'{child}' is blocked: one of its extensions asks a {request.get('method')} and its run waits for "
             "the answer."]
    for key in ("title", "message", "placeholder"):
        if request.get(key):
            lines.append(f"{key.capitalize()}: {request[key]}")
    if request.get("options"):
        lines.append("Options: " + ", ".join(str(o) for o in request["options"]))
    lines.append(f"To unblock it, {how_to_answer(child, request)}.")
    return "\n".join(lines)


def answer_for(child: str, request: dict[str, Any], message: str) -> tuple[dict[str, Any], str]:
    """pi's `extension_ui_response` fields for a steer message that answers `request`, and a word for the reply;
    refuses a message that does not answer it."""
    word = message.strip()
    low = word.lower()
    method = request.get("method")
    if low in REJECT_WORDS:
        return ({"confirmed": False} if method == "confirm" else {"cancelled": True}), "rejected"
    if method == "confirm":
        if low in APPROVE_WORDS:
            return {"confirmed": True}, "approved"
    elif method == "select":
        options = [str(o) for o in request.get("options") or []]
        chosen = next((o for o in options if o == word), None) or next((o for o in options if o.lower() == low), None)
        if chosen is not None:
            return {"value": chosen}, f"chose '{chosen}'"
    else:
        return {"value": message}, "answered"
    raise ActionRefused(f"/message: '{child}' is blocked on {describe(request)}; {message!r} does not answer it — "
                        f"{how_to_answer(child, request)}", INVALID_PARAMS, state="blocked", request=request)


async def answer(orch: Orchestrator, child: AgentNode, message: str) -> str:
    """Answer the dialog `child` is blocked on with a steer's message; the reply's disposition."""
    request = child.blocked_on
    assert request is not None
    response, how = answer_for(child.id, request, message)
    reply = await orch.root.session_request(child.id, "session.ui_respond", requestId=request["requestId"],
                                            response=response)
    if not reply.get("ok"):
        raise ActionRefused(f"answering the dialog of '{child.id}' failed: {reply.get('error')}",
                            str(reply.get("code") or INTERNAL))
    if not reply.get("answered"):
        return "not needed (the dialog had already ended: its own timeout, or the run ended)"
    return how
