"""Model resolution (docs/spec-conformance.md §1.5; §10 items 33, 36, 37, 38)."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import pytest

from legion.agents import (
    INHERIT,
    AgentConfig,
    ModelRegistry,
    ModelRequest,
    ModelResolutionError,
    PresetError,
    TeamMember,
    build_settings,
    check_model_scope,
    classify_model_origin,
    model_label,
    parse_card,
    pin_for_candidate,
    provider_for_model,
    replay_pin,
    resolve_model,
    split_thinking_suffix,
    warning_lines,
)
from legion.agents.modelspec import suspicious_suffix


def card(**fields: Any) -> AgentConfig:
    base = AgentConfig(name="worker", prompt="p", path="/c/worker.md")
    return dataclasses.replace(base, **fields)


FULL = {
    "defaultModel": "dflt/m7",
    "presets": {"p": {"model": "preset/m2", "kind": "pi", "thinking": "low"}},
    "agentOverridesByProvider": {"parent": {"worker": {"model": "byprov/m4"}}},
    "agentOverrides": {"worker": {"model": "ovr/m5"}},
}


def test_each_level_with_its_source_and_origin() -> None:
    s = build_settings([FULL])
    agent = card(model="card/m6")
    member = TeamMember(role="worker", model="team/m3")
    cases: list[tuple[dict[str, Any], tuple[str, str, str, int]]] = [
        (
            dict(request=ModelRequest(model="call/m1", preset="p"), member=member),
            ("call/m1", "dispatch", "explicit", 1),
        ),
        (dict(request=ModelRequest(preset="p"), member=member), ("preset/m2", "preset", "explicit", 2)),
        (dict(member=member), ("team/m3", "team", "explicit", 3)),
        ({}, ("byprov/m4", "agentOverrides", "explicit", 4)),
    ]
    for kwargs, expected in cases:
        r = resolve_model(agent, s, parent_model="parent/m8", team="alpha", **kwargs)
        assert (r.model, r.source, r.origin, r.level) == expected
    r = resolve_model(agent, s, parent_model="other/m8")
    assert (r.model, r.level, r.detail) == ("ovr/m5", 5, "agentOverrides.worker.model")
    s2 = build_settings([{"defaultModel": "dflt/m7"}])
    r = resolve_model(agent, s2, parent_model="parent/m8")
    assert (r.model, r.source, r.origin, r.level) == ("card/m6", "frontmatter", "explicit", 6)
    r = resolve_model(card(), s2, parent_model="parent/m8")
    assert (r.model, r.source, r.origin, r.level) == ("dflt/m7", "defaultModel", "inherited", 7)
    r = resolve_model(card(), build_settings([{}]), parent_model="parent/m8")
    assert (r.model, r.source, r.origin, r.level) == ("parent/m8", "dispatch", "inherited", 8)


def test_a_stale_or_blank_team_tag_is_ignored_and_the_card_model_stands() -> None:
    # docs/spec-conformance.md §1.5: the team level applies only to a non-blank member model of this very role
    s = build_settings([{}])
    agent = card(model="card/m6", aliases=("w",))
    for member in (
        TeamMember(role="scout", model="team/m3", thinking="high"),  # another role's entry
        TeamMember(role="worker", model="  "),
        TeamMember(role="worker", model=""),
    ):
        r = resolve_model(agent, s, member=member, parent_model="parent/m8")
        assert (r.model, r.source, r.level, r.thinking) == ("card/m6", "frontmatter", 6, None), member
    r = resolve_model(agent, s, member=TeamMember(role="w", model="team/m3"))
    assert (r.model, r.source, r.level) == ("team/m3", "team", 3)


def test_provider_scoped_override_uses_the_parent_provider_only() -> None:
    s = build_settings([{"agentOverridesByProvider": {"parent": {"worker": {"model": "byprov/m4"}}}}])
    assert resolve_model(card(), s, parent_model="parent/x:high").model == "byprov/m4"
    assert resolve_model(card(), s, parent_model="else/x").model == "else/x"
    assert resolve_model(card(model="card/m"), s).model == "card/m"


def test_preset_is_atomic_kind_model_thinking_from_one_object() -> None:
    s = build_settings(
        [{"presets": {"a": {"kind": "pi", "model": "x/a", "thinking": "high"}, "b": {"model": "x/b"}}}]
    )
    r = resolve_model(card(preset="b", thinking="low"), s, request=ModelRequest(preset="a"))
    assert (r.kind, r.model, r.thinking, r.preset) == ("pi", "x/a", "high", "a")
    r = resolve_model(card(preset="b", kind="native"), s)
    assert (r.kind, r.model, r.thinking, r.preset) == ("native", "x/b", None, "b")
    # the preset's model never pairs with a weaker source's level (card, override, team member)
    s2 = build_settings(
        [{"presets": {"b": {"model": "x/b"}}, "agentOverrides": {"worker": {"thinking": "medium"}}}]
    )
    member = TeamMember(role="worker", thinking="xhigh")
    r = resolve_model(card(preset="b", thinking="low"), s2, member=member)
    assert (r.model, r.thinking, r.label) == ("x/b", None, "x/b")
    r = resolve_model(card(preset="b", thinking="low"), s2, request=ModelRequest(thinking="high"))
    assert r.label == "x/b:high"  # a per-call level is still the caller's choice
    # a preset that does not supply the model leaves the thinking chain alone
    s3 = build_settings([{"presets": {"k": {"kind": "pi"}}}])
    r = resolve_model(card(preset="k", model="c/m", thinking="low"), s3)
    assert (r.kind, r.model, r.thinking) == ("pi", "c/m", "low")


def test_missing_preset_is_an_error_never_a_fallback() -> None:
    with pytest.raises(PresetError, match="unknown preset 'ghost'"):
        resolve_model(card(preset="ghost"), build_settings([{}]), parent_model="p/m")
    with pytest.raises(PresetError):
        resolve_model(card(), build_settings([{}]), request=ModelRequest(model="a/b", preset="ghost"))


def test_inherit_takes_the_parent_model_with_inherited_origin() -> None:
    r = resolve_model(
        card(model=INHERIT), build_settings([{"defaultModel": "d/m"}]), parent_model="par/m:high"
    )
    assert (r.model, r.thinking, r.origin, r.via_inherit, r.level) == ("par/m", "high", "inherited", True, 6)
    assert INHERIT not in r.candidates


@pytest.mark.parametrize(
    "settings_raw", [{}, {"defaultModel": "d/m"}], ids=["no-default", "default-model-set"]
)
def test_inherit_without_parent_refuses_naming_both_ways_out(settings_raw: dict[str, Any]) -> None:
    # docs/spec-conformance.md §1.5 / §10 item 37: `inherit` means the parent's model; with none the launch is refused
    # (never spawned with `inherit`, and never silently given defaultModel instead)
    s = build_settings([settings_raw])
    with pytest.raises(ModelResolutionError) as info:
        resolve_model(card(model=INHERIT), s, parent_model=None)
    err = info.value
    assert err.code == "INVALID_PARAMS"
    text = str(err)
    assert "'worker'" in text and '"inherit"' in text and "/c/worker.md" in text
    assert '"defaultModel"' in text and "explicit model" in text
    for where in (
        {"agentOverrides": {"worker": {"model": "inherit"}}},
        {"presets": {"p": {"model": "inherit"}}},
    ):
        with pytest.raises(ModelResolutionError, match=r"'worker'.*defaultModel.*explicit model"):
            resolve_model(
                card(model="a/b"),
                build_settings([{**settings_raw, **where}]),
                request=ModelRequest(preset="p" if "presets" in where else None),
            )
    with pytest.raises(ModelResolutionError, match="explicit model"):
        resolve_model(card(), s, request=ModelRequest(model="inherit"))
    # each way out works
    assert resolve_model(card(model=INHERIT), s, request=ModelRequest(model="x/y")).model == "x/y"
    if "defaultModel" in settings_raw:
        assert resolve_model(card(), s).model == "d/m"


@pytest.mark.parametrize("parent", ["inherit", " inherit ", "", "   "])
def test_a_parent_model_of_inherit_or_blank_is_no_model(parent: str) -> None:
    # §10 item 37: whatever the parent reports, `inherit` never reaches a spawn
    for agent in (card(), card(model=INHERIT)):
        with pytest.raises(ModelResolutionError, match="explicit model"):
            resolve_model(agent, build_settings([{}]), parent_model=parent)
    assert (
        resolve_model(card(), build_settings([{"defaultModel": "d/m"}]), parent_model=parent).model == "d/m"
    )


def test_no_model_anywhere_refuses_naming_both_ways_out() -> None:
    with pytest.raises(ModelResolutionError, match=r"'worker'.*defaultModel.*explicit model"):
        resolve_model(card(), build_settings([{}]))


def test_fallbacks_never_contain_inherit_and_overrides_replace_them() -> None:
    r = resolve_model(card(model="a/b", fallback_models=("inherit", "c/d")), build_settings([{}]))
    assert r.candidates == ("a/b", "c/d")
    s = build_settings([{"agentOverrides": {"worker": {"fallbackModels": ["e/f"]}}}])
    assert resolve_model(card(model="a/b", fallback_models=("c/d",)), s).fallbacks == ("e/f",)


# --- thinking (§10 item 36) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("openai/gpt-4o:high", ("openai/gpt-4o", "high")),
        ("openai/gpt-4o:off", ("openai/gpt-4o", "off")),
        ("ollama/llama3:8b", ("ollama/llama3:8b", None)),
        ("p/model:variant", ("p/model:variant", None)),
        ("p/m:xhigh", ("p/m", "xhigh")),
        ("p/m", ("p/m", None)),
        (":high", (":high", None)),
    ],
)
def test_only_known_levels_are_stripped(model: str, expected: tuple[str, str | None]) -> None:
    assert split_thinking_suffix(model) == expected


def test_card_thinking_beats_the_suffix_but_a_per_call_suffix_wins() -> None:
    s = build_settings([{}])
    r = resolve_model(card(model="a/m:low", thinking="high"), s)
    assert (r.model, r.thinking, r.label) == ("a/m", "high", "a/m:high")
    r = resolve_model(card(thinking="low"), s, request=ModelRequest(model="a/m:high"))
    assert (r.model, r.thinking, r.label) == ("a/m", "high", "a/m:high")
    r = resolve_model(card(thinking="low"), s, request=ModelRequest(model="a/m:high", thinking="minimal"))
    assert r.thinking == "high"
    r = resolve_model(card(thinking="low"), s, request=ModelRequest(model="a/m"))
    assert (r.thinking, r.label) == ("low", "a/m:low")


def test_thinking_false_strips_and_appends_nothing_undefined_keeps() -> None:
    s = build_settings([{}])
    r = resolve_model(card(model="a/m:high", thinking=False), s)
    assert (r.model, r.thinking, r.thinking_disabled, r.label) == ("a/m", None, True, "a/m")
    r = resolve_model(card(model="a/m:high"), s)
    assert (r.model, r.thinking, r.label) == ("a/m", "high", "a/m:high")
    r = resolve_model(card(model="o/llama:8b", thinking="low"), s)
    assert (r.model, r.label) == ("o/llama:8b", "o/llama:8b:low")


def test_effective_thinking_is_recorded_not_the_card_level() -> None:
    # docs/spec-conformance.md §10 item 36: the string's known level, else request.thinking ?? card.thinking
    r = resolve_model(card(thinking="low"), build_settings([{}]), request=ModelRequest(model="a/m:high"))
    assert r.thinking == "high"
    r = resolve_model(
        card(thinking="low"), build_settings([{}]), request=ModelRequest(model="a/m", thinking="medium")
    )
    assert r.thinking == "medium"


def test_thinking_precedence_request_preset_member_override_card() -> None:
    s = build_settings(
        [
            {
                "presets": {"p": {"model": "x/y", "thinking": "minimal"}},
                "agentOverrides": {"worker": {"thinking": "medium"}},
            }
        ]
    )
    assert resolve_model(card(thinking="low", model="a/b"), s).thinking == "medium"
    member = TeamMember(role="worker", thinking="xhigh")
    assert resolve_model(card(thinking="low", model="a/b"), s, member=member).thinking == "xhigh"
    assert (
        resolve_model(card(model="a/b"), s, member=member, request=ModelRequest(preset="p")).thinking
        == "minimal"
    )
    assert resolve_model(card(model="a/b"), s, request=ModelRequest(thinking="off")).label == "a/b:off"


@pytest.mark.parametrize(
    ("model", "thinking", "label"),
    [
        ("a/m:high", "low", "a/m:high"),
        ("a/m:variant", "low", "a/m:variant:low"),
        ("a/m", "high", "a/m:high"),
        ("a/m", False, "a/m"),
        ("a/m", "off", "a/m:off"),
        ("a/m", None, "a/m"),
        ("a/m", "bogus", "a/m"),
        (None, "high", ""),
    ],
)
def test_one_model_label(model: str | None, thinking: Any, label: str) -> None:
    assert model_label(model, thinking) == label


# --- warnings (§10 item 38) ----------------------------------------------------------------------


def test_warnings_are_returned_never_raised() -> None:
    s = build_settings([{"providers": {"local": {"baseUrl": "http://127.0.0.1:1/v1", "models": ["known"]}}}])
    reg = ModelRegistry.from_settings(s)
    r = resolve_model(card(model="local/custom"), s, registry=reg)
    assert any(w.startswith("Using custom model id.") for w in r.warnings)
    r = resolve_model(card(model="local/known"), s, registry=reg)
    assert r.warnings == ()
    r = resolve_model(card(model="nowhere/x"), s, registry=reg)
    assert any("Unknown provider 'nowhere'" in w for w in r.warnings)
    r = resolve_model(card(model="scripted/anything"), s, registry=reg)
    assert r.warnings == ()
    r = resolve_model(card(model="local/known:hihg"), s, registry=reg)
    assert any("did you mean ':high'" in w for w in r.warnings)
    assert warning_lines("w1", ["x", "y"]) == ["  ⚠ w1: x", "  ⚠ w1: y"]


def test_suspicious_suffix_only_for_near_misses() -> None:
    assert suspicious_suffix("a/b:hgh") is not None
    assert suspicious_suffix("a/b:8b") is None and suspicious_suffix("a/b:high") is None
    assert suspicious_suffix("a/b") is None


# --- provider pin (§10 item 33) ------------------------------------------------------------------


def test_provider_pin_replay_rules() -> None:
    reg = ModelRegistry({"openai": None, "local": None})
    keep = replay_pin(
        recorded_model="openai/a", recorded_provider="openai", call_model="openai/a", registry=reg
    )
    assert (keep.model, keep.provider) == ("openai/a", "openai")
    same = replay_pin(recorded_model="openai/a", recorded_provider="openai", registry=reg)
    assert (same.model, same.provider) == ("openai/a", "openai")
    diff = replay_pin(
        recorded_model="openai/a", recorded_provider="openai", call_model="local/b:high", registry=reg
    )
    assert (diff.model, diff.provider) == ("local/b:high", "local")
    gone = replay_pin(recorded_model="old/a", recorded_provider="old", registry=reg)
    assert (
        (gone.model, gone.provider) == ("old/a", None) and gone.note and "not a known provider" in gone.note
    )
    unvalidated = replay_pin(recorded_model="old/a", recorded_provider="old", registry=None)
    assert unvalidated.provider == "old"
    unknown_new = replay_pin(
        recorded_model="openai/a", recorded_provider="openai", call_model="zzz/b", registry=reg
    )
    assert unknown_new.provider is None


def test_replay_resolves_a_per_call_inherit_and_refuses_malformed_models() -> None:
    # §10 items 33/37: continue/resume never replays `inherit` or a malformed per-call model
    same = replay_pin(
        recorded_model="openai/a", recorded_provider="openai", call_model="inherit", parent_model="openai/a"
    )
    assert (same.model, same.provider, same.note) == ("openai/a", "openai", None)
    other = replay_pin(
        recorded_model="openai/a", recorded_provider="openai", call_model=" inherit ", parent_model="local/b"
    )
    assert (other.model, other.provider) == ("local/b", "local")
    for parent in (None, "inherit", " "):
        with pytest.raises(
            ModelResolutionError, match=r"'w1'.*keep the recorded one \(openai/a\).*explicit model"
        ):
            replay_pin(
                recorded_model="openai/a",
                recorded_provider="openai",
                call_model="inherit",
                parent_model=parent,
                role="w1",
            )
    with pytest.raises(ModelResolutionError, match="must be a model of the form"):
        replay_pin(recorded_model="openai/a", recorded_provider="openai", call_model="no-provider")
    blank_call = replay_pin(recorded_model="openai/a", recorded_provider="openai", call_model="  ")
    assert (blank_call.model, blank_call.provider) == ("openai/a", "openai")


def test_fallback_candidates_get_no_pin() -> None:
    assert pin_for_candidate(0, "openai/a:high") == "openai"
    assert pin_for_candidate(1, "openai/a") is None
    assert provider_for_model("openai/a:high") == "openai"
    assert provider_for_model("x/a", ModelRegistry({"openai": None})) is None


# --- model scope ---------------------------------------------------------------------------------


def test_model_scope_explicit_refuses_inherited_warns() -> None:
    s = build_settings([{"defaultModel": "cheap/m"}])
    explicit = resolve_model(card(model="pricey/m"), s)
    inherited = resolve_model(card(), s)
    assert classify_model_origin("explicit") == "error" and classify_model_origin("inherited") == "warn"
    bad = check_model_scope("w", explicit, ["cheap/*"])
    assert bad.severity == "error" and bad.line is not None and bad.line.startswith("✗ w: model pricey/m")
    ok = check_model_scope("w", inherited, ["cheap/*"])
    assert ok.severity == "ok"
    warn = check_model_scope(
        "w", resolve_model(card(), build_settings([{}]), parent_model="pricey/x"), ["cheap/*"]
    )
    assert warn.severity == "warn" and warn.line is not None and warn.line.startswith("⚠ ")
    assert check_model_scope("w", explicit, None).severity == "ok"


def test_resolution_from_a_parsed_card() -> None:
    agent = parse_card(b"---\nname: w\nmodel: openai/gpt-4o\nthinking: high\n---\nbody", path="w.md")
    r = resolve_model(agent, build_settings([{}]))
    assert (r.label, r.origin, r.provider, r.detail) == (
        "openai/gpt-4o:high",
        "explicit",
        "openai",
        "card w.md:3",
    )


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        (ModelRequest(model="gpt-4o"), "launch model: must be a model of the form"),
        (ModelRequest(model="a/b", thinking="max"), "launch thinking: must be one of"),
        (ModelRequest(model=cast(Any, 42)), "launch model: must be a string"),
    ],
)
def test_per_call_values_are_validated(request_: ModelRequest, needle: str) -> None:
    with pytest.raises(ModelResolutionError, match=needle):
        resolve_model(card(), build_settings([{}]), request=request_, parent_model="p/m")


def test_blank_per_call_values_yield_and_values_are_trimmed() -> None:
    r = resolve_model(card(model="card/m"), build_settings([{}]), request=ModelRequest(model="  ", preset=""))
    assert r.model == "card/m" and r.level == 6
    r = resolve_model(card(), build_settings([{}]), request=ModelRequest(model="  call/m:high "))
    assert (r.model, r.thinking, r.level) == ("call/m", "high", 1)


def test_step_values_yield_to_top_level_when_blank() -> None:
    from legion.agents import step_request

    assert step_request(step_model=" ", model="top/m") == ModelRequest(model="top/m")
    assert step_request(step_model=" s/m ", model="top/m").model == "s/m"
    assert step_request(step_preset="", preset=" fast ").preset == "fast"
    assert step_request(step_thinking="low", thinking="high").thinking == "low"
    assert step_request(thinking="high").thinking == "high"
