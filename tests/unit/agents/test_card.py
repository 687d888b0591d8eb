"""Role card parsing and the strict field table (docs/spec-conformance.md §1.1, §10 items 28–30)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from legion.agents import (
    CARD_FIELDS,
    AgentConfig,
    CardError,
    SettingsError,
    UnknownFieldError,
    load_catalog,
    load_settings,
    parse_card,
)


def parse(front: str, body: str = "Prompt body.", path: str = "/p/.legion/agents/x.md") -> AgentConfig:
    return parse_card(f"---\n{front}\n---\n{body}\n".encode(), path=path, source="project")


def test_minimal_card_gets_defaults_and_body_as_prompt() -> None:
    card = parse("name: helper\ndescription: helps", body="\nLine one.\nLine two.\n")
    assert card.name == "helper"
    assert card.kind == "native"
    assert card.prompt == "Line one.\nLine two."
    assert card.restart == "transient"
    assert card.system_prompt_mode == "append"
    assert card.inherit_project_context is True
    assert card.tools is None and card.phases is None and card.acceptance is None
    assert card.explicit == frozenset({"name", "description"})
    assert card.source == "project" and card.digest


def test_name_defaults_to_file_stem_and_must_be_a_slug() -> None:
    assert parse("description: d", path="/x/good-name.md").name == "good-name"
    with pytest.raises(CardError, match="not a valid role name"):
        parse("description: d", path="/x/Bad Name.md")
    with pytest.raises(CardError, match=r"name: must match"):
        parse("name: Worker")


def test_every_field_of_the_table_is_accepted() -> None:
    front = """
name: full
description: all fields
kind: pi
model: openai/gpt-4o:high
thinking: low
aliases: [f1, f2]
preset: fast
team: alpha
fallbackModels: [openai/gpt-4o-mini]
systemPromptMode: replace
inheritProjectContext: false
defaultReads: [README.md, docs/a.md]
tools: read, grep
timeoutMs: 1000
toolTimeoutMs: 2000
loopNoticeMs: 3000
maxSubagentDepth: 2
allowNestedSubagents: true
utility: true
disabled: false
worktree: false
onBlocked: reject
toolBudget: 10
turnBudget: 20
budget: {reserveUsd: 0.25}
phases: [planning, implementing]
acceptance: {level: verified, role: read-only, criteria: ["tests pass", {description: lint, command: ruff check .}]}
restart: permanent
maxRestarts: 5
restartPeriodMs: 30000
"""
    card = parse(front)
    assert card.explicit == frozenset(CARD_FIELDS)
    assert card.kind == "pi" and card.thinking == "low" and card.aliases == ("f1", "f2")
    assert card.tools == ("read", "grep")
    assert card.max_subagent_depth == 2 and card.tool_budget == 10 and card.turn_budget == 20
    assert card.budget == {"reserveUsd": 0.25} and card.on_blocked == "reject"
    assert card.restart == "permanent" and card.max_restarts == 5 and card.restart_period_ms == 30000
    assert card.read_only
    assert card.acceptance is not None and card.acceptance.level == "verified"
    assert [c.command for c in card.acceptance.criteria] == [None, "ruff check ."]
    assert card.phases is not None and [p.id for p in card.phases.phases] == ["planning", "implementing"]


def test_unknown_key_names_file_line_closest_key_and_full_list() -> None:
    with pytest.raises(UnknownFieldError) as info:
        parse("name: a\ndescription: d\nmodle: openai/gpt-4o", path="/proj/.legion/agents/a.md")
    err = info.value
    text = str(err)
    assert text.startswith("/proj/.legion/agents/a.md:4: ")
    assert err.line == 4
    assert "'modle'" in text and "did you mean 'model'?" in text
    for key in CARD_FIELDS:
        assert key in text


def test_unknown_nested_acceptance_key_is_caught_with_a_suggestion() -> None:
    with pytest.raises(
        UnknownFieldError, match=r"unknown key 'levle' in acceptance — did you mean 'level'\?"
    ) as info:
        parse("name: a\nacceptance:\n  role: writer\n  levle: verified")
    assert info.value.line == 5


@pytest.mark.parametrize(
    ("key", "needle"),
    [("spawnMode: rpc", "backend is derived at launch"), ("placement: right", "pane-layout hint")],
)
def test_spawnmode_and_placement_are_load_time_errors(key: str, needle: str) -> None:
    # docs/spec-conformance.md §10 item 29 and §1.1 (placement is no field)
    with pytest.raises(UnknownFieldError, match=needle) as info:
        parse(f"name: a\n{key}")
    assert info.value.line == 3


@pytest.mark.parametrize("kind", ["docker", "subprocess", "PI", ""])
def test_kind_outside_native_pi_is_an_error_listing_both(kind: str) -> None:
    # docs/architecture.md §9.2 (stricter than the original's warn-and-ignore, docs/spec-conformance.md §10 item 30)
    with pytest.raises(CardError) as info:
        parse(f"name: a\nkind: '{kind}'")
    assert "native" in str(info.value) and "pi" in str(info.value)
    assert info.value.line == 3


def test_kind_pi_and_native_are_accepted() -> None:
    assert parse("name: a\nkind: pi").kind == "pi"
    assert parse("name: a\nkind: native").kind == "native"


def test_non_centurion_worktree_is_downgraded_with_one_warning() -> None:
    # docs/spec-conformance.md §10 item 28: downgrade, never an error
    card = parse("name: worker2\nworktree: true")
    assert card.worktree is False
    assert len(card.warnings) == 1
    assert "reserved for the centurion" in card.warnings[0] and "x.md:3:" in card.warnings[0]


def test_centurion_keeps_its_worktree() -> None:
    card = parse("name: centurion\nworktree: true")
    assert card.worktree is True and card.warnings == ()


@pytest.mark.parametrize(
    ("front", "needle", "line"),
    [
        ("name: a\ntimeoutMs: -5", "timeoutMs: must be an integer between 1", 3),
        ("name: a\ntimeoutMs: 1.5", "timeoutMs: must be an integer", 3),
        ("name: a\nturnBudget: true", "turnBudget: must be an integer", 3),
        ("name: a\nmaxSubagentDepth: 0", "maxSubagentDepth: must be an integer between 1 and 16", 3),
        ("name: a\nutility: 'yes please'", "utility: must be true or false", 3),
        ("name: a\nrestart: sometimes", "restart: must be one of: permanent, transient, temporary", 3),
        ("name: a\nsystemPromptMode: prepend", "must be one of: append, replace", 3),
        ("name: a\ntools: [read, shell]", r"tools\[1\]: must be one of: bash", 3),
        ("name: a\nmodel: gpt-4o", "model: must be a model of the form provider/model-id", 3),
        ("name: a\nmodel: 'openai/gpt 4o'", "must be a model of the form", 3),
        ("name: a\nthinking: extreme", "thinking: must be one of: off, minimal, low, medium, high, xhigh", 3),
        ("name: a\nthinking: true", "or false to strip any level", 3),
        ("name: a\naliases: [b, b]", r"aliases\[1\]: duplicate entry", 3),
        ("name: a\naliases: [a]", "the card's own name", 3),
        ("name: a\nacceptance: {role: admin}", "acceptance.role: must be one of: read-only, writer", 3),
        ("name: a\nacceptance: {level: perfect}", "acceptance.level: must be one of: attested, verified", 3),
        ("name: a\nacceptance: {criteria: [{command: make}]}", "description: is required", 3),
        ("name: a\nacceptance: {criteria: [3]}", "criterion string or an object", 3),
        ("name: a\nacceptance: [level]", "acceptance: must be an object", 3),
        ("name: a\ndescription: [1, 2]", "description: must be a string", 3),
        ("name: a\nmaxRestarts: -1", "maxRestarts: must be an integer between 0", 3),
        ("name: a\nfallbackModels: [nope]", r"fallbackModels\[0\]: must be a model", 3),
    ],
)
def test_value_validation_messages_are_precise(front: str, needle: str, line: int) -> None:
    with pytest.raises(CardError, match=needle) as info:
        parse(front)
    assert info.value.line == line


def test_thinking_false_and_model_inherit_are_valid() -> None:
    card = parse("name: a\nmodel: inherit\nthinking: false")
    assert card.model == "inherit" and card.thinking is False


def test_model_with_variant_suffix_and_nested_path_is_valid() -> None:
    assert parse("name: a\nmodel: ollama/llama3:8b").model == "ollama/llama3:8b"
    assert (
        parse("name: a\nmodel: openrouter/anthropic/claude-3.5:high").model
        == "openrouter/anthropic/claude-3.5:high"
    )


@pytest.mark.parametrize(
    ("raw", "needle", "line"),
    [
        (b"no frontmatter here", "must start with a '---' line", 1),
        (b"---\nname: a\nbody never closed", "never closed", 1),
        (b"---\nname: [unclosed\n---\nbody", "invalid YAML frontmatter", None),
        (b"---\n- a\n- b\n---\nbody", "must be a YAML mapping", 2),
        (b"---\nname: a\n\xff\xfe\n---\n", "not valid UTF-8", 3),
        (b"---\nname: a\x00\n---\n", "NUL", 2),
        (b"---\nname: a\ndate: 2001-02-30\n---\n", "invalid YAML frontmatter", None),
        (b"---\n? [a, b]\n: c\n---\n", "invalid YAML frontmatter", None),
        (b"---\n1: x\n---\n", "keys must be strings", None),
    ],
)
def test_bad_bytes_and_yaml_are_card_errors(raw: bytes, needle: str, line: int | None) -> None:
    with pytest.raises(CardError, match=needle) as info:
        parse_card(raw, path="/c/bad.md")
    if line is not None:
        assert info.value.line == line
    assert str(info.value).startswith("/c/bad.md")


def test_yaml_error_position_is_a_file_line() -> None:
    with pytest.raises(CardError) as info:
        parse_card(b"---\nname: a\ndescription: ok\ntools: [read\nmodel: x\n---\n", path="/c/y.md")
    assert info.value.line is not None and 4 <= info.value.line <= 6


def test_crlf_and_bom_are_accepted() -> None:
    card = parse_card("\ufeff---\r\nname: a\r\n---\r\nbody\r\n".encode(), path="/c/a.md")
    assert card.name == "a" and card.prompt == "body"


def test_oversized_card_is_refused() -> None:
    with pytest.raises(CardError, match="larger than the limit of 262144 bytes"):
        parse_card(b"---\nname: a\n---\n" + b"x" * 300_000, path="/c/big.md")


@pytest.mark.timeout(30)
def test_huge_fifo_and_dangling_card_files_are_errors_not_hangs(tmp_path: Path, env: dict[str, str]) -> None:
    agents = tmp_path / ".legion" / "agents"
    agents.mkdir(parents=True)
    with (agents / "huge.md").open("wb") as handle:  # sparse: 2 GiB that must never be read whole
        handle.truncate(2 << 30)
    os.mkfifo(agents / "fifo.md")  # opening it for reading would block forever
    (agents / "dangling.md").symlink_to(tmp_path / "nowhere.md")
    (agents / "ok.md").write_text("---\nname: ok\n---\nbody")
    catalog = load_catalog(tmp_path, env=env, strict=False)
    assert "ok" in catalog
    problems = {Path(e.path or "").name: str(e) for e in catalog.errors}
    assert "larger than the limit" in problems["huge.md"]
    assert "not a regular file" in problems["fifo.md"]
    assert "cannot read card" in problems["dangling.md"]


@pytest.mark.timeout(30)
def test_huge_or_fifo_settings_files_are_errors_not_hangs(tmp_path: Path, env: dict[str, str]) -> None:
    settings = tmp_path / ".legion" / "settings.json"
    settings.parent.mkdir(parents=True)
    with settings.open("wb") as handle:
        handle.truncate(2 << 30)
    with pytest.raises(SettingsError, match="larger than the limit"):
        load_settings(tmp_path, env=env)
    settings.unlink()
    os.mkfifo(settings)
    with pytest.raises(SettingsError, match="not a regular file"):
        load_settings(tmp_path, env=env)


def test_replace_mode_needs_a_body() -> None:
    with pytest.raises(CardError, match="needs a prompt body"):
        parse("name: a\nsystemPromptMode: replace", body="")


def test_empty_frontmatter_uses_the_file_name() -> None:
    card = parse_card(b"---\n---\nbody\n", path="/c/solo.md")
    assert card.name == "solo" and card.explicit == frozenset()


@pytest.mark.timeout(20)
def test_alias_bomb_is_rejected_quickly() -> None:
    rows = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    rows += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    bomb = "\n".join([*rows, "defaultReads: *a9"])
    with pytest.raises(CardError):
        parse_card(f"---\n{bomb}\n---\nbody".encode(), path="/c/bomb.md")
    nested = "\n".join([*rows, "acceptance: {criteria: *a9}"])
    with pytest.raises(CardError):
        parse_card(f"---\n{nested}\n---\nbody".encode(), path="/c/bomb2.md")


def test_tool_lists_contradicting_read_only_or_leaf_flags_warn_never_fail() -> None:
    util = parse_card(b"---\nname: u\nutility: true\ntools: [read, subagent]\n---\nbody", path="/c/u.md")
    assert len(util.warnings) == 1 and "/c/u.md:4" in util.warnings[0] and "subagent" in util.warnings[0]
    ro = parse_card(
        b"---\nname: r\ntools: [read, edit]\nacceptance: {role: read-only}\n---\nbody", path="/c/r.md"
    )
    assert len(ro.warnings) == 1 and "edit" in ro.warnings[0] and "/c/r.md:3" in ro.warnings[0]
    clean = parse_card(
        b"---\nname: c\nutility: true\ntools: [read]\nacceptance: {role: read-only}\n---\nbody",
        path="/c/c.md",
    )
    assert clean.warnings == ()


@pytest.mark.parametrize(("front", "key", "line"), [
    ("name: a\nmodel: openai/x\nmodel: openai/y", "model", 4),
    ("name: a\nacceptance:\n  level: verified\n  level: attested", "level", 5),
    ("name: a\nname: b", "name", 3),
])
def test_duplicate_frontmatter_keys_are_rejected(front: str, key: str, line: int) -> None:
    """YAML keeps the last of two equal keys silently; a card (like settings.json) refuses them."""
    with pytest.raises(CardError) as info:
        parse(front)
    assert f"duplicate key '{key}'" in info.value.message and info.value.line == line


def test_every_wrong_field_of_a_card_is_reported() -> None:
    with pytest.raises(CardError) as info:
        parse("name: a\ntimeoutMs: -5\nmodle: openai/x\nrestart: sometimes\ndescription: fine")
    message = info.value.message
    assert message.startswith("3 problems in the frontmatter")
    assert "line 3: timeoutMs: must be an integer" in message
    assert "line 4: unknown key 'modle'" in message and "did you mean 'model'?" in message
    assert "line 5: restart: must be one of" in message
    assert info.value.line == 3 and not isinstance(info.value, UnknownFieldError)
    with pytest.raises(UnknownFieldError) as unknown:  # only unknown keys: still the specific type
        parse("name: a\nmodle: x\ndescriptoin: y")
    assert unknown.value.message.startswith("2 problems")
