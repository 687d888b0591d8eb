"""One vocabulary, in code: every error code is defined in `legion.codes`, every stored event name in
`legion.ledger.constants` and every process event name in `legion.bus.protocol`, and none is restated as a literal
anywhere else in the source.

Tests may keep literals (an assertion on the wire value is the point of a test)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import legion.codes
from legion.bus.protocol import OTHER_PROCESS_EVENTS, PROCESS_EVENT_TYPES, USAGE
from legion.ledger.constants import EVENT_TYPES
from tests.unit.meta.source_tree import ROOT, parsed, source_files

CODES_MODULE = ROOT / "legion" / "codes.py"
CODES = {name: value for name, value in vars(legion.codes).items() if name.isupper() and isinstance(value, str)}
# Literals equal to a code that are not that code: "ERROR" is also a loguru level name.
NOT_A_CODE = {("supervision/dispatch.py", "ERROR")}


def _source_files() -> Iterator[Path]:
    return (p for p in source_files() if p != CODES_MODULE)


def _name_lists(tree: ast.Module) -> set[int]:
    """ids of the string constants that are names, not values: `__all__` entries and the keys of lazy-export tables."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            if "__all__" in names or any(n.endswith("EXPORTS") for n in names):
                skip |= {id(c) for c in ast.walk(node) if isinstance(c, ast.Constant)}
    return skip


def _restated(path: Path, root: Path = ROOT, values: frozenset[str] = frozenset(CODES.values()),
              home: str = "legion.codes", allowed: frozenset[tuple[str, str]] = frozenset(NOT_A_CODE)) -> list[str]:
    tree = parsed(path) if root == ROOT else ast.parse(path.read_text(encoding="utf-8"))
    skip = _name_lists(tree)
    rel = path.relative_to(root).as_posix()
    return [f"{rel}:{node.lineno}: {node.value!r} (import it from {home})" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in values
            and id(node) not in skip and (rel, node.value) not in allowed and (rel, "*") not in allowed]


def test_no_code_literal_outside_the_codes_module() -> None:
    bad = [line for path in _source_files() for line in _restated(path)]
    assert not bad, "error codes are defined once, in legion/codes.py:\n" + "\n".join(bad)


def test_the_check_sees_a_restated_code(tmp_path: Path) -> None:
    """The scan flags a code written as a literal, and not one imported by name or listed in `__all__`."""
    sample = tmp_path / "legion" / "sample.py"
    sample.parent.mkdir()
    sample.write_text('from legion.codes import QUEUE_FULL\n__all__ = ["QUEUE_FULL"]\n'
                      'def f() -> dict:\n    return {"code": "QUEUE_FULL", "also": QUEUE_FULL}\n', encoding="utf-8")
    assert _restated(sample, tmp_path) == ["legion/sample.py:4: 'QUEUE_FULL' (import it from legion.codes)"]
    sample.write_text('def f(led) -> None:\n    led.append_event("n", "node_launched", {})\n', encoding="utf-8")
    assert _restated(sample, tmp_path, values=frozenset({"node_launched"}), home="x") == [
        "legion/sample.py:2: 'node_launched' (import it from x)"]


def test_codes_are_their_own_names() -> None:
    assert CODES and all(name == value for name, value in CODES.items())


def test_the_codes_module_imports_nothing_of_legion() -> None:
    """Every component imports it, the process layer too, so it must stay a leaf."""
    tree = ast.parse(CODES_MODULE.read_text(encoding="utf-8"))
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    imported += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert set(imported) <= {"__future__", "typing"}, imported


# "usage" is also a ledger table, a transcript field and a provider's reply field: too common a word to check
EVENT_NAMES = frozenset(EVENT_TYPES) | PROCESS_EVENT_TYPES | (OTHER_PROCESS_EVENTS - {USAGE})
EVENT_HOMES = {ROOT / "ledger" / "constants.py", ROOT / "bus" / "protocol.py"}
# Literals equal to an event name that are not that event.
NOT_AN_EVENT = frozenset({
    ("orchestration/orchestrator.py", "tool_call"),  # a node record's field (the launching tool call's id)
    ("orchestration/run.py", "tool_call"),  # likewise
    ("workers/providers/anthropic_messages.py", "text_delta"),  # the Messages API's own stream delta type
    ("workers/pi_engine.py", "turn_start"),  # pi's RPC event kinds, which share these names
    ("workers/pi_engine.py", "text_delta"),
    ("supervision/supervisor.py", "supervisor_exited"),  # the supervisor observer's method name
    ("supervision/supervisor.py", "child_exited"),  # likewise
})


def test_no_event_name_literal_outside_its_constants_module() -> None:
    bad = [line for path in _source_files() if path not in EVENT_HOMES
           for line in _restated(path, values=EVENT_NAMES, home="legion.ledger.constants or legion.bus.protocol",
                                 allowed=NOT_AN_EVENT)]
    assert not bad, "event names are defined once (stored: ledger/constants.py, process: bus/protocol.py):\n" + \
        "\n".join(bad)
