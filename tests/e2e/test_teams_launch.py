"""Team launches with real git: worktree refusals leave nothing behind, the bootstrap runs in the worktree
(and a failing one undoes it), a non-centurion's phase request is refused, and card acceptance criteria
with a `command` run on a terminal collect (also for a child that failed)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import yaml

from legion.cli.rebuild import _rebuild as rebuild_steps
from legion.ledger import open_ledger
from legion.orchestration.run import RunOptions, execute, prepare_run
from legion.supervision.root import RootSupervisor
from tests.e2e.teams_support import GIT_ENV, call, git, model, project, run, wait, worker_script
from tests.support import until


def launch_alpha() -> dict[str, Any]:
    return {"turns": [call("subagent", action="launch", agent="centurion", name="alpha", task="t",
                           model=model("alpha"), phases="default"), {"text": "root done"}],
            "default": {"text": "root: noted"}}


ALPHA = {"turns": [{"text": "alpha here"}]}


def tool_results(transcript: Path) -> list[str]:
    texts = []
    for line in transcript.read_text().splitlines():
        msg = json.loads(line).get("message") or {}
        if msg.get("role") == "toolResult":
            texts.append("".join(p.get("text", "") for p in msg.get("content", [])))
    return texts


def assert_nothing_left(root: Path, run_dir: Path) -> None:
    assert not (run_dir / "worktrees" / "alpha").exists()
    assert not git(root, "branch", "--list", "legion/*")
    with open_ledger(run_dir / "legion.db") as led:
        assert led.get_node("alpha") is None


def test_a_dirty_project_refuses_the_team_and_creates_nothing(short_tmp: Path) -> None:
    root = project(short_tmp, {"root": launch_alpha(), "alpha": ALPHA})
    (root / "scripted" / "alpha.yaml").write_text(yaml.safe_dump({"turns": ["changed"]}))
    result = run(root)
    [reply] = tool_results(result.run_dir / "root.jsonl")
    assert "✗ alpha: WORKTREE_REFUSED: 'alpha' needs a git worktree: the project" in reply
    assert "uncommitted changes to tracked files (scripted/alpha.yaml)" in reply and "Commit or stash" in reply
    assert_nothing_left(root, result.run_dir)


def test_a_project_that_is_not_a_git_repository_refuses_the_team(short_tmp: Path) -> None:
    root = short_tmp / "p"
    (root / "scripted").mkdir(parents=True)
    for name, script in {"root": launch_alpha(), "alpha": ALPHA}.items():
        (root / "scripted" / f"{name}.yaml").write_text(yaml.safe_dump(script))
    result = run(root)
    [reply] = tool_results(result.run_dir / "root.jsonl")
    assert "WORKTREE_REFUSED: 'alpha' needs a git worktree: the project" in reply and "is not a git repository" in reply
    assert not (result.run_dir / "worktrees").exists()


def test_the_bootstrap_runs_in_the_worktree(short_tmp: Path) -> None:
    settings = {"legion": {"worktreeBootstrap": "pwd > BOOT.txt"}}
    root = project(short_tmp, {"root": launch_alpha(), "alpha": ALPHA}, settings)
    result = run(root)
    wt = result.run_dir / "worktrees" / "alpha"
    assert (wt / "BOOT.txt").read_text().strip() == os.path.realpath(wt)
    with open_ledger(result.run_dir / "legion.db") as led:
        assert led.get_node("alpha")["worktree_path"] == str(wt)
    # a lost ledger rebuilt from run.json and the launch records: `legion rebuild`'s own steps (the command itself
    # refuses a live run, and this run's root is this test's process) restore the team's worktree
    (result.run_dir / "legion.db").rename(result.run_dir / "lost.db")
    report = rebuild_steps(result.run_dir, json.loads((result.run_dir / "run.json").read_text()))
    assert report.nodes == 2 and not [w for w in report.warnings if "alpha" in w], report.warnings
    with open_ledger(result.run_dir / "legion.db") as led:
        assert led.get_node("alpha")["worktree_path"] == str(wt)


def test_a_failing_bootstrap_refuses_the_team_and_undoes_the_worktree(short_tmp: Path) -> None:
    settings = {"legion": {"worktreeBootstrap": "echo no dependencies here; exit 3"}}
    root = project(short_tmp, {"root": launch_alpha(), "alpha": ALPHA}, settings)
    result = run(root)
    [reply] = tool_results(result.run_dir / "root.jsonl")
    assert "worktreeBootstrap `echo no dependencies here; exit 3` exited 3" in reply
    assert "no dependencies here" in reply
    assert_nothing_left(root, result.run_dir)


CHECKER = """---
name: checker
description: Writes a file; its acceptance criteria are commands run on a terminal collect.
kind: native
tools: [bash]
acceptance:
  level: attested
  role: writer
  criteria:
    - {description: a.txt exists, command: test -f a.txt}
    - {description: a.txt says A, command: grep -q A a.txt}
    - the prose is clear
---
You write files.
"""


def test_acceptance_commands_run_on_a_terminal_collect_also_for_a_failed_child(short_tmp: Path) -> None:
    scripts = {
        "root": {"turns": [call("subagent", action="launch", tasks=[
            {"agent": "checker", "name": "good", "task": "t", "model": model("good")},
            {"agent": "checker2", "name": "bad", "task": "t", "model": model("bad")},
            {"agent": "checker", "name": "slow", "task": "t", "model": model("hang")}]),
            wait("good", "bad"), call("subagent", action="collect", name="good"),
            call("subagent", action="collect", name="bad"),
            call("subagent", action="collect", name="slow", timeoutMs=200),
            call("subagent", action="retire", name="slow", force=True), {"text": "root done"}]},
        "hang": {"turns": [{"hang": True}]},
        "good": worker_script("a.txt", "A"),
        "bad": {"turns": [{"error": "the model failed"}], "default": {"error": "the model failed"}},
    }
    root = project(short_tmp, scripts)
    (root / ".legion" / "agents").mkdir(parents=True)
    (root / ".legion" / "agents" / "checker.md").write_text(CHECKER)
    (root / ".legion" / "agents" / "checker2.md").write_text(
        CHECKER.replace("name: checker", "name: checker2").replace("test -f a.txt", "ls b.txt"))
    result = run(root)
    replies = tool_results(result.run_dir / "root.jsonl")
    good, bad, slow = replies[2], replies[3], replies[4]
    assert "acceptance: verified (2/2 command(s) green" in good
    # ran although the child reported failure; b.txt does not exist, so a failing command rejects
    assert "acceptance: rejected (1/2 command(s) green" in bad and "outcome failed" in bad
    # the failing command is quoted by its output's tail, not only counted
    assert "✗ a.txt exists (`ls b.txt`): exit 2" in bad and "No such file or directory" in bad, bad
    # a criterion without a command is the caller's to check: listed as pending
    for reply in (good, bad):
        assert "acceptance checklist (no command: check these yourself):\n- [ ] the prose is clear" in reply, reply
    assert (result.run_dir / "acceptance" / "good" / "r1" / "1.log").is_file()
    assert slow.startswith("collect timed out") and "acceptance" not in slow  # a timed-out collect runs nothing
    assert not (result.run_dir / "acceptance" / "slow").exists()


def test_a_phase_request_from_a_non_centurion_is_refused(short_tmp: Path) -> None:
    scripts = {"root": {"turns": [call("subagent", action="launch", agent="worker", name="w1", task="t",
                                       model=model("hang")),
                                  call("subagent", action="wait", names=["w1"], timeoutMs=30_000),
                                  {"text": "root done"}]},
               "hang": {"turns": [{"hang": True}]}}
    root = project(short_tmp, scripts)
    holder: list[RootSupervisor] = []

    async def scenario() -> dict[str, Any]:
        opts = RunOptions(task="t", cwd=root, model=model("root"), timeout=60, env={**os.environ, **GIT_ENV})
        task = asyncio.ensure_future(execute(prepare_run(opts), on_root=holder.append, install_signals=False))
        await until(lambda: holder and holder[0].nodes.tool_handler is not None and holder[0].nodes.session_state("w1") == "running",
                    20, "w1 running")
        nodes = holder[0].nodes
        assert nodes.tool_handler is not None
        reply = await nodes.tool_handler("w1", "legion_phase", {"to": "done"})
        await nodes.tool_handler("root", "subagent", {"action": "retire", "name": "w1", "force": True})
        await task
        return reply

    reply = asyncio.run(scenario())
    assert reply["ok"] is False and reply["code"] == "centurion_required"
    assert reply["text"] == ("centurion_required: legion_phase is for a centurion whose launch declared a phase "
                             "machine; 'w1' (worker) has none")
