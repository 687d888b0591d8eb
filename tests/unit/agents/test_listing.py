"""`legion agents [user|project|both]` rows (docs/spec-conformance.md §1.5 display, §9 exact strings)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from legion.agents import NEEDS_PARENT_MODEL, AgentDefinitionError, format_rows, list_agents


def test_rows_carry_layer_model_origin_and_description(
    env: dict[str, str], project: Path, user_dir: Path, write_card: Callable[..., Path]
) -> None:
    write_card(
        user_dir / "agents",
        "u.md",
        "name: helper\ndescription: user helper\nmodel: openai/gpt-4o\nthinking: high",
    )
    write_card(project / ".legion" / "agents", "p.md", "name: lazy\ndescription: inherits\nmodel: inherit")
    rows = {r.name: r for r in list_agents(project, "both", env=env)}
    assert {"centurion", "worker", "helper", "lazy"} <= set(rows)
    helper = rows["helper"]
    assert (helper.source, helper.model, helper.origin, helper.description) == (
        "user",
        "openai/gpt-4o:high",
        "explicit",
        "user helper",
    )
    lazy = rows["lazy"]
    assert (lazy.model, lazy.origin, lazy.note) == ("inherit", "inherited", NEEDS_PARENT_MODEL)
    assert NEEDS_PARENT_MODEL == "needs a parent session model — a launch would refuse this"
    assert rows["worker"].model == "the parent session's model" and rows["worker"].origin == "inherited"
    text = "\n".join(format_rows(list(rows.values())))
    assert NEEDS_PARENT_MODEL in text and "(agent CLI default)" not in text


def test_inherit_needs_a_parent_model_even_with_a_default_model(
    env: dict[str, str], project: Path, write_card: Callable[..., Path]
) -> None:
    # `inherit` resolves to the parent's model only; defaultModel never rescues it (docs/spec-conformance.md §1.5)
    write_card(project / ".legion" / "agents", "p.md", "name: lazy\nmodel: inherit")
    (project / ".legion" / "settings.json").write_text(json.dumps({"defaultModel": "openai/mini"}))
    rows = {r.name: r for r in list_agents(project, "project", env=env)}
    assert (rows["lazy"].model, rows["lazy"].origin, rows["lazy"].note) == (
        "inherit",
        "inherited",
        NEEDS_PARENT_MODEL,
    )
    assert rows["worker"].model == "openai/mini"
    text = "\n".join(format_rows(list(rows.values())))
    assert "(agent CLI default)" not in text


def test_an_override_to_inherit_is_listed_as_needing_a_parent(env: dict[str, str], project: Path) -> None:
    settings = {"defaultModel": "openai/mini", "agentOverrides": {"worker": {"model": "inherit"}}}
    (project / ".legion" / "settings.json").write_text(json.dumps(settings))
    rows = {r.name: r for r in list_agents(project, "project", env=env)}
    assert rows["worker"].note == NEEDS_PARENT_MODEL
    assert rows["planner"].model == "openai/mini" and rows["planner"].note == ""


def test_scope_selects_layers(
    env: dict[str, str], project: Path, user_dir: Path, write_card: Callable[..., Path]
) -> None:
    write_card(user_dir / "agents", "u.md", "name: only-user")
    write_card(project / ".legion" / "agents", "p.md", "name: only-project")
    user = {r.name for r in list_agents(project, "user", env=env)}
    proj = {r.name for r in list_agents(project, "project", env=env)}
    assert "only-user" in user and "only-project" not in user
    assert "only-project" in proj and "only-user" not in proj
    with pytest.raises(AgentDefinitionError, match="unknown scope"):
        list_agents(project, "everything", env=env)


def test_a_broken_preset_reference_is_shown_not_raised(
    env: dict[str, str], project: Path, write_card: Callable[..., Path]
) -> None:
    write_card(project / ".legion" / "agents", "p.md", "name: pre\npreset: ghost")
    rows = {r.name: r for r in list_agents(project, env=env)}
    assert rows["pre"].model == "?" and "unknown preset 'ghost'" in rows["pre"].note


def test_disabled_cards_listed_on_request(
    env: dict[str, str], project: Path, write_card: Callable[..., Path]
) -> None:
    write_card(project / ".legion" / "agents", "p.md", "name: planner\ndisabled: true")
    assert "planner" not in {r.name for r in list_agents(project, env=env)}
    rows = {r.name: r for r in list_agents(project, env=env, include_disabled=True)}
    assert rows["planner"].disabled and "[disabled]" in "\n".join(format_rows([rows["planner"]]))


def test_broken_cards_are_listed_as_errors_and_warnings_are_shown(
    env: dict[str, str], project: Path, write_card: Callable[..., Path]
) -> None:
    agents = project / ".legion" / "agents"
    write_card(agents, "typo.md", "name: typo\nmodle: openai/x")
    write_card(agents, "tree.md", "name: builder\nmodel: openai/x\nworktree: true")
    rows = list_agents(project, env=env)
    broken = [r for r in rows if r.source == "error"]
    assert [r.name for r in broken] == ["typo"] and "did you mean 'model'?" in broken[0].note
    builder = next(r for r in rows if r.name == "builder")
    assert "reserved for the centurion" in builder.note
    assert any("did you mean 'model'?" in line for line in format_rows(rows))


def test_the_old_wrong_inherit_text_appears_nowhere_in_the_layer() -> None:
    # docs/spec-conformance.md §9: `(agent CLI default)` must no longer appear anywhere a listing could print it
    root = Path(__file__).resolve().parents[3] / "agents"
    sources = [*root.glob("*.py"), *(root / "cards").glob("*.md")]
    assert len(sources) > 10
    assert [p.name for p in sources if "agent CLI default" in p.read_text(encoding="utf-8")] == []


def test_settings_warnings_are_listed_once_and_card_warnings_stay_on_their_card(
    env: dict[str, str], project: Path, write_card: Callable[..., Path]
) -> None:
    write_card(project / ".legion" / "agents", "w.md", "name: helper\nworktree: true")
    raw = {"agentOverrides": {"reviwer": {"toolBudget": 3}}}
    (project / ".legion" / "settings.json").write_text(json.dumps(raw))
    rows = list_agents(project, "project", env=env)
    warnings = [r for r in rows if r.source == "warning"]
    assert len(warnings) == 1 and "agentOverrides.reviwer" in warnings[0].note
    assert "did you mean 'reviewer'?" in warnings[0].note
    helper = next(r for r in rows if r.name == "helper")
    assert "worktree" in helper.note
    assert not any("worktree" in r.note for r in warnings)
    assert any("⚠ settings agentOverrides.reviwer" in line for line in format_rows(rows))
