"""`--help`: every command shows examples that the real parser accepts; `legion --help` lists every exit status
and the environment variables legion reads."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from legion.cli import common
from legion.cli.app import build_parser, command_names, main
from legion.cli.helptext import ENVIRONMENT, EXAMPLES, TOOL_ENVIRONMENT, TOP_EXAMPLES
from legion.run_errors import EXIT_FAILED, EXIT_INFRA, EXIT_OK, EXIT_PAUSED, EXIT_USAGE
from legion.workers.providers.config import BUILTINS

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("legion", "bus", "ledger", "agents", "workers", "supervision", "orchestration", "procs")
# LEGION_* names in the source that are not variables a user sets, and why
INTERNAL = {
    "LEGION_WORKER": "legion's own mark on the processes it starts (procs/lineage.py)",
    "LEGION_WORKER_ATTEMPT": "set by the supervisor for a restarted rpc worker",
    "LEGION_DAEMON": "set by `legion run --detach` for its daemon",
    "LEGION_FIXTURE_MARKER": "the tests' fixture worker",
    "LEGION_TOOLS": "a Python name in __all__, not a variable",
    "LEGION_EOF": "a heredoc delimiter in the demo's script",
}


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def _command_lines(examples: str) -> list[list[str]]:
    """The `legion …` command of each example line: after a pipe, before a redirect, without VAR=value."""
    commands = []
    for line in examples.splitlines():
        segment = next(part for part in line.split(" | ") if "legion " in part)
        words = shlex.split(segment.split(" > ")[0], comments=True)
        while re.fullmatch(r"[A-Z_]+=\S*", words[0]):
            words.pop(0)
        assert words[0] == "legion", line
        commands.append(words[1:])
    return commands


def test_every_command_has_examples_the_parser_accepts(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    assert set(EXAMPLES) == set(command_names(parser))
    for name in command_names(parser):
        text = _help(capsys, name)
        examples = text[text.index("\nexamples:\n"):]
        assert f"  legion {name} " in examples or f"| legion {name} " in examples, name
        commands = _command_lines(EXAMPLES[name])
        assert name in {argv[0] for argv in commands}
        for argv in commands:
            assert parser.parse_args(argv).command == argv[0]  # a stale flag in an example exits 2 here
    for argv in _command_lines(TOP_EXAMPLES):
        if argv[-1] == "--help":
            assert argv[0] in command_names(parser)
        else:
            assert parser.parse_args(argv).command == argv[0]


def test_top_level_help_lists_every_exit_status_and_variable(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys)
    statuses = text[text.index("\nexit statuses:\n"):text.index("\nenvironment:\n")]
    codes = {EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INFRA, EXIT_PAUSED} | {
        value for name, value in vars(common).items() if name.startswith("EXIT_")}
    assert {int(m) for m in re.findall(r"^  (\d+) ", statuses, re.M)} == codes
    environment = text[text.index("\nenvironment:\n"):]
    for names, _ in (*ENVIRONMENT, *TOOL_ENVIRONMENT):
        for name in names.split(", "):
            assert re.search(rf"\b{name}\b", environment), name
    for builtin in BUILTINS.values():
        assert builtin.key_env in environment
        assert builtin.base_url_env is None or builtin.base_url_env in environment
    assert "LEGION_LOG_LEVEL" in environment and "LEGION_TEAM" in environment


def test_every_legion_variable_in_the_source_is_documented() -> None:
    documented = {name for names, _ in (*ENVIRONMENT, *TOOL_ENVIRONMENT) for name in names.split(", ")}
    found: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found |= set(re.findall(r"[\"'](LEGION_[A-Z_]+)[\"']", path.read_text(encoding="utf-8")))
    assert "LEGION_LOG_LEVEL" in found and "LEGION_TEAM" in found  # the scan sees the variables it must
    assert found - documented - set(INTERNAL) == set(), "document it in legion/cli/helptext.py ENVIRONMENT"


def test_the_readme_names_every_variable_help_documents() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for names, _ in ENVIRONMENT:
        for name in names.split(", "):
            assert f"`{name}`" in readme, name
