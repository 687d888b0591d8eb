"""Launch guards that concern cards (docs/spec-conformance.md §2.3; §10 items 20, 28)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import yaml

from legion.agents import (
    AgentConfig,
    LaunchRefused,
    WarnOnce,
    backend_for_launch,
    build_settings,
    check_centurion_dispatch,
    check_launch_enabled,
    parse_card,
    phases_for_launch,
    worktree_for_launch,
)

CENTURION = AgentConfig(name="centurion", prompt="lead", worktree=True)
WORKER = AgentConfig(name="worker", prompt="work")


def test_centurion_only_from_root_with_the_exact_text() -> None:
    check_centurion_dispatch(CENTURION, parent="root", node="root", parent_is_root=True)
    check_centurion_dispatch(WORKER, parent="lead", node="n-lead", parent_is_root=False)
    with pytest.raises(LaunchRefused) as info:
        check_centurion_dispatch(CENTURION, parent="centurion", node="alpha", parent_is_root=False)
    assert (
        str(info.value) == "centurion is dispatchable only from the root shell; 'centurion' at 'alpha' cannot"
    )
    assert info.value.code == "BUDGET_EXCEEDED"


def test_disabled_settings_refuse_launches() -> None:
    check_launch_enabled(build_settings([{}]))
    with pytest.raises(LaunchRefused, match="control actions still work"):
        check_launch_enabled(build_settings([{"enabled": False}]))


def test_phases_root_only_centurion_only_and_dispatch_beats_card() -> None:
    card = dataclasses.replace(
        CENTURION,
        phases=parse_card(b"---\nname: centurion\nphases: [planning, reviewing]\n---\nx", path="c.md").phases,
    )
    assert phases_for_launch(WORKER, from_root=True) is None  # undeclared = no machine
    from_card = phases_for_launch(card, from_root=True)
    assert from_card is not None and [p.id for p in from_card.phases] == ["planning", "reviewing"]
    declared = phases_for_launch(card, ["scoping", "building"], from_root=True)
    assert declared is not None and declared.start == "scoping"  # G4
    with pytest.raises(LaunchRefused, match=r"only by the root session \(G2\)"):
        phases_for_launch(card, ["a"], from_root=False)
    with pytest.raises(LaunchRefused, match=r"only for a centurion \(G3\), not for 'worker'"):
        phases_for_launch(WORKER, ["a"], from_root=True)
    with pytest.raises(LaunchRefused, match="invalid phase declaration"):
        phases_for_launch(
            card, {"phases": [{"id": "a", "next": ["b"]}, {"id": "b", "next": ["a"]}]}, from_root=True
        )


def test_start_applies_to_a_bare_list_but_a_machine_start_wins() -> None:
    decl = phases_for_launch(
        CENTURION, [{"id": "a", "next": ["b"]}, {"id": "b", "next": ["a", "done"]}], from_root=True, start="b"
    )
    assert decl is not None and decl.start == "b"
    machine = {"start": "a", "phases": [{"id": "a", "next": ["b"]}, {"id": "b", "next": ["a", "done"]}]}
    decl = phases_for_launch(CENTURION, machine, from_root=True, start="b")
    assert decl is not None and decl.start == "a"
    with pytest.raises(LaunchRefused, match="'start' needs a phase declaration"):
        phases_for_launch(CENTURION, None, from_root=True, start="a")


def test_start_applies_to_every_written_form_of_a_bare_list() -> None:
    # a one-line JSON list, an indented block and the arrow shorthand are bare lists too: never ignored
    loop = [{"id": "a", "next": ["b"]}, {"id": "b", "next": ["a", "done"]}]
    for declared in (json.dumps(loop), yaml.safe_dump(loop), loop):
        decl = phases_for_launch(CENTURION, declared, from_root=True, start="b")
        assert decl is not None and decl.start == "b", declared
    own = json.dumps({"start": "a", "phases": loop})
    own_decl = phases_for_launch(CENTURION, own, from_root=True, start="b")
    assert own_decl is not None and own_decl.start == "a"
    with pytest.raises(LaunchRefused, match="unreachable from 'implementing': planning"):
        phases_for_launch(CENTURION, "planning -> implementing", from_root=True, start="implementing")
    with pytest.raises(LaunchRefused, match="start phase 'ghost' is not declared"):
        phases_for_launch(CENTURION, "planning -> implementing", from_root=True, start="ghost")


def test_worktree_downgrade_warns_once_per_orchestrator_and_never_refuses() -> None:
    # §10 item 28
    once = WarnOnce()
    first = worktree_for_launch(WORKER, True, warn_once=once)
    second = worktree_for_launch(dataclasses.replace(WORKER, name="other"), True, warn_once=once)
    assert first[0] is False and first[1] is not None and "centurion-only" in first[1]
    assert second == (False, None)
    assert (
        worktree_for_launch(WORKER, True, warn_once=WarnOnce())[1] is not None
    )  # a new orchestrator warns again
    assert worktree_for_launch(WORKER) == (False, None)
    assert worktree_for_launch(CENTURION) == (True, None)
    assert worktree_for_launch(CENTURION, False) == (False, None)


def test_a_card_level_worktree_request_warns_once_per_orchestrator_at_launch() -> None:
    # §10 item 28: `worktree: true` on non-centurion cards (two of them) and a call request: one warning
    a = parse_card(b"---\nname: a\nworktree: true\n---\nbody", path="/c/a.md")
    b = parse_card(b"---\nname: b\nworktree: true\n---\nbody", path="/c/b.md")
    assert (a.worktree, a.worktree_downgraded) == (False, True)
    once = WarnOnce()
    results = [
        worktree_for_launch(a, warn_once=once),
        worktree_for_launch(b, warn_once=once),
        worktree_for_launch(WORKER, True, warn_once=once),
    ]
    assert [r[0] for r in results] == [False, False, False]
    assert [r[1] is not None for r in results] == [True, False, False]
    assert worktree_for_launch(a, False, warn_once=WarnOnce()) == (False, None)  # the call says no


def test_backend_is_derived_never_a_card_field() -> None:
    s = build_settings([{}])
    assert backend_for_launch(True, s) == "rpc"
    assert backend_for_launch(False, s) == "inprocess"
    assert backend_for_launch(False, build_settings([{"supervision": {"forceRpc": True}}])) == "rpc"
