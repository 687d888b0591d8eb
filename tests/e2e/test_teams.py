"""Teams end to end (issue 10): root → centurion in a git worktree → planner/workers/reviewer, the default
phase machine, verification and branch delivery, with scripted models and real git, on each ledger backend."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from legion.runs import open_run_ledger
from tests.e2e.teams_support import git, happy_scripts, project, run


def phase_events(run_dir: Path, node: str) -> list[dict]:
    with contextlib.closing(open_run_ledger(run_dir)) as led:
        return [e.data for e in led.events_after(0, node_id=node) if e.type == "phase_change"]


def test_default_machine_end_to_end_delivers_the_branch(short_tmp: Path, ledger_url: str | None) -> None:
    root = project(short_tmp, happy_scripts())
    result = run(root, ledger=ledger_url)
    assert result.exit_code == 0, (result.status, result.detail)
    moves = [(e["from"], e["to"]) for e in phase_events(result.run_dir, "alpha") if "rejected" not in e
             and "verification" not in e]
    assert moves == [("planning", "implementing"), ("implementing", "reviewing"), ("reviewing", "verifying"),
                     ("verifying", "done")]
    [branch] = result.branches
    sha = git(root, "rev-parse", f"refs/heads/{branch['branch']}")
    assert branch["sha"] == sha and branch["branch"].startswith("legion/alpha-")
    files = git(root, "ls-tree", "-r", "--name-only", branch["branch"]).splitlines()
    assert {"a.txt", "b.txt", "CONTRACT.md"} <= set(files)
    assert git(root, "rev-list", "--count", f"main..{branch['branch']}") == "1"
    wt = result.run_dir / "worktrees" / "alpha"
    assert wt.is_dir()  # kept after the run
    collected = tool_results(result.run_dir / "root.jsonl")[-1]
    assert f"branch {branch['branch']} at {sha} (read from git)" in collected
    assert "delivered" in collected  # the centurion's answer after the collection prompt
    alpha = [m for m in messages(result.run_dir / "alpha.jsonl") if m.get("role") == "user"]
    assert "verification is green and the team is DONE" in str(alpha[-1]["content"])
    assert f"branch {branch['branch']}" in str(alpha[-1]["content"]) and "Do not merge" in str(alpha[-1]["content"])


def messages(transcript: Path) -> list[dict]:
    return [m for line in transcript.read_text().splitlines() if (m := json.loads(line).get("message"))]


def tool_results(transcript: Path) -> list[str]:
    return ["".join(p.get("text", "") for p in m.get("content", [])) for m in messages(transcript)
            if m.get("role") == "toolResult"]
