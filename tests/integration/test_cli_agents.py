"""`legion agents` as a process: the listing shows every card, and a broken card makes the command fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _card(directory: Path, filename: str, front: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / filename).write_text(f"---\n{front.strip()}\n---\nYou do the thing.\n", encoding="utf-8")


def test_legion_agents_exits_non_zero_when_a_card_failed(tmp_path: Path) -> None:
    """The listing still shows every card, but a broken one makes the command fail (scripts notice)."""
    env = {"HOME": str(tmp_path / "home")}  # a HOME private to the test (never os.environ)
    project = tmp_path / "proj"
    (project / ".legion" / "agents").mkdir(parents=True)
    (tmp_path / "home").mkdir()
    run = [sys.executable, "-m", "legion", "-C", str(project), "agents", "project"]
    ok = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env | {"PATH": "/usr/bin:/bin"})
    assert ok.returncode == 0, ok.stderr
    _card(project / ".legion" / "agents", "typo.md", "name: typo\nmodle: openai/x")
    bad = subprocess.run(run, capture_output=True, text=True, timeout=60, env=env | {"PATH": "/usr/bin:/bin"})
    assert bad.returncode == 1 and "typo" in bad.stdout and "did you mean 'model'?" in bad.stdout
    assert "1 card file(s) failed to load" in bad.stderr
