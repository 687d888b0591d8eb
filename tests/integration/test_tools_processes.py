"""Tools whose work is real processes: bash process groups killed on timeout and cancellation, the file tools' warm helper process and its deadlines."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from legion.procs import alive, group_exists, snapshot_groups
from legion.workers.context import Budget, SessionContext
from legion.workers.tools.base import ToolContext, run_tool
from legion.workers.tools.catalog import all_tools
from tests.support import pid_alive, until

TOOLS = all_tools()


def ctx_for(tmp_path: Path, **kw: Any) -> ToolContext:
    return ToolContext(SessionContext(node_id="n1", cwd=str(tmp_path), **kw), tmp_path / "out")


async def call(name: str, args: Any, ctx: ToolContext) -> tuple[str, bool]:
    r = await run_tool(TOOLS[name], args, ctx)
    return r.text, r.is_error


async def test_bash_runs_in_own_process_group(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path, env={"FOO": "bar"})
    text, err = await call("bash", {"command": "echo $FOO $LEGION_NODE_ID; ps -o pgid= -p $$; pwd"}, ctx)
    assert not err
    lines = text.split()
    assert lines[0:2] == ["bar", "n1"] and int(lines[2]) != os.getpgrp() and lines[3] == str(tmp_path)
    text, err = await call("bash", {"command": "echo oops >&2; exit 3"}, ctx)
    assert err and "oops" in text and "[exit code 3]" in text


async def test_bash_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path, budget=Budget(tool_timeout_ms=300))
    pidfile = tmp_path / "child.pid"
    start = time.monotonic()
    text, err = await call("bash", {"command": f"sleep 30 & echo $! > {pidfile}; wait"}, ctx)
    assert err and "timed out after 0.3 s" in text and time.monotonic() - start < 10
    child = int(pidfile.read_text())
    await until(lambda: not pid_alive(child), 5, f"the timed-out command's child {child} dead")
    assert alive(snapshot_groups(ctx.pgids)) == []  # at most zombies awaiting their reaper remain


async def test_bash_background_child_keeps_pgid_registered(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    text, err = await call("bash", {"command": "sleep 30 >/dev/null 2>&1 & echo started"}, ctx)
    assert not err and "started" in text
    assert len(ctx.pgids) == 1
    pgid = next(iter(ctx.pgids))
    assert group_exists(pgid)
    os.killpg(pgid, 9)


async def test_bash_cancellation_kills_group(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    pidfile = tmp_path / "p"
    task = asyncio.create_task(call("bash", {"command": f"echo $$ > {pidfile}; sleep 30"}, ctx))
    budget = time.monotonic() + 10  # one budget for the start and the kill
    await until(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, "the command's pid file")
    pid = int(pidfile.read_text())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: not pid_alive(pid), max(0.01, budget - time.monotonic()), f"the cancelled command {pid} dead")


async def test_bash_cancellation_kills_grandchildren(tmp_path: Path) -> None:
    """An abort kills the command's whole process group: children and grandchildren, not just bash."""
    ctx = ctx_for(tmp_path)
    gpid = tmp_path / "g"
    cmd = f"bash -c 'sleep 60 & echo $! > {gpid}.tmp; mv {gpid}.tmp {gpid}; wait' & wait"
    task = asyncio.create_task(call("bash", {"command": cmd}, ctx))
    await until(lambda: gpid.exists() or task.done(), 10, "the grandchild's pid file")
    assert not task.done()
    grandchild = int(gpid.read_text())
    assert pid_alive(grandchild)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # its own deadline: the start may have used most of the first one on a loaded machine
    await until(lambda: not pid_alive(grandchild), 10, f"the grandchild {grandchild} dead")


def _group_alive(pgid: int) -> bool:
    return pid_alive(pgid)  # the helper leads its group alone


async def test_file_tools_reuse_one_warm_helper_and_close_it(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    (tmp_path / "f.txt").write_text("x\n")
    await call("read", {"path": "f.txt"}, ctx)
    (pgid,) = ctx.pgids  # registered while it lives: a session retire (and the root's sweep) reaches it
    for name, args in (("grep", {"pattern": "x"}), ("ls", {}), ("find", {"pattern": "*"}),
                       ("write", {"path": "g.txt", "content": "y"}), ("edit", {"path": "g.txt", "oldText": "y", "newText": "z"})):
        text, err = await call(name, args, ctx)
        assert not err, (name, text)
    assert ctx.pgids == {pgid} and ctx.executor.helpers == 1 and _group_alive(pgid)
    await ctx.executor.aclose()
    assert not ctx.pgids and ctx.executor.helpers == 0 and not _group_alive(pgid)


async def test_an_aborted_grep_kills_its_helper_at_once(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    (tmp_path / "hay.txt").write_text("a" * 40_000 + "b\n")  # `(a|aa)+$` backtracks on it without end
    task = asyncio.ensure_future(call("grep", {"pattern": "(a|aa)+$", "path": "hay.txt"}, ctx))
    budget = time.monotonic() + 20  # one budget for the start and the kill
    await until(lambda: ctx.pgids or task.done(), 20, "the grep's helper process group", interval=0.01)
    assert not task.done()
    (pgid,) = ctx.pgids
    await asyncio.sleep(0.2)  # the search is under way
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: not ctx.pgids and not _group_alive(pgid), max(0.01, budget - time.monotonic()),
                "the aborted grep's helper group gone", interval=0.01)
    text, err = await call("grep", {"pattern": "b$", "path": "hay.txt"}, ctx)  # a new helper serves the next call
    assert not err and text.startswith("hay.txt:1: ")
    await ctx.executor.aclose()


async def test_a_backtracking_grep_is_killed_at_its_deadline(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path, budget=Budget(tool_timeout_ms=500))
    (tmp_path / "hay.txt").write_text("a" * 40_000 + "b\n")
    start = time.monotonic()
    text, err = await call("grep", {"pattern": "(a|aa)+$", "path": "hay.txt"}, ctx)
    took = time.monotonic() - start
    assert err and text.startswith("grep: the search did not stop at its 0.5 s deadline and was killed"), text
    assert 0.5 <= took < 10, took
    await ctx.executor.aclose()


async def test_an_idle_helper_is_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from legion.workers.tools import executor

    monkeypatch.setattr(executor, "IDLE_SECONDS", 0.2)
    ctx = ctx_for(tmp_path)
    await call("ls", {}, ctx)
    (pgid,) = ctx.pgids
    await until(lambda: not ctx.pgids and not _group_alive(pgid), 10, "the idle helper closed and its group gone")
    _, err = await call("ls", {}, ctx)  # and a new one starts for the next call
    assert not err
    await ctx.executor.aclose()


async def test_a_helper_that_died_idle_is_replaced(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    await call("ls", {}, ctx)
    (pgid,) = ctx.pgids
    os.killpg(pgid, 9)  # e.g. the OOM killer
    text, err = await call("ls", {}, ctx)  # a dead idle helper is replaced before use
    assert not err, text
    await ctx.executor.aclose()
