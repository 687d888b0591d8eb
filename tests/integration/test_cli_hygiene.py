"""Project hygiene (README "Configuration"): git ignores `.legion/` through its own `.gitignore` (the user's is
never touched), and a run's housekeeping says which old runs it removed — or keeps them with retentionDays 0."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_support import legion, project

USER_IGNORE = "*.log\nbuild/\n"


@pytest.fixture
def repo() -> Iterator[Path]:
    with project() as path:
        (path / ".gitignore").write_text(USER_IGNORE)
        subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
        yield path


def _untracked(path: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=all"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return [line[3:] for line in out.splitlines()]


def test_init_makes_git_ignore_legion_state(repo: Path) -> None:
    out = legion(repo, "init")
    assert out.returncode == 0, out.stderr
    assert (repo / ".legion" / ".gitignore").read_text().splitlines()[-1] == "*"
    assert not [p for p in _untracked(repo) if p.startswith(".legion")], _untracked(repo)
    assert (repo / ".gitignore").read_text() == USER_IGNORE


def test_the_first_run_makes_git_ignore_legion_state(repo: Path) -> None:
    out = legion(repo, "run", "say hi", "--model", "scripted/echo")
    assert out.returncode == 0, out.stderr
    assert (repo / ".legion" / "runs").is_dir()
    assert not [p for p in _untracked(repo) if p.startswith(".legion")], _untracked(repo)
    assert (repo / ".gitignore").read_text() == USER_IGNORE


def _old_run(repo: Path, name: str, days: float) -> Path:
    """A finished run directory last touched `days` ago whose owner is long gone."""
    run = repo / ".legion" / "runs" / name
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"runId": name, "status": "settled",
                                              "owner": {"pid": 999999, "createTime": 1.0}}))  # fmt: skip
    old = time.time() - days * 86400
    for p in (run / "run.json", run):
        os.utime(p, (old, old))
    return run


def test_housekeeping_says_what_it_removed(repo: Path) -> None:
    old = _old_run(repo, "20200101-000000-aaaaaa", 30)
    recent = _old_run(repo, "20200102-000000-bbbbbb", 1)
    out = legion(repo, "run", "say hi", "--model", "scripted/echo", "--run-id", "now")
    assert out.returncode == 0, out.stderr
    assert not old.exists() and recent.exists()
    line = "housekeeping removed 1 run directory idle for more than 14 days"
    assert line in out.stderr and old.name in out.stderr and "retentionDays" in out.stderr, out.stderr
    log = (repo / ".legion" / "runs" / "now" / "legion.log").read_text()
    assert line in log and old.name in log


def test_retention_days_zero_keeps_every_run(repo: Path) -> None:
    (repo / ".legion").mkdir()
    (repo / ".legion" / "settings.json").write_text(json.dumps({"retentionDays": 0}))
    old = _old_run(repo, "20200101-000000-aaaaaa", 3000)
    out = legion(repo, "run", "say hi", "--model", "scripted/echo")
    assert out.returncode == 0, out.stderr
    assert old.exists() and "housekeeping" not in out.stderr
