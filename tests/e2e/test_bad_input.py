"""Bad input gets a clear error and loses nothing: at the command line (exit 2, nothing created) and from a
session's tool call (an error result naming the problem; the run goes on; a refused launch creates nothing)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from legion.orchestration.run import RunConfigError, execute
from legion.prepare import RunOptions, prepare_run
from tests.e2e.harness import (
    Project,
    call,
    kill_tree,
    launch,
    node_rows,
    project,
    subagent,
    tool_results,
    tools,
    user_texts,
)
from tests.support import wait_until

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def proj() -> Iterator[Project]:
    with project() as p:
        yield p


def no_runs(proj: Project) -> bool:
    runs = proj.dir / ".legion" / "runs"
    return not runs.exists() or not any(runs.iterdir())


def refused_launch_left_nothing(run: Path, name: str) -> None:
    assert name not in node_rows(run)
    assert not (run / f"{name}.jsonl").exists() and not (run / "artifacts" / name).exists()


# ----- the command line -------------------------------------------------------------------------

def test_a_task_file_that_does_not_exist(proj: Project) -> None:
    out = proj.run("@missing.txt", "--model", "scripted/echo")
    assert out.code == 2, out.explain()
    assert "cannot read the task file" in out.stderr and "missing.txt" in out.stderr
    assert out.stdout == "" and no_runs(proj)


@pytest.mark.parametrize(("task", "stdin"), [("", None), ("   \n", None), ("-", "")])
def test_an_empty_task(proj: Project, task: str, stdin: str | None) -> None:
    out = proj.run(task, "--model", "scripted/echo", stdin=stdin)
    assert out.code == 2, out.explain()
    assert "the task is empty" in out.stderr and no_runs(proj)


def test_a_task_from_a_file_and_from_stdin(proj: Project) -> None:
    """The good paths of the same arguments: @FILE and - reach the root as its first prompt."""
    (proj.dir / "task.txt").write_text("the task from a file\n")
    out = proj.run("@task.txt", "--model", "scripted/echo")
    assert out.code == 0, out.explain()
    out2 = proj.run("-", "--model", "scripted/echo", stdin="the task from stdin")
    assert out2.code == 0, out2.explain()
    assert user_texts(out.run_dir / "root.jsonl")[0].strip() == "the task from a file"
    assert user_texts(out2.run_dir / "root.jsonl")[0] == "the task from stdin"


@pytest.mark.parametrize("in_the_way", [".legion", ".legion/runs", ".legion/runs/taken"])
def test_an_unwritable_run_root(proj: Project, in_the_way: str) -> None:
    """Issue 21 item 17: a file where the run root's folder should be is exit 2 naming the path and the fix, not a
    NotADirectoryError traceback (or an unexplained settings error); nothing is created."""
    blocker = proj.dir / in_the_way
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a folder\n")
    out = proj.run("task", "--model", "scripted/echo", run_id="taken")
    assert out.code == 2, out.explain()
    assert f"{blocker} is a file, not a folder" in out.stderr and "rename or remove" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == "", out.stderr
    assert blocker.read_text() == "not a folder\n"


def test_a_run_root_broken_after_the_checks(proj: Project) -> None:
    """What `prepare_run` cannot foresee (here the folder replaced by a file after it checked) is still the same
    actionable error naming the path, not a traceback out of `execute`."""
    prepared = prepare_run(RunOptions(task="task", cwd=proj.dir, model="scripted/echo", env=dict(os.environ)))
    (proj.dir / ".legion").mkdir(exist_ok=True)
    (proj.dir / ".legion" / "runs").write_text("not a folder\n")
    with pytest.raises(RunConfigError) as info:
        asyncio.run(execute(prepared, install_signals=False))
    assert f"cannot create the run directory {prepared.run_dir}" in str(info.value), info.value
    assert "a folder you can write" in str(info.value), info.value


def test_an_unknown_root_agent(proj: Project) -> None:
    out = proj.run("task", "--agent", "wroker", "--model", "scripted/echo")
    assert out.code == 2, out.explain()
    assert "wroker" in out.stderr and "did you mean 'worker'" in out.stderr, out.stderr
    assert no_runs(proj)


@pytest.mark.slow
def test_a_run_directory_owned_by_a_live_root(proj: Project) -> None:
    kid = {"name": "h1", "agent": "worker", "task": "hang", "model": proj.script("h1", {"hang": True})}
    root = proj.script("root", launch(kid), subagent("wait"), {"text": "unreachable"})
    proc, run = proj.start("first", "--model", root, run_id="busy")
    try:
        wait_until(lambda: node_rows(run).get("h1", {}).get("status") == "running", 30, "the first run working")
        before = (run / "run.json").read_bytes(), sorted(p.name for p in run.iterdir())
        out = proj.run("second", "--model", "scripted/echo", run_id="busy")
        assert out.code == 2, out.explain()
        assert "busy" in out.stderr and "--run-id" in out.stderr, out.stderr
        assert ((run / "run.json").read_bytes(), sorted(p.name for p in run.iterdir())) == before
        assert proc.poll() is None and node_rows(run)["h1"]["status"] == "running"  # the live run is untouched
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    finally:
        kill_tree(proc)
    assert proc.returncode == 130


# ----- tool calls -------------------------------------------------------------------------------

def test_bad_tool_calls_get_clear_errors_and_the_run_goes_on(proj: Project) -> None:
    good = proj.script("good", {"text": "good result"})
    root = proj.script(
        "root",
        launch({"name": "typo", "agent": "wroker", "task": "x", "model": good}),           # unknown agent
        launch({"name": "notask", "agent": "worker"}),                                      # schema: no task
        tools(call("subagent", {"action": "launch", "task": "x", "agent": "worker", "colour": "red"})),
        {"tool_calls": [{"name": "subagent", "arguments_raw": "{\"action\": \"launch\", bad json"}]},
        subagent("launch", task="x"),                                                       # no agent
        subagent("explode"),                                                                # no such action
        subagent("steer", name="nobody", message="hi"),                                     # unknown child
        launch({"name": "ok", "agent": "worker", "task": "do it", "model": good}),
        subagent("wait"),
        {"text": "root done"})
    out = proj.run("bad calls", "--model", root)
    assert out.code == 0, out.explain()
    r = tool_results(out.run_dir / "root.jsonl")
    assert len(r) == 9, r
    assert "UNKNOWN_AGENT" in r[0] and "did you mean 'worker'" in r[0], r[0]
    assert "invalid arguments" in r[1] and "tasks[0].task" in r[1] and "missing" in r[1], r[1]
    assert "invalid arguments" in r[2] and "colour" in r[2], r[2]
    assert "arguments are not valid JSON" in r[3], r[3]
    assert "INVALID_PARAMS" in r[4] and "/agent" in r[4], r[4]
    assert "invalid arguments" in r[5] and "explode" in r[5], r[5]
    assert "UNKNOWN_CHILD" in r[6] and "no node named 'nobody'" in r[6], r[6]
    assert "▶ ok (worker)" in r[7] and "good result" in r[8]
    assert sorted(node_rows(out.run_dir)) == ["ok", "root"]
    for name in ("typo", "notask"):
        refused_launch_left_nothing(out.run_dir, name)


def test_acting_on_a_node_that_is_not_your_child(proj: Project) -> None:
    """Authority follows the tree: the root may not act on its grandchild, nor the middle node on its sibling."""
    proj.card("lead", tools=["read", "subagent"], allowNestedSubagents=True, maxSubagentDepth=2)
    grand = proj.script("g1", {"text": "grandchild result"})
    proj.script("m1", launch({"name": "g1", "agent": "worker", "task": "leaf work", "model": grand}),
                subagent("wait"), subagent("stop", name="m2"), {"text": "m1 done"})
    proj.script("m2", {"text": "m2 done"})
    root = proj.script("root",
                       launch({"name": "m1", "agent": "lead", "task": "lead", "model": "scripted/scripts/m1.yaml"},
                              {"name": "m2", "agent": "lead", "task": "lead", "model": "scripted/scripts/m2.yaml"}),
                       subagent("wait"),
                       subagent("collect", name="g1"),
                       subagent("steer", name="g1", message="go left"),
                       subagent("retire", name="g1"),
                       {"text": "root done"})
    out = proj.run("authority", "--model", root)
    assert out.code == 0, out.explain()
    r = tool_results(out.run_dir / "root.jsonl")
    for reply in r[2:5]:
        assert "NOT_YOUR_CHILD" in reply and "'g1' is not your child" in reply and "'m1'" in reply, reply
    m1 = tool_results(out.run_dir / "m1.jsonl")
    assert "NOT_YOUR_CHILD" in m1[2] and "'m2' is not your child" in m1[2], m1[2]
    rows = node_rows(out.run_dir)
    assert rows["g1"]["status"] == "settled" and rows["m2"]["status"] == "settled"  # nobody acted on them
    assert rows["g1"]["parent_id"] == "m1" and rows["g1"]["depth"] == 2
