"""Every legion action, defined once as data (docs/architecture.md §7, "Actions").

An action is one `ActionSpec`: its name, the `subagent` tool fields it reads, whether the operator socket
serves it (and in which lane), and the arguments of its `legion NAME RUN …` subcommand. Generated from this
table: the `subagent` tool's JSON schema the model sees (`legion_tools.SUBAGENT_SCHEMA`), the operator
socket's action list and lanes (`OPERATOR_ACTIONS`, `OPERATOR_RESERVED`, `OPERATOR_CANCELLABLE`), and the
operator subcommands (`legion/cli/operate.py`). The handler of each action is registered against its name in
the orchestration layer (`orchestration/commands.py` `@action(name)`), which refuses a handler without a
spec and a spec without a handler.

The table lives here, below the orchestration layer, because a session in a worker builds the model-visible
schema and must not import the orchestration (tests/unit/meta/test_layering.py). Pure data: importing it
costs the `legion` command line nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import EllipsisType
from typing import Any, Final, Literal

from legion.workers.tools.schema import Schema

NAME_FIELD: Final[Schema] = {"type": "string", "minLength": 1, "maxLength": 64}
TASK_ITEM: Final[Schema] = {"type": "object", "additionalProperties": False, "required": ["task"], "properties": {
    "task": {"type": "string", "minLength": 1}, "agent": {"type": "string"}, "name": NAME_FIELD,
    "model": {"type": "string"}, "preset": {"type": "string"}, "cwd": {"type": "string", "minLength": 1}}}
DECISIONS: Final = ("extend", "steer_again", "stop", "force_stop")  # a wait/collect timeout's choices

# Every field of the `subagent` tool, each schema once, in the order the tool's schema lists them.
FIELDS: Final[Mapping[str, Schema]] = {
    "agent": {"type": "string"}, "task": {"type": "string"}, "name": NAME_FIELD,
    "names": {"type": "array", "items": NAME_FIELD}, "model": {"type": "string"}, "preset": {"type": "string"},
    "team": {"type": "string"}, "worktree": {"type": "boolean"},
    "phases": {"type": ["array", "object", "string"]}, "start": {"type": "string"},
    "cwd": {"type": "string", "minLength": 1},
    "tasks": {"type": "array", "items": TASK_ITEM, "minItems": 1},
    "message": {"type": "string"}, "force": {"type": "boolean"}, "clearQueued": {"type": "boolean"},
    "timeoutMs": {"type": "integer", "minimum": 0}, "section": {"type": "string"},
    "decision": {"type": "string", "enum": list(DECISIONS)}}


@dataclass(frozen=True)
class Arg:
    """One argument of an operator subcommand: argparse's flags and keywords, and the action field it fills.

    `field` None: the command itself uses it (`stop --all`). `convert`: "text" reads `@FILE` as strict UTF-8,
    "ms" turns seconds into the integer milliseconds of `timeoutMs`."""

    flags: tuple[str, ...]
    field: str | None
    convert: Literal["text", "ms"] | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def dest(self) -> str:
        """The argparse destination (`--timeout` → `timeout`)."""
        return str(self.options.get("dest") or self.flags[-1].lstrip("-").replace("-", "_"))


def arg(*flags: str, to: str | EllipsisType | None = ..., convert: Literal["text", "ms"] | None = None,
        **options: Any) -> Arg:
    """An `Arg` filling the field `to` (default: the field named like its argparse destination)."""
    dest = Arg(flags, None, convert, options).dest
    return Arg(flags, dest if isinstance(to, EllipsisType) else to, convert, options)


@dataclass(frozen=True)
class ActionSpec:
    """One action: what the model may send for it, and how the operator reaches it."""

    name: str
    help: str  # one line: the operator subcommand's help
    fields: tuple[str, ...] = ()  # the `subagent` fields it reads (their schemas are in FIELDS)
    subagent: bool = True  # an action of the `subagent` tool
    operator: bool = True  # served on the operator socket (`legion.operator`)
    reserved: bool = False  # operator lane: answered beyond the in-flight caps (stopping a run always works)
    cancellable: bool = False  # operator lane: read-only, cancelled when its client disconnects
    cli: tuple[Arg, ...] | None = None  # `legion NAME RUN …` (after RUN and --json); None: no subcommand


_NAME_ARG = arg("name")
_FORCE_ARG = arg("--force", action="store_true", help="skip the graceful stage of the retire ladder")

ACTION_SPECS: Final[Mapping[str, ActionSpec]] = {s.name: s for s in (
    ActionSpec("launch", "launch an agent into a live run (under the root session unless --parent)",
               ("agent", "task", "name", "model", "preset", "team", "worktree", "phases", "start", "cwd", "tasks"),
               cli=(arg("--agent", required=True, help="the role card"),
                    arg("--task", required=True, convert="text", help="the task text (@FILE reads a file)"),
                    arg("--name", help="the node name (default: <role>-N)"),
                    arg("--model", help="provider/model-id[:thinking]"),
                    arg("--parent", help="the node to launch under (default: the root session)"),
                    arg("--workdir", to="cwd", metavar="DIR",
                        help="the child's working directory: an absolute path, exactly the parent's cwd or one of "
                             "the settings' externalDirectories (default: the parent's cwd)"))),
    ActionSpec("continue", "give a settled node (not in a terminal phase) new input", ("name", "message", "task")),
    ActionSpec("steer", "queue a message for a running node (an idle one starts a turn with it; for a blocked one "
               "the message answers the dialog it waits on: approve, reject, an option or the text)", ("name", "message"),
               cli=(_NAME_ARG, arg("message"))),
    ActionSpec("abort", "interrupt a node's current turn (it stays alive)", ("name", "clearQueued", "timeoutMs"),
               reserved=True, cli=(_NAME_ARG,)),
    ActionSpec("resume", "revive a node that is not running from its transcript", ("name", "message", "task")),
    ActionSpec("retire", "retire a node and its subtree", ("name", "force"), cli=(_NAME_ARG, _FORCE_ARG)),
    ActionSpec("status", "the tree's status as text", ("name",), reserved=True, cancellable=True),
    ActionSpec("collect", "a settled node's full result", ("name", "timeoutMs"),
               cli=(_NAME_ARG, arg("--timeout", to="timeoutMs", convert="ms", type=float, default=300.0,
                                   help="seconds to wait for it to settle (default 300)"))),
    ActionSpec("list", "the caller's direct children", cancellable=True),
    ActionSpec("wait", "wait until the named nodes (default: the root session) settle", ("names", "name", "timeoutMs"),
               cancellable=True,
               cli=(arg("names", nargs="*"),
                    arg("--timeout", to="timeoutMs", convert="ms", type=float, default=300.0,
                        help="seconds (default 300)"))),
    ActionSpec("stop", "stop a node and its subtree; --all (or no NAME) pauses the whole run (resumable)",
               ("name", "force"), reserved=True,
               cli=(arg("name", nargs="?", help="the node (default with --all: the whole run)"),
                    arg("--all", to=None, action="store_true",
                        help="pause the run: every node retired (session-shutdown), phases untouched; "
                             "`legion resume` continues it"),
                    _FORCE_ARG,
                    arg("--timeout", to=None, type=float, default=60.0,
                        help="seconds to wait for a paused run to end (default 60)"))),
    ActionSpec("diagnose", "the caller's subtree: section tree (each node's host process, the default), models or "
               "errors", ("section",), operator=False),
    ActionSpec("extend", "a wait/collect timeout's decision: extend (wait more, the default), steer_again (steer "
               "with message, then wait), stop or force_stop", ("names", "name", "timeoutMs", "decision", "message"),
               operator=False),
    # operator-only: `legion mail send RUN TO` (legion/cli/mail.py) and `legion stop RUN --all`
    ActionSpec("mail", "send mail as the operator", subagent=False),
    ActionSpec("pause", "pause the whole run (resumable)", ("force",), subagent=False, reserved=True),
)}

SUBAGENT_ACTIONS: Final = tuple(s.name for s in ACTION_SPECS.values() if s.subagent)
OPERATOR_ACTIONS: Final = tuple(s.name for s in ACTION_SPECS.values() if s.operator)
OPERATOR_RESERVED: Final = tuple(s.name for s in ACTION_SPECS.values() if s.operator and s.reserved)
OPERATOR_CANCELLABLE: Final = frozenset(s.name for s in ACTION_SPECS.values() if s.operator and s.cancellable)


def subagent_schema() -> Schema:
    """The `subagent` tool's parameters: `action` and every field some action reads, in FIELDS order."""
    used = {f for s in ACTION_SPECS.values() if s.subagent for f in s.fields}
    unknown = used - set(FIELDS)
    if unknown:
        raise ValueError(f"action specs read fields without a schema in FIELDS: {', '.join(sorted(unknown))}")
    return {"type": "object", "additionalProperties": False, "required": ["action"], "properties": {
        "action": {"type": "string", "enum": list(SUBAGENT_ACTIONS)},
        **{name: schema for name, schema in FIELDS.items() if name in used}}}
