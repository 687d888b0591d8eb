"""The legion tools: ``subagent`` (13 actions), ``vexillatio``, ``legion_mail``, ``legion_tree``, ``legion_phase``.

Here they have their schemas and a request path: ``execute`` forwards the validated call to the
session's ``LegionRequester`` (wired by the worker to a control-channel request to the root
supervisor) and shows its answer. Their behaviour lives in the orchestration layer. Without a
requester the tool returns a clear error.
"""

from __future__ import annotations

from typing import Any

from legion.workers.tools.base import ToolContext, ToolResult
from legion.workers.tools.schema import Schema

MAX_REPLY_CHARS = 50_000
SUBAGENT_ACTIONS = ("launch", "continue", "steer", "abort", "resume", "retire", "status", "collect", "list", "wait",
                    "stop", "diagnose", "extend")
_NAME = {"type": "string", "minLength": 1, "maxLength": 64}
_TASK_ITEM: Schema = {"type": "object", "additionalProperties": False, "required": ["task"], "properties": {
    "task": {"type": "string", "minLength": 1}, "agent": {"type": "string"}, "name": _NAME,
    "model": {"type": "string"}, "preset": {"type": "string"}}}

SUBAGENT_SCHEMA: Schema = {"type": "object", "additionalProperties": False, "required": ["action"], "properties": {
    "action": {"type": "string", "enum": list(SUBAGENT_ACTIONS)},
    "agent": {"type": "string"}, "task": {"type": "string"}, "name": _NAME,
    "names": {"type": "array", "items": _NAME}, "model": {"type": "string"}, "preset": {"type": "string"},
    "team": {"type": "string"}, "worktree": {"type": "boolean"},
    "phases": {"type": ["array", "object", "string"]}, "start": {"type": "string"},
    "tasks": {"type": "array", "items": _TASK_ITEM, "minItems": 1},
    "message": {"type": "string"}, "force": {"type": "boolean"}, "clearQueued": {"type": "boolean"},
    "timeoutMs": {"type": "integer", "minimum": 0}, "section": {"type": "string"},
    "decision": {"type": "string", "enum": ["extend", "steer_again", "stop", "force_stop"]}}}

VEXILLATIO_SCHEMA: Schema = {"type": "object", "additionalProperties": False, "required": ["tasks"], "properties": {
    "agent": {"type": "string"},
    "tasks": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["task"], "properties": {
        "task": {"type": "string", "minLength": 1}, "model": {"type": "string"}, "preset": {"type": "string"},
        "name": _NAME}}}}}  # `name` is accepted by the schema so the root can give the exact docs/spec-conformance.md §2.6 refusal

MAIL_SCHEMA: Schema = {"type": "object", "additionalProperties": False, "required": ["to", "subject", "body"],
                       "properties": {
    "to": {"type": "string", "minLength": 1}, "subject": {"type": "string", "minLength": 1},
    "body": {"type": "string"}, "kind": {"type": "string", "enum": ["question", "report", "handoff", "notice"]},
    "urgency": {"type": "string", "enum": ["info", "action-needed"]}}}

TREE_SCHEMA: Schema = {"type": "object", "additionalProperties": False, "properties": {
    "scope": {"type": "string", "enum": ["children", "squad", "subtree", "tree"]},
    "depth": {"type": "integer", "minimum": 1, "maximum": 64}}}

PHASE_SCHEMA: Schema = {"type": "object", "additionalProperties": False, "required": ["to"], "properties": {
    "to": {"type": "string", "minLength": 1}, "note": {"type": "string"}, "evidence": {"type": "string"},
    "reason": {"type": "string"}, "supersedes": {"type": "string"}}}


class LegionTool:
    """A tool whose behaviour is a request to the root supervisor."""

    def __init__(self, name: str, description: str, parameters: Schema) -> None:
        self.name = name
        self.description = description
        self.parameters = parameters

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if ctx.requester is None:
            return ToolResult(f"{self.name} is unavailable in this session: it has no connection to the root "
                              "supervisor (started without a LegionRequester)", True)
        reply = await ctx.requester(self.name, args, ctx.session)
        ok = bool(reply.get("ok", False))
        text = reply.get("text")
        if not isinstance(text, str):
            error = reply.get("error")
            text = "ok" if ok else f"{self.name} failed: {error}" if isinstance(error, str) else \
                f"{self.name} failed without a message"
        if len(text) > MAX_REPLY_CHARS:
            text = text[:MAX_REPLY_CHARS] + f"\n[reply truncated: {len(text)} characters; ask for less]"
        details = reply.get("details")
        return ToolResult(text, not ok, details if isinstance(details, dict) else None)


def legion_tools() -> dict[str, LegionTool]:
    return {t.name: t for t in (
        LegionTool("subagent", "Manage child agents: " + ", ".join(SUBAGENT_ACTIONS) + ". Steer is queue-only; "
                   "abort interrupts the current turn; stop/retire tear a child down.", SUBAGENT_SCHEMA),
        LegionTool("vexillatio", "Launch utility agents (default scout), one per task; manage them with subagent.",
                   VEXILLATIO_SCHEMA),
        LegionTool("legion_mail", "Send asynchronous mail to parent, children, squad, or a sibling/child by name. "
                   "Sending never waits for an answer.", MAIL_SCHEMA),
        LegionTool("legion_tree", "Read-only summary of the legion tree around you.", TREE_SCHEMA),
        LegionTool("legion_phase", "Request a phase transition for your team (centurion only).", PHASE_SCHEMA),
    )}
