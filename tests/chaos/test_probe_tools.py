"""Hostile tool calls (issue 13): background jobs in ``bash``, FIFOs and special files for every file tool.

Every case goes through ``run_tool`` with a real ``ToolContext`` on real files and processes; the sweep
is the one a session's dispose runs (``sweep_groups_async`` over ``ToolContext.pgids``).
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from legion.ledger.ledger import open_ledger
from legion.procs import ProcRef, alive, sweep_groups_async
from legion.workers.context import Budget, SessionContext
from legion.workers.guard import Guard
from legion.workers.tools import bash
from legion.workers.tools.base import ToolContext, ToolResult, run_tool
from legion.workers.tools.catalog import all_tools
from tests.support import poller

TOOLS = all_tools()
until = poller(10.0, 0.02)


def ctx_for(tmp_path: Path, **kw: Any) -> ToolContext:
    return ToolContext(SessionContext(node_id="probe", cwd=str(tmp_path), **kw), tmp_path / "out")


async def call(name: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    return await run_tool(TOOLS[name], args, ctx)


def _alive(pid: int) -> bool:
    ref = ProcRef.from_pid(pid)
    return ref is not None and bool(alive([ref]))


async def _swept(ctx: ToolContext, *pids: int) -> None:
    """The session's sweep ends every process the calls left behind."""
    assert await sweep_groups_async(set(ctx.pgids)) == []
    await until(lambda: not any(_alive(p) for p in pids), message=f"{pids} gone after the sweep")


# ---- bash: background jobs ------------------------------------------------------------------------


async def test_background_job_does_not_hold_the_call(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path)
    for _ in range(3):
        start = time.monotonic()
        r = await call("bash", {"command": "sleep 5 & echo hi"}, ctx)
        assert time.monotonic() - start < 2.5, "the call waited for the background job"
        assert not r.is_error and r.text.startswith("hi") and "background process" in r.text
    pids = r.details["background"] if r.details else []
    assert len(pids) == 1 and _alive(pids[0])
    await _swept(ctx, *pids)


async def test_background_job_under_a_timeout_is_not_a_timeout(tmp_path: Path) -> None:
    ctx = ctx_for(tmp_path, budget=Budget(tool_timeout_ms=3000))
    start = time.monotonic()
    r = await call("bash", {"command": "sleep 30 & echo started"}, ctx)
    assert time.monotonic() - start < 2.5
    assert not r.is_error and "timed out" not in r.text and "started" in r.text
    assert r.details is not None and r.details["exitCode"] == 0
    (pid,) = r.details["background"]
    assert f"{pid} sleep 30" in r.text and _alive(pid) and ctx.pgids
    await _swept(ctx, pid)


async def test_chatty_background_job_keeps_running_and_is_swept(tmp_path: Path) -> None:
    """A dev server writing logs after the call returned is neither killed by a closed pipe nor captured."""
    ctx = ctx_for(tmp_path)
    beat = tmp_path / "beat"
    cmd = f"(while true; do echo tick; date +%s%N > {beat}; sleep 0.02; done) & echo up"
    r = await call("bash", {"command": cmd}, ctx)
    assert not r.is_error and "up" in r.text.splitlines() and r.details is not None  # (a tick may come first)
    pids = r.details["background"]
    assert pids and "discarded" in r.text
    first = beat.read_text() if beat.exists() else ""
    await until(lambda: beat.exists() and beat.read_text() != first, message="the job still writes")
    assert _alive(pids[0])
    await _swept(ctx, *pids)


async def test_setsid_background_job_is_tracked_for_the_sweep(tmp_path: Path) -> None:
    """A job that leaves the command's process group (setsid) but holds its output is found and swept."""
    ctx = ctx_for(tmp_path)
    r = await call("bash", {"command": "setsid sleep 30 & echo detached"}, ctx)
    assert not r.is_error and r.details is not None
    (pid,) = r.details["background"]
    ref = ProcRef.from_pid(pid)
    assert ref is not None and ref.pgid in ctx.pgids
    await _swept(ctx, pid)


async def test_a_default_tool_timeout_bounds_a_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no toolTimeoutMs anywhere, a command that never exits still ends (``DEFAULT_TIMEOUT_S``)."""
    assert bash.effective_timeout(None, None) == bash.DEFAULT_TIMEOUT_S
    assert bash.effective_timeout(5, None) == 5 and bash.effective_timeout(None, 2000) == 2
    assert bash.effective_timeout(9, 2000) == 2
    monkeypatch.setattr(bash, "DEFAULT_TIMEOUT_S", 0.5)
    ctx = ctx_for(tmp_path)
    start = time.monotonic()
    r = await call("bash", {"command": "sleep 30"}, ctx)
    assert r.is_error and "timed out after 0.5 s" in r.text and time.monotonic() - start < 5


async def test_spill_file_is_capped_and_the_cut_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bash, "MAX_SPILL_BYTES", 1_000_000)
    ctx = ctx_for(tmp_path)
    r = await call("bash", {"command": "head -c 5000000 /dev/zero | tr '\\0' a; echo; echo END"}, ctx)
    assert r.text.splitlines()[-1] == "END" and r.details is not None and r.details["outputCut"]
    assert "cut at the" in r.text.splitlines()[0]
    log = Path(r.details["fullOutputPath"])
    assert log.stat().st_size < 1_000_000 + 1000
    assert "more bytes were not kept" in log.read_bytes()[-200:].decode()


# ---- file tools: FIFOs, sockets, devices -----------------------------------------------------------


@pytest.fixture
def fifo_dir(tmp_path: Path) -> Path:
    """A directory holding a FIFO nobody opens, a listening socket's file, and one regular text file."""
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "notes.txt").write_text("needle here\n")
    return tmp_path


async def _bounded(name: str, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """The call must end by itself: a blocked event loop would not even let wait_for fire."""
    start = time.monotonic()
    r = await asyncio.wait_for(call(name, args, ctx), 10)
    assert time.monotonic() - start < 5, f"{name} took {time.monotonic() - start:.1f} s"
    return r


@pytest.mark.parametrize(("tool", "args"), [
    ("read", {"path": "pipe"}),
    ("write", {"path": "pipe", "content": "x"}),
    ("edit", {"path": "pipe", "oldText": "a", "newText": "b"}),
    ("grep", {"pattern": "x", "path": "pipe"}),
])
async def test_file_tools_refuse_a_fifo(fifo_dir: Path, tool: str, args: dict[str, Any]) -> None:
    r = await _bounded(tool, args, ctx_for(fifo_dir))
    assert r.is_error and "FIFO" in r.text and "regular files" in r.text, r.text
    assert stat.S_ISFIFO(os.stat(fifo_dir / "pipe").st_mode)


async def test_write_refuses_a_socket_and_read_a_device(tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "sock"))
        server.listen()
        r = await _bounded("write", {"path": "sock", "content": "x"}, ctx_for(tmp_path))
        assert r.is_error and "not a regular file" in r.text
    r = await _bounded("read", {"path": "/dev/zero"}, ctx_for(tmp_path))
    assert r.is_error and "character device" in r.text


async def test_walks_skip_a_fifo(fifo_dir: Path) -> None:
    ctx = ctx_for(fifo_dir)
    r = await _bounded("grep", {"pattern": "needle"}, ctx)
    assert not r.is_error and r.text == "notes.txt:1: needle here"
    r = await _bounded("find", {"pattern": "*"}, ctx)
    assert not r.is_error and r.text == "notes.txt"
    r = await _bounded("ls", {}, ctx)
    assert r.text.splitlines() == ["notes.txt", "[1 special files (FIFOs, sockets, devices) not listed]"]


_ABORTED_GREP = """
import asyncio, sys
from legion.workers.context import SessionContext
from legion.workers.tools.base import ToolContext, run_tool
from legion.workers.tools.catalog import all_tools

async def main(root):
    ctx = ToolContext(SessionContext(node_id="p", cwd=root), __import__("pathlib").Path(root) / "out")
    task = asyncio.ensure_future(run_tool(all_tools()["grep"], {"pattern": "needle"}, ctx))
    await asyncio.sleep(0.3)
    task.cancel()
    print("aborted" if not task.done() else f"done: {task.result()!r}"[:2000], flush=True)

asyncio.run(main(sys.argv[1]))
"""


def test_an_aborted_grep_leaves_no_thread_that_holds_the_process(fifo_dir: Path) -> None:
    """The process exits after an abort: no tool thread is left blocked (asyncio.run joins them)."""
    for n in range(30):  # enough files that the walk is under way when the abort comes
        os.mkfifo(fifo_dir / f"pipe{n}")
    proc = subprocess.run([sys.executable, "-c", _ABORTED_GREP, str(fifo_dir)], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr


# ---- the ledger through another name ----------------------------------------------------------------


async def test_a_hard_link_to_the_ledger_is_refused(tmp_path: Path) -> None:
    """``ln legion.db hl`` then ``write hl`` must not overwrite the ledger (nor read, edit or grep it)."""
    run = tmp_path / "run"
    run.mkdir()
    ledger = open_ledger(run / "legion.db")
    ledger.close()
    os.link(run / "legion.db", tmp_path / "hl")
    before = (run / "legion.db").read_bytes()
    ctx = ctx_for(tmp_path, ledger_path=str(run / "legion.db"), run_dir=str(run))
    guard = Guard(ctx.session)
    for tool, args in (("write", {"path": "hl", "content": "gone"}), ("read", {"path": "hl"}),
                       ("edit", {"path": "hl", "oldText": "SQLite", "newText": "x"}),
                       ("grep", {"pattern": "SQLite", "path": "hl"})):
        assert "legion ledger" in (guard.check_tool(tool, args) or ""), tool
        r = await _bounded(tool, args, ctx)  # the tool refuses by itself too (a link made after the guard)
        assert r.is_error and "legion ledger" in r.text, (tool, r.text)
    r = await _bounded("grep", {"pattern": "SQLite"}, ctx)
    assert "hl" not in r.text
    assert (run / "legion.db").read_bytes() == before
    with open_ledger(run / "legion.db") as reopened:
        assert reopened.schema_version() >= 1


# ---- bounded in time, stopped by an abort ---------------------------------------------------------------


def _slow_haystack(root: Path) -> None:
    """Lines on which ``(a|b)*c`` backtracks: a grep over them takes minutes if nothing stops it."""
    (root / "hay.txt").write_text(("ab" * 40 + "\n") * 200_000)


async def test_grep_stops_at_its_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from legion.workers.tools import files

    _slow_haystack(tmp_path)
    monkeypatch.setattr(files, "MAX_TOOL_SECONDS", 0.3)
    r = await _bounded("grep", {"pattern": "(a|b)*c"}, ctx_for(tmp_path))
    assert not r.is_error and "search stopped after 0.3 s" in r.text


_ABORTED_SLOW_GREP = _ABORTED_GREP.replace('{"pattern": "needle"}', '{"pattern": "(a|b)*c"}')


def test_an_aborted_slow_grep_stops_its_thread(tmp_path: Path) -> None:
    """After an abort the worker thread stops at its next check: the process exits at once, not after
    the whole search (asyncio.run waits for the default executor's threads)."""
    _slow_haystack(tmp_path)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _ABORTED_SLOW_GREP, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "aborted", (proc.stdout, proc.stderr)
    assert time.monotonic() - start < 20  # the search alone takes minutes; this includes a loaded interpreter start
