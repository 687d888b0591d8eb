"""Layered card loading: built-in → user → project (docs/architecture.md §9.11)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from legion.agents import (
    CardError,
    CatalogError,
    build_settings,
    builtin_card_files,
    find_verdict,
    load_catalog,
    parse_card,
)

BUILTINS = {"centurion", "worker", "reviewer", "scout", "planner"}


def test_builtin_cards_ship_as_package_data_and_load_cleanly(env: dict[str, str], project: Path) -> None:
    names = {Path(p).stem for p, _ in builtin_card_files()}
    assert names >= BUILTINS
    catalog = load_catalog(project, env=env)
    assert set(catalog.names()) >= BUILTINS
    assert catalog.errors == [] and catalog.warnings == []
    for card in catalog:
        assert card.source == "builtin"
        assert card.description and len(card.prompt) > 400, card.name


def test_builtin_centurion_matches_its_contract(env: dict[str, str], project: Path) -> None:
    c = load_catalog(project, env=env).require("centurion")
    assert c.worktree is True and c.allow_nested_subagents is True and c.max_subagent_depth == 2
    assert "root session" in c.description.lower()
    for duty in (
        "contract",
        "file-ownership",
        "adversarial",
        "retry at most twice",
        "no remote",
        "supersedes",
    ):
        assert duty in c.prompt, duty
    assert {"subagent", "legion_phase", "legion_mail"} <= set(c.tools or ())


def test_builtin_scout_is_a_read_only_utility(env: dict[str, str], project: Path) -> None:
    catalog = load_catalog(project, env=env)
    scout = catalog.require_utility("scout")
    assert scout.utility and scout.read_only
    assert not {"write", "edit", "subagent"} & set(scout.tools or ())
    with pytest.raises(CardError, match=r"not a utility agent: worker \(mark it with 'utility: true'\)"):
        catalog.require_utility("worker")


def test_builtin_reviewer_prompt_example_verdict_parses(env: dict[str, str], project: Path) -> None:
    reviewer = load_catalog(project, env=env).require("reviewer")
    assert reviewer.read_only
    verdict = find_verdict(reviewer.prompt)
    assert verdict is not None and verdict.ok is False and verdict.issues[0].severity == "blocker"


def test_builtin_non_leads_cannot_spawn(env: dict[str, str], project: Path) -> None:
    catalog = load_catalog(project, env=env)
    for name in BUILTINS - {"centurion"}:
        card = catalog.require(name)
        assert card.max_subagent_depth == 1 and not card.worktree
        assert "subagent" not in (card.tools or ()), name


def test_project_replaces_user_replaces_builtin_completely(
    env: dict[str, str], project: Path, user_dir: Path, write_card: Callable[..., Path]
) -> None:
    write_card(
        user_dir / "agents", "worker.md", "name: worker\ndescription: user worker\ntoolBudget: 7", "USER"
    )
    catalog = load_catalog(project, env=env)
    worker = catalog.require("worker")
    assert (worker.source, worker.prompt, worker.tool_budget) == ("user", "USER", 7)
    write_card(project / ".legion" / "agents", "w.md", "name: worker\ndescription: project worker", "PROJECT")
    catalog = load_catalog(project, env=env)
    worker = catalog.require("worker")
    # complete replacement: nothing of the user card (toolBudget) or the built-in (tools) survives
    assert (worker.source, worker.prompt, worker.tool_budget, worker.tools) == (
        "project",
        "PROJECT",
        None,
        None,
    )
    assert [c.source for c in catalog.shadowed if c.name == "worker"] == ["builtin", "user"]


def test_xdg_config_home_is_honoured(
    env: dict[str, str], project: Path, tmp_path: Path, write_card: Callable[..., Path]
) -> None:
    xdg = tmp_path / "xdg"
    write_card(xdg / "legion" / "agents", "x.md", "name: xdg-role\ndescription: from xdg")
    catalog = load_catalog(project, env={**env, "XDG_CONFIG_HOME": str(xdg)})
    assert catalog.require("xdg-role").source == "user"


def test_disabled_hides_a_card_and_later_layers_can_hide_builtins(
    env: dict[str, str], project: Path, write_card: Callable[..., Path]
) -> None:
    write_card(project / ".legion" / "agents", "planner.md", "name: planner\ndisabled: true")
    catalog = load_catalog(project, env=env)
    assert "planner" not in catalog and "planner" in catalog.hidden
    with pytest.raises(CardError, match="is disabled"):
        catalog.require("planner")


def test_agent_overrides_disable_and_tighten_cards(env: dict[str, str], project: Path) -> None:
    settings = build_settings(
        [{"agentOverrides": {"scout": {"disabled": True}, "worker": {"toolBudget": 3, "loopNoticeMs": 0}}}]
    )
    catalog = load_catalog(project, env=env, settings=settings)
    assert "scout" not in catalog
    assert catalog.require("worker").tool_budget == 3
    assert catalog.require("worker").loop_notice_ms == 0  # no long-running stall notices for this role


def test_unknown_agent_suggests_the_closest(env: dict[str, str], project: Path) -> None:
    with pytest.raises(CardError, match=r"unknown agent 'reviwer' — did you mean 'reviewer'\?"):
        load_catalog(project, env=env).require("reviwer")


def test_aliases_resolve_to_their_card(
    env: dict[str, str], project: Path, write_card: Callable[..., Path]
) -> None:
    write_card(project / ".legion" / "agents", "a.md", "name: architect\naliases: [arch, designer]")
    catalog = load_catalog(project, env=env)
    assert catalog.require("arch").name == "architect"
    assert "designer" in catalog


def test_strict_mode_collects_every_bad_card(
    env: dict[str, str], project: Path, write_card: Callable[..., Path]
) -> None:
    agents = project / ".legion" / "agents"
    write_card(agents, "a.md", "name: a\nmodle: openai/x")
    write_card(agents, "b.md", "name: b\nspawnMode: rpc")
    (agents / "c.md").write_bytes(b"\x00\xff garbage")
    write_card(agents, "ok.md", "name: fine")
    with pytest.raises(CatalogError) as info:
        load_catalog(project, env=env)
    assert len(info.value.errors) == 3
    text = str(info.value)
    assert "a.md:3" in text and "b.md:3" in text and "c.md" in text
    lenient = load_catalog(project, env=env, strict=False)
    assert "fine" in lenient and len(lenient.errors) == 3


def test_same_name_twice_in_one_layer_is_an_error(
    env: dict[str, str], project: Path, write_card: Callable[..., Path]
) -> None:
    agents = project / ".legion" / "agents"
    write_card(agents, "one.md", "name: twin")
    write_card(agents, "two.md", "name: twin")
    with pytest.raises(CatalogError, match="also defined by"):
        load_catalog(project, env=env)


def test_card_team_must_exist_in_settings(
    env: dict[str, str], project: Path, write_card: Callable[..., Path]
) -> None:
    write_card(project / ".legion" / "agents", "lead.md", "name: lead\nteam: alhpa")
    settings = build_settings([{"teams": {"alpha": {"members": ["worker"]}}}])
    with pytest.raises(
        CatalogError, match=r"team 'alhpa' is not a team in settings — did you mean 'alpha'\?"
    ):
        load_catalog(project, env=env, settings=settings)


def test_worktree_downgrade_warning_reaches_the_catalog_once(
    env: dict[str, str], project: Path, write_card: Callable[..., Path]
) -> None:
    # docs/spec-conformance.md §10 item 28
    write_card(project / ".legion" / "agents", "w.md", "name: builder\nworktree: true")
    catalog = load_catalog(project, env=env)
    assert catalog.require("builder").worktree is False
    assert sum("reserved for the centurion" in w for w in catalog.warnings) == 1


def test_layers_can_be_restricted(
    env: dict[str, str], project: Path, user_dir: Path, write_card: Callable[..., Path]
) -> None:
    write_card(user_dir / "agents", "u.md", "name: only-user")
    write_card(project / ".legion" / "agents", "p.md", "name: only-project")
    assert "only-user" not in load_catalog(project, env=env, layers=("builtin", "project"))
    assert "only-project" not in load_catalog(project, env=env, layers=("builtin", "user"))


def test_loading_reads_no_process_environment(
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    project: Path,
    tmp_path: Path,
    write_card: Callable[..., Path],
) -> None:
    decoy = tmp_path / "decoy"
    write_card(decoy / "legion" / "agents", "d.md", "name: decoy")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(decoy))
    monkeypatch.setenv("HOME", str(decoy))
    assert "decoy" not in load_catalog(project, env=env)


def test_parse_card_is_pure(tmp_path: Path) -> None:
    a: Any = parse_card(b"---\nname: a\n---\nx", path="a.md")
    b: Any = parse_card(b"---\nname: a\n---\nx", path="a.md")
    assert a == b and a.digest == b.digest


def test_settings_naming_unknown_roles_warn_with_a_suggestion(env: dict[str, str], project: Path) -> None:
    settings = build_settings(
        [
            {
                "agentOverrides": {"wroker": {"toolBudget": 2}},
                "agentOverridesByProvider": {"openai": {"reviewr": {"model": "openai/x"}}},
                "teams": {"alpha": {"members": ["scout", {"role": "planer"}]}},
            }
        ]
    )
    warnings = load_catalog(project, env=env, settings=settings).warnings
    assert (
        "settings agentOverrides.wroker: no role named 'wroker' in the loaded cards — did you mean 'worker'?"
        in warnings
    )
    assert any("agentOverridesByProvider.openai.reviewr" in w and "'reviewer'" in w for w in warnings)
    assert any("teams.alpha.members[1].role" in w and "'planner'" in w for w in warnings)
    assert not any("scout" in w for w in warnings)


def test_phases_on_a_non_centurion_card_warn(
    env: dict[str, str], project: Path, write_card: Callable[..., Path]
) -> None:
    write_card(project / ".legion" / "agents", "w.md", "name: builder\nphases: [a, b]")
    warnings = load_catalog(project, env=env).warnings
    assert any("phases apply only to the centurion" in w and "w.md:3" in w for w in warnings)


def test_card_preset_must_exist_in_settings(
    env: dict[str, str], project: Path, write_card: Callable[..., Path]
) -> None:
    write_card(project / ".legion" / "agents", "p.md", "name: fastone\npreset: fsat")
    settings = build_settings([{"presets": {"fast": {"model": "openai/mini"}}}])
    with pytest.raises(
        CatalogError, match=r"p.md:3: preset 'fsat' is not a preset in settings — did you mean 'fast'\?"
    ):
        load_catalog(project, env=env, settings=settings)
    assert load_catalog(project, env=env).require("fastone").preset == "fsat"  # no settings, no cross-check


def _backticked(text: str) -> set[str]:
    return set(re.findall(r"`([a-z_]+)`", text))


def test_builtin_cards_only_name_tools_they_have_and_the_real_tool_vocabulary(
    env: dict[str, str], project: Path
) -> None:
    from legion.agents import KNOWN_TOOLS
    from legion.workers.tools.catalog import BUILTIN_TOOLS, LEGION_TOOLS, all_tools
    from legion.workers.tools.legion_tools import MAIL_SCHEMA, SUBAGENT_ACTIONS, SUBAGENT_SCHEMA

    # the card field table and the workers' tool catalog agree on every tool name
    assert set(KNOWN_TOOLS) == set(BUILTIN_TOOLS) | set(LEGION_TOOLS) == set(all_tools())
    catalog = load_catalog(project, env=env)
    for card in catalog:
        named = _backticked(card.prompt) & set(KNOWN_TOOLS)
        assert named <= set(card.tools or ()), (card.name, named - set(card.tools or ()))
    centurion = catalog.require("centurion").prompt
    words = _backticked(centurion)
    decisions = set(SUBAGENT_SCHEMA["properties"]["decision"]["enum"])
    assert decisions <= words, decisions - words
    assert set(SUBAGENT_ACTIONS) - {"extend"} <= words, set(SUBAGENT_ACTIONS) - words
    kinds = set(MAIL_SCHEMA["properties"]["kind"]["enum"])
    assert kinds <= words
    for card in catalog:  # every mail kind a card suggests is a real one
        for kind in re.findall(r'kind: "([a-z-]+)"', card.prompt):
            assert kind in kinds, (card.name, kind)


def test_the_reviewer_card_teaches_what_the_parser_enforces(env: dict[str, str], project: Path) -> None:
    from legion.agents.verdict import GATING_SEVERITIES, SEVERITIES

    prompt = load_catalog(project, env=env).require("reviewer").prompt
    assert all(f"`{s}`" in prompt for s in SEVERITIES)
    assert all(f"`{s}`" in prompt for s in GATING_SEVERITIES) and "rejected" in prompt
    assert prompt.rstrip().count("```legion-verdict") == 1


def test_every_agent_override_key_has_an_effect() -> None:
    # a documented override key that nothing applies would be silently ignored
    from legion.agents.catalog import _OVERRIDE_KEYS
    from legion.agents.settings_schema import OVERRIDE_SPEC

    resolved_by_models = {"model", "thinking", "preset", "fallbackModels"}
    assert set(OVERRIDE_SPEC.fields) == set(_OVERRIDE_KEYS) | resolved_by_models


def test_a_misspelt_phase_timeout_warns_with_a_suggestion(
    env: dict[str, str], project: Path, write_card: Callable[..., Path]
) -> None:
    write_card(project / ".legion" / "agents", "centurion.md", "name: centurion\nphases: [triage, fixing]")
    raw = {"legion": {"phaseTimeouts": {"implemnting": 5, "triage": 7, "planning": 1}}}
    catalog = load_catalog(project, env=env, settings=build_settings([raw]))
    hits = [w for w in catalog.warnings if "phaseTimeouts" in w]
    assert len(hits) == 1, catalog.warnings
    assert "legion.phaseTimeouts.implemnting" in hits[0] and "did you mean 'implementing'?" in hits[0]
