"""Each action is defined once (workers/tools/action_specs.py): the `subagent` schema the model sees, the operator
socket's actions and lanes, and the `legion` operator subcommands are generated from the specs, and every spec
has exactly one handler in the orchestration layer. The literals below are the hand-written definitions the
specs replaced: generating them must not change what the model or the operator sees."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson
import pytest

from legion.cli import build_parser
from legion.cli.operate import action_args
from legion.orchestration import commands
from legion.workers.tools.action_specs import (
    ACTION_SPECS,
    FIELDS,
    OPERATOR_ACTIONS,
    OPERATOR_CANCELLABLE,
    OPERATOR_RESERVED,
    SUBAGENT_ACTIONS,
)
from legion.workers.tools.legion_tools import LEGION_TOOLS, SUBAGENT_SCHEMA, legion_tools

_NAME = {"type": "string", "minLength": 1, "maxLength": 64}
_TASK_ITEM = {"type": "object", "additionalProperties": False, "required": ["task"], "properties": {
    "task": {"type": "string", "minLength": 1}, "agent": {"type": "string"}, "name": _NAME,
    "model": {"type": "string"}, "preset": {"type": "string"}, "cwd": {"type": "string", "minLength": 1}}}
PINNED_ACTIONS = ("launch", "continue", "steer", "abort", "resume", "retire", "status", "collect", "list", "wait",
                  "stop", "diagnose", "extend")
PINNED_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["action"], "properties": {
    "action": {"type": "string", "enum": list(PINNED_ACTIONS)},
    "agent": {"type": "string"}, "task": {"type": "string"}, "name": _NAME,
    "names": {"type": "array", "items": _NAME}, "model": {"type": "string"}, "preset": {"type": "string"},
    "team": {"type": "string"}, "worktree": {"type": "boolean"},
    "phases": {"type": ["array", "object", "string"]}, "start": {"type": "string"},
    "cwd": {"type": "string", "minLength": 1},  # working-directory admission (docs/spec-conformance.md §11)
    "tasks": {"type": "array", "items": _TASK_ITEM, "minItems": 1},
    "message": {"type": "string"}, "force": {"type": "boolean"}, "clearQueued": {"type": "boolean"},
    "timeoutMs": {"type": "integer", "minimum": 0}, "section": {"type": "string"},
    "decision": {"type": "string", "enum": ["extend", "steer_again", "stop", "force_stop"]}}}
PINNED_DESCRIPTION = ("Manage child agents: " + ", ".join(PINNED_ACTIONS) + ". Steer is queue-only; abort interrupts "
                      "the current turn; stop/retire tear a child down.")


def test_the_model_sees_the_subagent_schema_it_saw_before() -> None:
    tool = legion_tools()["subagent"]
    assert SUBAGENT_ACTIONS == PINNED_ACTIONS
    assert tool.parameters == SUBAGENT_SCHEMA == PINNED_SCHEMA
    # byte for byte, key order included: what a provider sends is this JSON
    assert orjson.dumps(tool.parameters) == orjson.dumps(PINNED_SCHEMA)
    assert tool.description == PINNED_DESCRIPTION


def test_every_subagent_field_is_read_by_some_action() -> None:
    read = {f for s in ACTION_SPECS.values() if s.subagent for f in s.fields}
    assert read == set(FIELDS), f"fields no action reads: {set(FIELDS) - read}"


def test_the_operator_socket_serves_the_actions_and_lanes_it_served_before() -> None:
    # pause was served by an override in orchestration/run.py; now it is an action like the others
    assert set(OPERATOR_ACTIONS) == {"launch", "steer", "abort", "retire", "stop", "wait", "collect", "continue",
                                     "resume", "status", "list", "mail", "pause"}
    assert set(OPERATOR_RESERVED) == {"stop", "pause", "abort", "status"}
    assert set(OPERATOR_CANCELLABLE) == {"wait", "status", "list"}


def test_every_spec_has_exactly_one_handler_and_every_handler_a_spec() -> None:
    commands.load_handlers()
    assert set(commands.ACTIONS) == set(ACTION_SPECS)
    assert set(commands.TOOLS) == set(LEGION_TOOLS) == {"subagent", "vexillatio", "legion_mail", "legion_tree",
                                                         "legion_phase"}
    assert len(set(commands.ACTIONS.values())) == len(commands.ACTIONS)  # no handler serves two actions


async def _handler(*_: Any) -> dict[str, Any]:
    return {"ok": True}


def test_a_handler_without_a_spec_or_a_second_handler_is_refused_at_import() -> None:
    commands.load_handlers()
    with pytest.raises(commands.HandlerTableError, match="unknown action 'frobnicate'"):
        commands.action("frobnicate")
    with pytest.raises(commands.HandlerTableError, match="a second handler for the action 'steer'"):
        commands.action("steer")(_handler)
    with pytest.raises(commands.HandlerTableError, match="unknown legion tool 'legion_frob'"):
        commands.tool("legion_frob")


def test_a_spec_without_a_handler_stops_the_orchestrator_from_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    commands.load_handlers()
    monkeypatch.delitem(commands.ACTIONS, "diagnose")
    with pytest.raises(commands.HandlerTableError, match="no handler for diagnose"):
        commands.load_handlers()


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    for act in build_parser()._actions:
        if isinstance(act, argparse._SubParsersAction):
            return dict(act.choices)
    raise AssertionError("legion has no subcommands")


# each operator subcommand's arguments as they were written by hand: (option strings or dest, nargs, default)
PINNED_CLI = {
    "launch": [("run",), ("--json",), ("--agent",), ("--task",), ("--name",), ("--model",), ("--parent",),
               ("--workdir",)],
    "steer": [("run",), ("--json",), ("name",), ("message",)],
    "abort": [("run",), ("--json",), ("name",)],
    "retire": [("run",), ("--json",), ("name",), ("--force",)],
    "stop": [("run",), ("--json",), ("name",), ("--all",), ("--force",), ("--timeout",)],
    "wait": [("run",), ("--json",), ("names",), ("--timeout",)],
    "collect": [("run",), ("--json",), ("name",), ("--timeout",)],
}


def test_every_operator_subcommand_keeps_its_arguments() -> None:
    subs = _subcommands()
    generated = {s.name for s in ACTION_SPECS.values() if s.cli is not None}
    assert generated == set(PINNED_CLI)
    for verb, pinned in PINNED_CLI.items():
        args = [a for a in subs[verb]._actions if not isinstance(a, argparse._HelpAction) and a.dest != "cwd"]
        assert [tuple(a.option_strings) or (a.dest,) for a in args] == [p for p in pinned], verb
    required = {a.dest for a in subs["launch"]._actions if a.required}
    assert required == {"run", "agent", "task"}
    timeouts = {v: next(a.default for a in subs[v]._actions if a.dest == "timeout") for v in ("stop", "wait", "collect")}
    assert timeouts == {"stop": 60.0, "wait": 300.0, "collect": 300.0}


@pytest.mark.parametrize(("argv", "expected"), [
    (["launch", "R", "--agent", "worker", "--task", "do it"], {"agent": "worker", "task": "do it"}),
    (["launch", "R", "--agent", "worker", "--task", "do it", "--name", "w1", "--model", "a/b", "--parent", "p"],
     {"agent": "worker", "task": "do it", "name": "w1", "model": "a/b", "parent": "p"}),
    (["launch", "R", "--agent", "worker", "--task", "do it", "--workdir", "/srv/other"],
     {"agent": "worker", "task": "do it", "cwd": "/srv/other"}),
    (["steer", "R", "w1", "hello"], {"name": "w1", "message": "hello"}),
    (["abort", "R", "w1"], {"name": "w1"}),
    (["retire", "R", "w1"], {"name": "w1", "force": False}),
    (["retire", "R", "w1", "--force"], {"name": "w1", "force": True}),
    (["stop", "R", "w1", "--force"], {"name": "w1", "force": True}),
    (["wait", "R"], {"timeoutMs": 300_000}),
    (["wait", "R", "a", "b", "--timeout", "1.5"], {"names": ["a", "b"], "timeoutMs": 1500}),
    (["collect", "R", "w1", "--timeout", "2"], {"name": "w1", "timeoutMs": 2000}),
])
def test_a_subcommand_sends_the_arguments_it_sent_before(argv: list[str], expected: dict[str, Any],
                                                          tmp_path: Path) -> None:
    ns = build_parser().parse_args(argv)
    assert action_args(ACTION_SPECS[ns.verb], ns, tmp_path) == expected


def test_launch_reads_the_task_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "task.md").write_text("from the file ✓", encoding="utf-8")
    ns = build_parser().parse_args(["launch", "R", "--agent", "worker", "--task", "@task.md"])
    assert action_args(ACTION_SPECS["launch"], ns, tmp_path)["task"] == "from the file ✓"


def test_the_protocol_document_lists_the_operator_actions() -> None:
    text = (Path(__file__).resolve().parents[3] / "docs" / "protocol.md").read_text(encoding="utf-8")
    section = text.split("### 4.2 Actions", 1)[1].split("\n#", 1)[0]
    listed = [line.split("`")[1] for line in section.splitlines() if line.startswith("| `")]
    assert sorted(listed) == sorted(OPERATOR_ACTIONS)
