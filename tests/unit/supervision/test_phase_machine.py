"""The runtime phase machine (docs/spec-conformance.md §5): normalisation, conditions and evaluation, pure."""

from __future__ import annotations

import pytest

from legion.agents.schema import SchemaError
from legion.agents.verdict import Verdict
from legion.orchestration.phase_machine import (
    CONDITIONS,
    Child,
    Facts,
    MachineError,
    check_condition,
    describe,
    evaluate,
    machine_for,
)

DEFAULT = machine_for("default")
assert DEFAULT is not None


def facts(**kw: object) -> Facts:
    return Facts(**kw)  # type: ignore[arg-type]


def settled(name: str, role: str = "worker", text: str = "") -> Child:
    return Child(name, role, "settled", 1.0, text)


def test_the_default_machine_is_the_seed_table_normalised() -> None:
    assert DEFAULT.start == "planning" and DEFAULT.max_rework == 2 and DEFAULT.self_completes
    assert DEFAULT.legal("planning") == ["implementing", "failed", "aborted", "done"]
    assert [e.injected for e in DEFAULT.phases["planning"].edges] == [False, False, False, True]
    assert DEFAULT.phases["implementing"].require == ("children_settled",)
    assert {p for p, v in DEFAULT.phases.items() if v.terminal} == {"done", "failed", "aborted"}
    assert machine_for(None) is None
    assert "reviewing [" not in describe(DEFAULT) and "implementing [requires children_settled]" in describe(DEFAULT)


def test_a_bare_list_gets_terminals_and_injected_edges() -> None:
    m = machine_for(["draft", "polish"])
    assert m is not None and m.legal("draft") == ["polish", "done", "failed", "aborted"]
    assert m.edge("polish", "done") is not None and not m.edge("polish", "done").injected  # type: ignore[union-attr]


def test_a_malformed_machine_is_refused_with_its_path() -> None:
    with pytest.raises(SchemaError, match=r"phases\.phases\[0\]\.next\[0\]\.when\[0\].*unknown condition"):
        machine_for({"phases": [{"id": "a", "next": [{"to": "done", "when": ["magic"]}]}]})


def test_an_unknown_condition_raises_never_passes() -> None:
    assert len(CONDITIONS) == 11
    with pytest.raises(MachineError, match="unknown phase condition 'magic'"):
        check_condition("magic", Facts(), 2)


def test_implementing_requires_settled_children_also_for_failure_edges() -> None:
    running = Child("w1", "worker", "running")
    d = evaluate(DEFAULT, "implementing", "failed", "centurion", facts(children=[running]), reason="stop")
    assert d.reason == "children_not_terminal"
    d = evaluate(DEFAULT, "implementing", "aborted", "parent", facts(children=[running]))
    assert d.ok  # aborted is exempt from the phase-level require


def test_rework_is_counted_and_the_third_fails_the_team() -> None:
    no = Verdict(False, "bad")
    base = dict(children=[settled("w1"), settled("r", "reviewer")], reviewer_settled=True, verdict=no)
    for used in (0, 1):
        d = evaluate(DEFAULT, "reviewing", "implementing", "centurion", facts(**base, rework_count=used))
        assert d.ok and d.edge is not None and d.edge.rework
    d = evaluate(DEFAULT, "reviewing", "implementing", "centurion", facts(**base, rework_count=2))
    assert d.reason == "rework_limit_exceeded" and d.forced == ("failed", "rework_exhausted")


def test_a_back_edge_without_rework_costs_nothing() -> None:
    m = machine_for({"start": "a", "maxRework": 0, "phases": [{"id": "a", "next": ["b"]}, {"id": "b", "next": ["a", "done"]}]})
    assert m is not None
    assert evaluate(m, "b", "a", "centurion", facts(rework_count=5)).ok


def test_supersedes_handles_a_failure_and_all_failed_is_its_own_reason() -> None:
    failed = Child("w1", "worker", "failed")
    d = evaluate(DEFAULT, "implementing", "reviewing", "centurion", facts(children=[failed, settled("w2")]))
    assert d.reason == "condition_not_met" and "w1" in d.message
    handled = Child("w1", "worker", "failed", handled=True)
    assert evaluate(DEFAULT, "implementing", "reviewing", "centurion", facts(children=[handled, settled("w2")])).ok
    d = evaluate(DEFAULT, "implementing", "reviewing", "centurion", facts(children=[failed]))
    assert d.reason == "all_workers_failed"
    assert evaluate(DEFAULT, "implementing", "failed", "centurion", facts(children=[failed]), reason="x").ok


def test_a_verdict_counts_only_after_a_reviewer_settled() -> None:
    d = evaluate(DEFAULT, "reviewing", "verifying", "centurion", facts(children=[settled("w1")]))
    assert d.reason == "reviewer_not_settled"
    ok = facts(children=[settled("w1"), settled("r", "reviewer")], reviewer_settled=True, verdict=Verdict(True, "ok"))
    assert evaluate(DEFAULT, "reviewing", "verifying", "centurion", ok).ok


def test_injected_done_is_refused_before_actor_role_and_require() -> None:
    d = evaluate(DEFAULT, "implementing", "done", "centurion", facts(children=[Child("w", "worker", "running")]))
    assert d.reason == "injected_done_is_supervisor_only"
    assert evaluate(DEFAULT, "planning", "done", "supervisor", facts()).ok


def test_reviewing_to_planning_is_the_centurions_own_edge() -> None:
    assert evaluate(DEFAULT, "reviewing", "planning", "centurion", facts()).ok
    assert evaluate(DEFAULT, "reviewing", "planning", "supervisor", facts()).reason == "centurion_required"


def test_a_terminal_phase_requested_again_is_same_phase_and_another_is_terminal_phase() -> None:
    same = evaluate(DEFAULT, "done", "done", "centurion", facts())
    assert not same.ok and same.reason == "same_phase", same
    other = evaluate(DEFAULT, "done", "failed", "centurion", facts(), reason="late")
    assert not other.ok and other.reason == "terminal_phase", other


def test_the_review_gate_names_the_reviewer_before_counting_workers() -> None:
    # reviewing → verifying with no worker (children_present would fail) and no approving reviewer settled
    alone = evaluate(DEFAULT, "reviewing", "verifying", "centurion", facts())
    assert alone.reason == "reviewer_not_settled", alone
    rejected = evaluate(DEFAULT, "reviewing", "verifying", "centurion",
                        facts(children=[settled("r1", "reviewer")], reviewer_settled=True,
                              verdict=Verdict(ok=False, summary="no")))
    assert rejected.reason == "review_verdict_not_accepted", rejected
