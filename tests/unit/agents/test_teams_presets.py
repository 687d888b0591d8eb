"""Teams (docs/spec-conformance.md §1.3, §10 item 34) and presets (§1.4)."""

from __future__ import annotations

import pytest

from legion.agents import (
    DEFAULT_TEAM,
    TEAM_ENV,
    PresetError,
    TeamError,
    active_team,
    build_settings,
    require_preset,
    require_team,
    team_column,
    team_env,
    team_for_launch,
)

SETTINGS = build_settings(
    [
        {
            "team": "alpha",
            "teams": {
                "alpha": {
                    "members": ["worker", {"role": "reviewer", "model": "openai/gpt-4o", "preset": "deep"}]
                },
                "beta": {"members": []},
            },
            "presets": {
                "deep": {"kind": "pi", "model": "openai/o3", "thinking": "high"},
                "fast": {"model": "openai/mini"},
            },
        }
    ]
)


def test_selection_env_beats_setting_beats_default() -> None:
    assert active_team(SETTINGS, {TEAM_ENV: "beta"}).name == "beta"
    assert active_team(SETTINGS, {}).name == "alpha"
    assert active_team(build_settings([{}]), {}) == active_team(build_settings([{}]), {"OTHER": "x"})
    assert active_team(build_settings([{}]), {}).name == DEFAULT_TEAM


def test_explicit_default_in_the_per_spawn_env_is_honoured() -> None:
    # docs/spec-conformance.md §10 item 34: key presence decides, so `default` can override a `team` setting
    sel = active_team(SETTINGS, {TEAM_ENV: "default"})
    assert (sel.name, sel.source) == ("default", "env")


def test_sessions_with_different_env_mappings_see_different_teams() -> None:
    # a pooled worker: two sessions, two context envs, one process; nothing shared
    a, b = {TEAM_ENV: "alpha"}, {TEAM_ENV: "beta"}
    assert [active_team(SETTINGS, e).name for e in (a, b, a)] == ["alpha", "beta", "alpha"]


def test_launch_team_beats_card_team_beats_active_team() -> None:
    env = {TEAM_ENV: "beta"}
    assert team_for_launch(SETTINGS, env, launch_team="alpha", card_team="beta").source == "launch"
    assert team_for_launch(SETTINGS, env, card_team="alpha").name == "alpha"
    assert team_for_launch(SETTINGS, env).name == "beta"
    assert team_for_launch(SETTINGS, env, launch_team="  ").name == "beta"


def test_team_travels_in_the_child_env_and_default_never_reaches_nodes_team() -> None:
    assert team_env("default") == {TEAM_ENV: "default"}
    assert team_column("default") is None and team_column(None) is None and team_column(" ") is None
    assert team_column("alpha") == "alpha"


def test_require_team_and_members() -> None:
    alpha = require_team(SETTINGS, "alpha")
    assert [m.role for m in alpha.members] == ["worker", "reviewer"]
    member = alpha.member_for("reviewer")
    assert member is not None and (member.model, member.preset) == ("openai/gpt-4o", "deep")
    assert require_team(SETTINGS, "default").members == ()
    with pytest.raises(
        TeamError, match=r"unknown team 'alpah' — did you mean 'alpha'\? Known teams: alpha, beta"
    ):
        require_team(SETTINGS, "alpah")


def test_preset_is_whole_and_missing_is_an_error() -> None:
    deep = require_preset(SETTINGS, "deep")
    assert (deep.kind, deep.model, deep.thinking) == ("pi", "openai/o3", "high")
    with pytest.raises(
        PresetError, match=r"unknown preset 'depe' \(referenced by this launch\) — did you mean 'deep'\?"
    ):
        require_preset(SETTINGS, "depe", referenced_by="this launch")
    with pytest.raises(PresetError, match="none"):
        require_preset(build_settings([{}]), "x")
