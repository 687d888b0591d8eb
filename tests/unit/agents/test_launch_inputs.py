"""System prompt composition, child budgets and restart policy derived from cards."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from legion.agents import (
    BASE_PROMPT,
    MAX_DEPTH_CEILING,
    AgentConfig,
    CardError,
    LaunchRefused,
    build_settings,
    child_budget,
    compose_system_prompt,
    depth_cap,
    parse_card,
    project_context_files,
    restart_policy,
)
from legion.agents import prompt as prompt_module

CARD = AgentConfig(name="worker", prompt="You are the worker.", path="/c/worker.md")


def test_append_mode_puts_the_card_after_the_base_prompt(tmp_path: Path) -> None:
    parts = compose_system_prompt(CARD, cwd=tmp_path, task_context="Run r1, node n1.", stop_at=tmp_path)
    assert parts.text.startswith(BASE_PROMPT.strip())
    assert parts.text.index("You are the worker.") < parts.text.index("Run r1, node n1.")
    assert parts.sources == ("<legion base prompt>", "/c/worker.md", "<run context>")


def test_replace_mode_uses_the_card_alone(tmp_path: Path) -> None:
    parts = compose_system_prompt(
        dataclasses.replace(CARD, system_prompt_mode="replace"), cwd=tmp_path, stop_at=tmp_path
    )
    assert parts.text == "You are the worker."


def test_project_context_files_outermost_first_agents_md_preferred(tmp_path: Path) -> None:
    (tmp_path / "AGENTS.md").write_text("root rules")
    (tmp_path / "CLAUDE.md").write_text("ignored: AGENTS.md wins in the same directory")
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    (tmp_path / "a" / "CLAUDE.md").write_text("a rules")
    assert project_context_files(sub, stop_at=tmp_path) == [
        tmp_path / "AGENTS.md",
        tmp_path / "a" / "CLAUDE.md",
    ]
    text = compose_system_prompt(CARD, cwd=sub, stop_at=tmp_path).text
    assert text.index("root rules") < text.index("a rules") and "ignored" not in text
    off = compose_system_prompt(
        dataclasses.replace(CARD, inherit_project_context=False), cwd=sub, stop_at=tmp_path
    )
    assert "root rules" not in off.text


def _age(*folders: Path) -> None:
    """Backdate folders past the lookup cache's settle time."""
    old = time.time() - 10
    for folder in folders:
        os.utime(folder, (old, old))


def test_project_context_lookup_is_remembered_and_sees_a_new_or_removed_file(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    sub = tmp_path / "a"
    sub.mkdir()
    _age(tmp_path, sub)
    assert project_context_files(sub, stop_at=tmp_path) == []
    probes: list[Path] = []
    real = prompt_module._first_existing
    monkeypatch.setattr(prompt_module, "_first_existing", lambda d, names: probes.append(d) or real(d, names))
    assert project_context_files(sub, stop_at=tmp_path) == []
    assert probes == []  # remembered: the folders did not change
    (sub / "AGENTS.md").write_text("new rules")  # moves a's mtime
    assert project_context_files(sub, stop_at=tmp_path) == [sub / "AGENTS.md"]
    assert "new rules" in compose_system_prompt(CARD, cwd=sub, stop_at=tmp_path).text
    (sub / "AGENTS.md").unlink()
    assert project_context_files(sub, stop_at=tmp_path) == []


def test_a_folder_changed_within_the_settle_time_is_looked_up_every_time(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its mtime may not move again for a change within the same timestamp tick: it is never trusted while fresh."""
    changed = os.stat(tmp_path).st_mtime_ns
    monkeypatch.setattr(prompt_module, "_now_ns", lambda: changed + prompt_module.SETTLED_NS // 2)
    probes: list[Path] = []
    real = prompt_module._first_existing
    monkeypatch.setattr(prompt_module, "_first_existing", lambda d, names: probes.append(d) or real(d, names))
    project_context_files(tmp_path, stop_at=tmp_path)
    project_context_files(tmp_path, stop_at=tmp_path)
    assert probes == [tmp_path, tmp_path]
    monkeypatch.setattr(prompt_module, "_now_ns", lambda: changed + 2 * prompt_module.SETTLED_NS)
    project_context_files(tmp_path, stop_at=tmp_path)  # still now: remembered from here on
    project_context_files(tmp_path, stop_at=tmp_path)
    assert probes == [tmp_path, tmp_path, tmp_path]


def test_default_reads_are_inlined_missing_ones_noted(tmp_path: Path) -> None:
    (tmp_path / "SPEC.md").write_text("the spec")
    (tmp_path / "big.txt").write_text("x" * 100_000)
    card = dataclasses.replace(CARD, default_reads=("SPEC.md", "missing.md", "big.txt"))
    parts = compose_system_prompt(card, cwd=tmp_path, stop_at=tmp_path)
    assert "# SPEC.md\n\nthe spec" in parts.text
    assert any("missing.md does not exist" in n for n in parts.notes)
    assert "truncated at" in parts.text and len(parts.text) < 90_000


@pytest.mark.parametrize(
    "entry", ["/etc/passwd", "~/.ssh/id_rsa", "../secret.txt", "docs/../../x", "a\\..\\b"]
)
def test_default_reads_outside_the_checkout_are_card_errors(entry: str) -> None:
    # a project card may come from a cloned repo: it must not pull files from outside it into a prompt
    raw = f"---\nname: w\ndefaultReads: [{json.dumps(entry)}]\n---\nbody".encode()
    with pytest.raises(CardError, match=r"defaultReads\[0\]: must be a path relative") as info:
        parse_card(raw, path="/c/w.md")
    assert info.value.line == 3


def test_a_default_read_symlinked_out_of_the_checkout_is_not_read(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "link.txt").symlink_to(outside / "secret.txt")
    card = dataclasses.replace(CARD, default_reads=("link.txt",))
    parts = compose_system_prompt(card, cwd=checkout, stop_at=checkout)
    assert "TOP SECRET" not in parts.text
    assert any("outside the working directory" in n for n in parts.notes)


def test_child_budget_only_tightens() -> None:
    s = build_settings([{}])  # legion.maxDepth 4
    lead = dataclasses.replace(
        CARD,
        name="centurion",
        max_subagent_depth=2,
        allow_nested_subagents=True,
        tool_budget=10,
        turn_budget=20,
        tool_timeout_ms=3000,
    )
    b = child_budget(lead, s, child_depth=1)
    assert (b.max_depth, b.allow_nested, b.tool_budget, b.turn_budget, b.tool_timeout_ms) == (
        2,
        True,
        10,
        20,
        3000,
    )
    member = child_budget(
        dataclasses.replace(CARD, allow_nested_subagents=True), s, child_depth=2, parent_max_depth=b.max_depth
    )
    assert (member.max_depth, member.allow_nested) == (1, False)
    loose = child_budget(
        dataclasses.replace(CARD, max_subagent_depth=9), s, child_depth=1, parent_max_depth=3
    )
    assert loose.max_depth == 2  # a card never loosens what the parent has left
    with pytest.raises(LaunchRefused) as info:
        child_budget(CARD, s, child_depth=2, parent_max_depth=1, parent="lead")
    assert info.value.code == "BUDGET_EXCEEDED" and "'lead' cannot launch 'worker'" in str(info.value)
    with pytest.raises(LaunchRefused):
        child_budget(CARD, s, child_depth=5)
    util = child_budget(
        dataclasses.replace(CARD, utility=True, allow_nested_subagents=True), s, child_depth=1
    )
    assert (util.max_depth, util.allow_nested) == (1, False)


def test_max_depth_is_capped_at_the_hard_ceiling() -> None:
    """Issue 21 item 17: legion.maxDepth above 4 is capped (docs/spec-conformance.md §2.4), with a warning text."""
    assert depth_cap(build_settings([{"legion": {"maxDepth": 3}}])) == (3, None)
    deep = build_settings([{"legion": {"maxDepth": 10}}])
    cap, warning = depth_cap(deep)
    assert cap == MAX_DEPTH_CEILING == 4 and warning is not None and "legion.maxDepth 10 exceeds" in warning
    assert child_budget(CARD, deep, child_depth=1).max_depth == 4  # generations 1..4 below the root
    assert child_budget(CARD, deep, child_depth=4).max_depth == 1
    with pytest.raises(LaunchRefused) as info:
        child_budget(CARD, deep, child_depth=5, parent="d4")
    assert info.value.code == "BUDGET_EXCEEDED" and "capped at the hard ceiling 4" in str(info.value)
    assert info.value.details == {"scope": "depth", "depth": 5, "requestedMaxDepth": 10, "effectiveMaxDepth": 4}


def test_restart_policy_falls_back_to_supervision_settings() -> None:
    s = build_settings([{"supervision": {"maxRestarts": 5}}])
    assert restart_policy(CARD, s) == restart_policy(CARD, s)
    p = restart_policy(CARD, s)
    assert (p.restart, p.max_restarts, p.restart_period_ms) == ("transient", 5, 60_000)
    p = restart_policy(
        dataclasses.replace(CARD, restart="temporary", max_restarts=0, restart_period_ms=1000), s
    )
    assert (p.restart, p.max_restarts, p.restart_period_ms) == ("temporary", 0, 1000)


def test_child_budget_feeds_the_workers_budget() -> None:
    context = pytest.importorskip("legion.workers.context")
    b = child_budget(CARD, build_settings([{}]), child_depth=1)
    budget = context.Budget(**dataclasses.asdict(b))
    assert budget.max_depth == b.max_depth
