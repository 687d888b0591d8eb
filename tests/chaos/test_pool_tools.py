"""One tool call must not freeze the other sessions of a pool (issue 19, item 4).

A real RootSupervisor with a real pool worker (fork server, control channel, hang detection at 3 x 0.5 s
of heartbeat silence), scripted sessions, real files: a grep that backtracks without end, reads of files
that block, and a scripted model whose script is a FIFO. Each fault runs ``ROUNDS`` times; meanwhile
other sessions of the same pool run ``bash`` and the pool is never judged hung or restarted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from legion.ledger.ledger import Ledger
from legion.supervision.child_spec import RetireTimeouts
from legion.supervision.root import RootSupervisor
from legion.workers.fixture_worker import MARKER_ENV
from legion.workers.transcript import create_empty, read_transcript, text_of
from tests.support import events, poller

pytestmark = pytest.mark.timeout(180)
FAST = RetireTimeouts(retire=3.0, signal=0.5, kill=0.5)
ROUNDS = 5
wait = poller(30.0, 0.02)


def spec(base: Path, node: str, script: dict[str, Any] | None, marker: str, **extra: Any) -> dict[str, Any]:
    path = create_empty(base / "sessions" / f"{node}.jsonl")
    return {"nodeId": node, "cwd": str(base), "model": "scripted/s", "transcript": str(path),
            "scripts": {"s": script or {"turns": ["unused"]}}, "tools": ["bash", "read", "grep"],
            "inheritEnv": False, "env": {MARKER_ENV: marker, "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            "prompt": "go", **extra}


def calls(*tools: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """A script: one turn calling these tools in order, then a final answer."""
    return {"turns": [{"text": "working", "tool_calls": [{"name": n, "arguments": a} for n, a in tools]}],
            "default": {"text": "finished"}}


def results(transcript: str) -> list[dict[str, Any]]:
    return [e["message"] for e in read_transcript(transcript).entries
            if e["type"] == "message" and e["message"]["role"] == "toolResult"]


def calling(transcript: str) -> bool:
    """The session's tool batch is under way: the assistant's tool call is recorded, its result is not."""
    msgs = [e["message"] for e in read_transcript(transcript).entries if e["type"] == "message"]
    return bool(msgs) and msgs[-1]["role"] == "assistant" and msgs[-1].get("stopReason") == "toolUse"


def call_time(transcript: str) -> float:
    """When the (last) assistant turn that called the tools was recorded (ms)."""
    msgs = [e["message"] for e in read_transcript(transcript).entries if e["type"] == "message"]
    return float(next(m for m in reversed(msgs) if m["role"] == "assistant" and m.get("stopReason") == "toolUse")
                 ["timestamp"])


async def bash_answers(root: RootSupervisor, base: Path, node: str, marker: str) -> float:
    """Another session of the pool runs bash to the end; returns its result's timestamp (ms)."""
    s = spec(base, node, calls(("bash", {"command": f"echo alive-{node}"})), marker)
    assert await root.nodes.launch_session(s, pool="pool") == "started"
    await wait(lambda: root.nodes.session_state(node) == "settled", message=f"{node} settled")
    (r,) = results(s["transcript"])
    assert not r["isError"] and text_of(r).strip() == f"alive-{node}", text_of(r)
    return float(r["timestamp"])


async def assert_pool_never_hung(root: RootSupervisor, reader: Ledger, pid: int | None) -> None:
    child = root.nodes.worker("pool")
    assert child is not None and child.pid == pid and not child.hung, "the pool was replaced"
    await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer
    assert len(events(reader, "pool", "node_launched")) == 1
    problems = events(reader, "pool", "node_problem")
    assert not problems, problems


# ---- (a) a grep that backtracks without end ----------------------------------------------------------


async def test_a_backtracking_grep_ends_at_its_deadline_and_the_pool_keeps_answering(
        base: Path, root: RootSupervisor, reader: Ledger, marker: str) -> None:
    """``(a|aa)+$`` on one 40 KB line never finishes in ``re``: before, it held the pool's GIL until the
    root killed the pool as hung, with every session in it."""
    (base / "hay.txt").write_text("a" * 40_000 + "b\n")
    pool = await root.nodes.launch_pool("pool", shutdown=FAST)
    for i in range(ROUNDS):
        g = spec(base, f"grep{i}", calls(("grep", {"pattern": "(a|aa)+$", "path": "hay.txt"})), marker,
                 budget={"toolTimeoutMs": 3000})
        assert await root.nodes.launch_session(g, pool="pool") == "started"
        await wait(lambda g=g: calling(g["transcript"]), message="the grep under way")  # type: ignore[misc]
        alive_at = await bash_answers(root, base, f"bash{i}", marker)
        await wait(lambda i=i: root.nodes.session_state(f"grep{i}") == "settled", message="the grep's session settled")  # type: ignore[misc]
        (r,) = results(g["transcript"])
        assert r["isError"] and "did not stop at its 3 s deadline and was killed" in text_of(r), text_of(r)
        assert alive_at < r["timestamp"], "the other session answered only after the grep ended"
        took = r["timestamp"] - call_time(g["transcript"])
        assert 3000 <= took < 8000, f"the grep took {took} ms against its 3 s deadline (+ at most 1 s to kill)"
    await assert_pool_never_hung(root, reader, pool.pid)


# ---- (b) files whose read blocks --------------------------------------------------------------------


def _kmsg_blocks() -> str | None:
    """Why /proc/kmsg cannot serve as a regular file whose read blocks here (None: it can)."""
    if os.geteuid() != 0:
        return "/proc/kmsg is readable by root only"
    try:
        os.close(os.open("/proc/kmsg", os.O_RDONLY | os.O_NONBLOCK))
    except OSError as exc:
        return f"/proc/kmsg cannot be opened here: {exc.strerror}"
    return None


@pytest.mark.skipif(_kmsg_blocks() is not None, reason=str(_kmsg_blocks()))
async def test_reads_that_block_end_and_do_not_starve_another_sessions_bash(
        base: Path, root: RootSupervisor, reader: Ledger, marker: str) -> None:
    """``/proc/kmsg`` is a regular file whose read blocks (reading it consumes the kernel log, as cat does).
    Before, each read hung in a thread of the pool's default executor for good; six filled it, and every
    other session's bash waited behind them."""
    os.mkfifo(base / "pipe")  # a FIFO with no writer: not a regular file, refused without opening
    (base / "logs").mkdir()  # what `grep x /proc` meets, small: a walk that comes upon /proc/kmsg
    (base / "logs" / "kmsg").symlink_to("/proc/kmsg")
    (base / "logs" / "zz.log").write_text("a line with x\n")
    pool = await root.nodes.launch_pool("pool", shutdown=FAST)
    blockers = []
    for i in range(max(ROUNDS, 6)):
        s = spec(base, f"block{i}", calls(("read", {"path": "/proc/kmsg"}), ("read", {"path": "pipe"}),
                                          ("grep", {"pattern": "x", "path": "/proc/kmsg"}),
                                          ("grep", {"pattern": "x", "path": "logs"})),
                 marker, budget={"toolTimeoutMs": 3000})
        assert await root.nodes.launch_session(s, pool="pool") == "started"
        blockers.append(s)
    await bash_answers(root, base, "bash", marker)
    for i, s in enumerate(blockers):
        await wait(lambda i=i: root.nodes.session_state(f"block{i}") == "settled", message=f"block{i} settled")  # type: ignore[misc]
        kmsg, pipe, grep_one, grep_walk = results(s["transcript"])
        assert kmsg["isError"] and "/proc/kmsg blocks on read" in text_of(kmsg), text_of(kmsg)
        assert pipe["isError"] and "FIFO" in text_of(pipe), text_of(pipe)
        assert grep_one["isError"] and "blocks on read" in text_of(grep_one), text_of(grep_one)
        assert not grep_walk["isError"] and text_of(grep_walk) == "zz.log:1: a line with x", text_of(grep_walk)
    await bash_answers(root, base, "bash-after", marker)
    await assert_pool_never_hung(root, reader, pool.pid)


# ---- (c) a scripted model whose script is a FIFO -------------------------------------------------------


async def test_a_fifo_script_is_refused_and_the_pool_keeps_answering(
        base: Path, root: RootSupervisor, reader: Ledger, marker: str) -> None:
    """``scripted/<FIFO>.yaml``: before, the pool's event loop opened the FIFO and waited for a writer."""
    fifo = base / "evil.yaml"
    os.mkfifo(fifo)  # any agent can make one with bash
    pool = await root.nodes.launch_pool("pool", shutdown=FAST)
    for i in range(ROUNDS):
        s = spec(base, f"fifo{i}", None, marker, model=f"scripted/{fifo}")
        assert await root.nodes.launch_session(s, pool="pool") == "started"
        r = await root.nodes.session_request(f"fifo{i}", "session.wait", timeoutMs=20_000)
        assert r["settled"] and r["stopReason"] == "error", r
        assert "is a FIFO (named pipe), not a regular file" in r["error"] and str(fifo) in r["error"], r
        await bash_answers(root, base, f"bash{i}", marker)
    await assert_pool_never_hung(root, reader, pool.pid)


# ---- each session's own executor ---------------------------------------------------------------------


async def test_a_full_default_executor_stops_no_tool(tmp_path: Path) -> None:
    """Threads stuck in the process's default executor (what six blocked reads used to leave) delay no
    tool of any session: file tools run in the session's helper, bash's scan on the session's threads."""
    import asyncio
    import threading

    from legion.workers.context import SessionContext
    from legion.workers.tools.base import ToolContext, run_tool
    from legion.workers.tools.catalog import all_tools

    tools = all_tools()
    (tmp_path / "notes.txt").write_text("needle\n")
    release = threading.Event()
    stuck = [asyncio.ensure_future(asyncio.to_thread(release.wait)) for _ in range(40)]  # more than its threads
    ctxs = [ToolContext(SessionContext(node_id=f"s{i}", cwd=str(tmp_path)), tmp_path / f"out{i}") for i in range(ROUNDS)]
    try:
        for ctx in ctxs:
            for name, args, want in (("bash", {"command": "echo alive"}, "alive"),
                                     ("read", {"path": "notes.txt"}, "     1\tneedle"),
                                     ("grep", {"pattern": "needle"}, "notes.txt:1: needle")):
                r = await asyncio.wait_for(run_tool(tools[name], args, ctx), 20)
                assert not r.is_error and r.text.rstrip("\n") == want, (name, r.text)
    finally:
        release.set()
        await asyncio.gather(*stuck)
        for ctx in ctxs:
            await ctx.executor.aclose()
    assert all(not ctx.pgids and ctx.executor.helpers == 0 for ctx in ctxs)
