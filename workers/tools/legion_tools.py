"""The legion tools: ``subagent`` (13 actions), ``vexillatio``, ``legion_mail``, ``legion_tree``, ``legion_phase``.

Here they have their schemas (``subagent``'s is generated from the action specs, ``action_specs.py``) and a
request path: ``execute`` forwards the validated call to the session's ``LegionRequester`` (wired by the
worker to a control-channel request to the root supervisor) and shows its answer. Their behaviour lives in the orchestration layer. Without a
requester the tool returns a clear error.
"""

from __future__ import annotations

from typing import Any, Final

from legion.workers.tools.action_specs import NAME_FIELD, SUBAGENT_ACTIONS, subagent_schema
from legion.workers.tools.base import ToolContext, ToolResult
from legion.workers.tools.schema import Schema

MAX_REPLY_CHARS = 50_000
# generated from the action specs (workers/tools/action_specs.py): a new action is one ActionSpec there
SUBAGENT_SCHEMA: Schema = subagent_schema()

VEXILLATIO_SCHEMA: Schema = {"type": "object", "additionalProperties": False, "required": ["tasks"], "properties": {
    "agent": {"type": "string"},
    "tasks": {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["task"], "properties": {
        "task": {"type": "string", "minLength": 1}, "model": {"type": "string"}, "preset": {"type": "string"},
        "name": NAME_FIELD}}}}}  # `name` is accepted by the schema so the root can give the exact docs/spec-conformance.md §2.6 refusal

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


__all__ = ["LEGION_TOOLS", "MAIL_SCHEMA", "MAX_REPLY_CHARS", "PHASE_SCHEMA", "SUBAGENT_ACTIONS", "SUBAGENT_SCHEMA",
           "TREE_SCHEMA", "VEXILLATIO_SCHEMA", "LegionTool", "legion_tools"]


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


LEGION_TOOLS: Final = tuple(legion_tools())  # every legion tool's name; each has one handler in orchestration
