"""Team worktrees with real git (docs/spec-conformance.md §2.7): refusals, creation, its record, gc of merged branches."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from legion.orchestration.worktree import (
    WorktreeError,
    branch_nonce,
    create_worktree,
    gc_apply,
    gc_plan,
    plan_worktree,
    remove_worktree,
    team_worktree,
)

ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e.x", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@e.x"}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=ENV).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "f.txt").write_text("1\n")
    (root / ".gitignore").write_text(".legion/\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    return root


def run_dir(repo: Path, run_id: str = "r1") -> Path:
    path = repo / ".legion" / "runs" / run_id
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_not_a_git_repository_is_refused(tmp_path: Path) -> None:
    with pytest.raises(WorktreeError, match=r"is not a git repository.*git init"):
        plan_worktree(tmp_path, tmp_path / "run", "r1", "alpha")


def test_a_repository_without_a_commit_is_refused(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    with pytest.raises(WorktreeError, match="has no commit yet"):
        plan_worktree(tmp_path, tmp_path / "run", "r1", "alpha")


def test_uncommitted_tracked_changes_are_refused_untracked_files_are_not(repo: Path) -> None:
    (repo / "new.txt").write_text("untracked\n")
    plan_worktree(repo, run_dir(repo), "r1", "alpha")  # untracked (and .legion/) files do not matter
    (repo / "f.txt").write_text("2\n")
    with pytest.raises(WorktreeError, match=r"uncommitted changes to tracked files \(f.txt\).*Commit or stash"):
        plan_worktree(repo, run_dir(repo), "r1", "alpha")


def test_create_records_and_an_existing_branch_is_refused(repo: Path) -> None:
    rd = run_dir(repo)
    plan = plan_worktree(repo, rd, "r1", "alpha")
    assert plan.branch == f"legion/alpha-{branch_nonce('r1')}" and plan.path == rd / "worktrees" / "alpha"
    create_worktree(plan)
    assert (plan.path / "f.txt").read_text() == "1\n"
    assert git(plan.path, "rev-parse", "--abbrev-ref", "HEAD") == plan.branch
    assert team_worktree(rd, "alpha") == plan
    with pytest.raises(WorktreeError, match="exists already"):
        plan_worktree(repo, rd, "r1", "alpha")
    remove_worktree(plan)
    assert not plan.path.exists() and team_worktree(rd, "alpha") is None
    assert not git(repo, "branch", "--list", plan.branch)


def test_gc_removes_only_merged_worktrees_of_finished_runs(repo: Path) -> None:
    merged_rd, open_rd, live_rd = run_dir(repo, "a"), run_dir(repo, "b"), run_dir(repo, "c")
    plans = {}
    for rd, name in ((merged_rd, "m"), (open_rd, "o"), (live_rd, "l")):
        plans[name] = plan_worktree(repo, rd, rd.name, name)
        create_worktree(plans[name])
        (plans[name].path / f"{name}.txt").write_text(name)
        git(plans[name].path, "add", "-A")
        git(plans[name].path, "commit", "-qm", name)
    git(repo, "merge", "-q", "--ff-only", plans["m"].branch)
    git(repo, "merge", "-q", "--no-edit", plans["l"].branch)
    items = gc_plan(repo, [merged_rd, open_rd, live_rd], live={live_rd})
    actions = {i.path.name: (i.action, i.why) for i in items}
    assert actions == {"m": ("remove", "merged into main"), "o": ("keep", "not merged into main"),
                       "l": ("keep", "its run is live")}
    lines = gc_apply(repo, items, branches=True)
    assert lines == [f"removed {plans['m'].path}", f"deleted branch {plans['m'].branch}"]
    assert not plans["m"].path.exists() and plans["o"].path.exists() and plans["l"].path.exists()
    assert not git(repo, "branch", "--list", plans["m"].branch) and git(repo, "branch", "--list", plans["o"].branch)


def test_legion_gc_command_dry_run_then_remove(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from legion.cli import main

    rd = run_dir(repo, "done-run")
    plan = plan_worktree(repo, rd, rd.name, "m")
    create_worktree(plan)  # no commits: its branch is merged trivially
    assert main(["-C", str(repo), "gc", "--dry-run"]) == 0
    assert f"would remove {plan.path} [{plan.branch}]: merged into main" in capsys.readouterr().out
    assert plan.path.exists()
    assert main(["-C", str(repo), "gc", "--branches"]) == 0
    out = capsys.readouterr().out
    assert f"removed {plan.path}" in out and f"deleted branch {plan.branch}" in out
    assert not plan.path.exists()
