"""Structural checks of card `phases:` declarations (docs/spec-conformance.md §5.3)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from legion.agents import CardError, parse_card, validate_phases
from legion.agents.schema import SchemaError

DEFAULT_MACHINE = {
    "start": "planning",
    "maxRework": 2,
    "phases": [
        {
            "id": "planning",
            "timeoutMs": 900000,
            "next": [{"to": "implementing", "when": ["contract_file"]}, "failed", "aborted"],
        },
        {
            "id": "implementing",
            "require": ["children_settled"],
            "next": [
                {"to": "reviewing", "when": ["children_present", "children_none_failed"]},
                {"to": "failed", "when": "children_all_failed"},
                "aborted",
            ],
        },
        {
            "id": "reviewing",
            "next": [
                {"to": "verifying", "when": ["children_present", "children_settled", "verdict_ok"]},
                {"to": "implementing", "when": ["verdict_not_ok"], "rework": True},
                {"to": "planning", "actorRole": "centurion"},
                "failed",
                "aborted",
            ],
        },
        {
            "id": "verifying",
            "next": [
                {"to": "done", "when": ["verification_passed", "children_settled"]},
                {"to": "implementing", "when": ["verification_failed"], "rework": True},
                "failed",
                "aborted",
            ],
        },
        {"id": "done", "terminal": True},
        {"id": "failed", "terminal": True},
        {"id": "aborted", "terminal": True},
    ],
}


@pytest.mark.parametrize(
    "decl",
    [
        ["planning", "implementing", "reviewing", "verifying"],
        "planning -> implementing -> reviewing",
        "planning, implementing",
        DEFAULT_MACHINE,
        json.dumps(DEFAULT_MACHINE),
        "phases:\n  - id: a\n    next: [done]\n",
        {"phases": {"a": {"next": ["b"]}, "b": ["done"]}},
    ],
)
def test_accepted_grammars(decl: Any) -> None:
    machine = validate_phases(decl)
    assert machine.phases and not machine.phases[0].terminal


def test_default_machine_details() -> None:
    m = validate_phases(DEFAULT_MACHINE)
    assert (m.start, m.max_rework) == ("planning", 2)
    assert m.timeouts_ms() == {"planning": 900000}
    reviewing = next(p for p in m.phases if p.id == "reviewing")
    assert any(e.rework and e.to == "implementing" for e in reviewing.next)


@pytest.mark.parametrize(
    ("decl", "needle"),
    [
        ([], "is empty"),
        ("", "is empty"),
        ({"phases": []}, "is empty"),
        (["Planning"], "illegal phase id"),
        (["a", "a"], "duplicate phase id 'a'"),
        ({"phases": [{"id": "a", "next": [{"to": "done", "when": ["moon_is_full"]}]}]}, "unknown condition"),
        ({"phases": [{"id": "a", "next": "done"}]}, "must be an array of edges"),
        ({"phases": [{"id": "a", "next": ["nowhere"]}]}, "unknown phase 'nowhere'"),
        ({"phases": [{"id": "a", "next": ["a", "done"]}]}, "self-loop"),
        (
            {"phases": [{"id": "a", "next": ["done"]}, {"id": "z", "terminal": True, "next": ["a"]}]},
            "terminal phase 'z' must not declare out-edges",
        ),
        ({"phases": [{"id": "a", "next": ["b"]}, {"id": "b"}]}, "non-terminal phase 'b' has no out-edges"),
        (
            {"start": "ghost", "phases": [{"id": "a", "next": ["done"]}]},
            "start phase 'ghost' is not declared",
        ),
        (
            {"start": "done", "phases": [{"id": "a", "next": ["done"]}, {"id": "done"}]},
            "start phase 'done' is terminal",
        ),
        (
            {"phases": [{"id": "a", "next": ["done"]}, {"id": "b", "next": ["done"]}]},
            "unreachable from 'a': b",
        ),
        ({"maxRework": -1, "phases": ["a"]}, "maxRework: must be a non-negative integer"),
        ({"maxRework": True, "phases": ["a"]}, "maxRework"),
        ({"phases": [{"id": "a", "next": ["b"]}, {"id": "b", "next": ["a"]}]}, "never reaches a terminal"),
        ({"phaces": ["a"]}, "did you mean 'phases'"),
        ({"phases": [{"id": "a", "nxt": ["done"]}]}, "did you mean 'next'"),
        ({"phases": [{"id": "a", "next": [{"to": "done", "wen": []}]}]}, "did you mean 'when'"),
        ("[broken json", "not valid one-line JSON"),
        ("a:\n  - [", "not valid YAML"),
        (42, "must be a list of phases"),
        ({"phases": [{"id": "a", "timeoutMs": -1, "next": ["done"]}]}, "timeoutMs"),
    ],
)
def test_structural_rejections(decl: Any, needle: str) -> None:
    with pytest.raises(SchemaError, match=needle):
        validate_phases(decl)


def test_card_phase_errors_carry_file_and_line() -> None:
    raw = b"---\nname: centurion\nphases:\n  - planning\n  - Bad\n---\nbody"
    with pytest.raises(CardError, match=r"phases\[1\]: illegal phase id") as info:
        parse_card(raw, path="/c/centurion.md")
    assert info.value.line == 5


def test_consumers_degrade_a_bad_declaration_to_no_machine_with_a_warning() -> None:
    from legion.agents import phases_or_warning

    assert phases_or_warning(None) == (None, None)
    assert phases_or_warning("  ") == (None, None)
    machine, warning = phases_or_warning('["planning", "implementing"]', source="LEGION_PHASES")
    assert machine is not None and warning is None and machine.start == "planning"
    machine, warning = phases_or_warning("[not json", source="LEGION_PHASES")
    assert (
        machine is None
        and warning is not None
        and "LEGION_PHASES" in warning
        and "without a phase machine" in warning
    )
