"""Worker-hosted sessions under a real RootSupervisor: a real pool / rpc session worker (fork server,
control channel), scripted models, a real ledger file; crashes are real SIGKILLs and "no survivor" is
checked by scanning the process table for the test's marker."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from legion.ledger import open_ledger
from legion.ledger.ledger import Ledger
from legion.supervision.child_spec import ExitReason, RetireTimeouts
from legion.supervision.pool_child import SessionLaunchFailed
from legion.supervision.root import RootSupervisor
from legion.supervision.rpc_child import RpcChild
from legion.workers.fixture_worker import MARKER_ENV, find_marked
from legion.workers.outcome import derive_outcome
from legion.workers.session import NOTE_TYPE_RESTART, RUN_CUT_TYPE
from legion.workers.session_service import SessionService
from legion.workers.session_spec import SessionSpec, SpecError
from legion.workers.transcript import create_empty, read_transcript, text_of
from tests.support import events, make_session_root, poller, status

pytestmark = pytest.mark.timeout(60)
FAST = RetireTimeouts(retire=3.0, signal=0.5, kill=0.5)


until = poller(20.0, 0.02)


def spec(base: Path, node: str, script: dict[str, Any], marker: str, **extra: Any) -> dict[str, Any]:
    # a clean session environment (inheritEnv false): the tools carry no trace of the worker, so only
    # the tool groups the worker reported can lead the root to them after the worker is killed
    path = create_empty(base / "sessions" / f"{node}.jsonl")
    return {"nodeId": node, "cwd": str(base), "model": "scripted/s", "transcript": str(path),
            "scripts": {"s": script}, "tools": ["bash"], "inheritEnv": False,
            "env": {MARKER_ENV: marker, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}, "prompt": "go", **extra}


def sleep_once(base: Path, node: str) -> dict[str, Any]:
    """Turn 1 runs `sleep 60` the first time only (a marker file); turn 2 finishes."""
    flag = base / f"{node}.started"
    cmd = f"if [ -f {flag} ]; then echo rerun; else touch {flag}; sleep 60; echo late; fi"
    return {"turns": [{"text": "working", "tool_calls": [{"name": "bash", "arguments": {"command": cmd}}]},
                      {"text": f"{node} finished"}]}


def sleep_always(turns: int) -> dict[str, Any]:
    """Every turn runs `sleep 60` (a session that is always in flight)."""
    call = {"name": "bash", "arguments": {"command": "sleep 60; echo late"}}
    return {"turns": [{"tool_calls": [call]} for _ in range(turns)], "default": {"text": "done"}}


def live_worker(root: RootSupervisor, node_id: str, not_pid: int | None = None) -> RpcChild | None:
    child = root.nodes.worker(node_id)
    if child is None or child.pid is None or child.pid == not_pid or child.ready_body is None:
        return None
    return child


async def kill_worker(root: RootSupervisor, node_id: str, groups: int) -> RpcChild:
    """SIGKILL the worker once the root knows `groups` live tool process groups of it."""
    child = await until(lambda: live_worker(root, node_id), message=f"{node_id} running")
    await until(lambda: len(child.tool_pgids) >= groups, message=f"{groups} tool groups reported by {node_id}")
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    return child


def restart_notes(transcript: str) -> int:
    return len([e for e in read_transcript(transcript).entries if e.get("customType") == NOTE_TYPE_RESTART])


async def test_pool_crash_resumes_every_session_and_sweeps_their_tools(
        base: Path, root: RootSupervisor, reader: Ledger, marker: str) -> None:
    await root.nodes.launch_pool("pool", shutdown=FAST)
    nodes = ("s1", "s2", "s3")
    specs = {n: spec(base, n, sleep_once(base, n), marker) for n in nodes}
    for n in nodes:
        assert await root.nodes.launch_session(specs[n], pool="pool") == "started"
        assert root.nodes.session_state(n) == "running"
    await until(lambda: all((base / f"{n}.started").exists() for n in nodes), message="three tools running")
    await until(lambda: len(find_marked(marker)) >= 6, message="bash + sleep of each tool")
    old = await kill_worker(root, "pool", groups=3)

    new = await until(lambda: live_worker(root, "pool", not_pid=old.pid), message="pool restarted")
    assert not find_marked(marker)  # swept after the exit, before the restart: no survivor
    # the root's sweep found them (a SIGKILLed pool cleans nothing): bash + sleep in each of 3 groups,
    # in the dead pool's cgroup (cgroup containment) or by the reported tool groups (pid/pgid ladder)
    assert old.retire_report is not None
    if old.retire_report.containment == "cgroup":
        assert old.retire_report.swept >= 6 and old.tool_sweep == []
    else:
        assert len({p.pgid for p in old.tool_sweep}) == 3 and len(old.tool_sweep) >= 6
    await until(lambda: all(root.nodes.session_state(n) == "settled" for n in nodes), message="all sessions settled")
    await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer
    for n in nodes:
        assert derive_outcome(specs[n]["transcript"]) == "success"
        msgs = [e["message"] for e in read_transcript(specs[n]["transcript"]).entries if e["type"] == "message"]
        assert text_of(msgs[-1]) == f"{n} finished"
        assert restart_notes(specs[n]["transcript"]) == 1
        launched = events(reader, n, "node_launched")
        assert [e["restart"] for e in launched] == [False, True]
        assert launched[1]["attempt"] == 2 and launched[1]["pid"] == new.pid
        assert launched[1]["after"] == "pool pool: signal SIGKILL"
        assert events(reader, n)[-1]["type"] == "node_settled"
        assert status(reader, n) == "settled"
    pool_launches = events(reader, "pool", "node_launched")
    assert [e["restart"] for e in pool_launches] == [False, True]
    assert status(reader, "pool") == "running"


async def test_rpc_session_worker_crash_restarts_and_resumes(
        base: Path, root: RootSupervisor, reader: Ledger, marker: str) -> None:
    s = spec(base, "solo", sleep_once(base, "solo"), marker)
    await root.nodes.launch_rpc_session(s, shutdown=FAST)
    await until(lambda: (base / "solo.started").exists() and len(find_marked(marker)) >= 2, message="tool running")
    old = await kill_worker(root, "solo", groups=1)
    await until(lambda: live_worker(root, "solo", not_pid=old.pid), message="rpc worker restarted")
    assert not find_marked(marker)
    r = await root.nodes.session_request("solo", "session.wait", timeoutMs=15000)
    assert r["ok"] and r["settled"] and r["outcome"] == "success"
    assert restart_notes(s["transcript"]) == 1
    launched = events(reader, "solo", "node_launched")
    assert [e["restart"] for e in launched] == [False, True]
    assert "signal SIGKILL" in launched[1]["after"]
    assert status(reader, "solo") == "running"  # an rpc session worker stays up after its session settles


async def test_settled_session_is_not_revived_by_a_pool_restart(
        base: Path, root: RootSupervisor, reader: Ledger, marker: str) -> None:
    await root.nodes.launch_pool("pool", shutdown=FAST)
    done = spec(base, "done", {"turns": [{"text": "quick answer"}], "default": {"text": "again"}}, marker)
    busy = spec(base, "busy", sleep_once(base, "busy"), marker)
    await root.nodes.launch_session(done)
    await until(lambda: root.nodes.session_state("done") == "settled", message="quick session settled")
    await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer
    # new input reopens a settled session (live again), and it settles again
    r = await root.nodes.session_request("done", "session.prompt", text="once more")
    assert r == {"ok": True, "disposition": "accepted"}
    # The quick turn may settle before the prompt's reply arrives (the pool sends both on one socket),
    # so "running" is not observable for sure here; the node_resumed → node_settled events below are.
    assert root.nodes.session_state("done") in ("running", "settled")
    await until(lambda: root.nodes.session_state("done") == "settled", message="quick session settled again")
    await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer
    await root.nodes.launch_session(busy)
    old = await kill_worker(root, "pool", groups=1)
    await until(lambda: live_worker(root, "pool", not_pid=old.pid), message="pool restarted")
    await until(lambda: root.nodes.session_state("busy") == "settled", message="busy session resumed and settled")
    await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer
    listed = await root.nodes.session_request("busy", "session.list")
    assert set(listed["sessions"]) == {"busy"}  # "done" was not relaunched into the new pool
    assert root.nodes.session_state("done") == "settled" and status(reader, "done") == "settled"
    assert [e["type"] for e in events(reader, "done")] == ["node_launched", "node_settled", "node_resumed",
                                                           "node_settled"]
    assert restart_notes(done["transcript"]) == 0
    assert [e["restart"] for e in events(reader, "busy", "node_launched")] == [False, True]
    # launched again on purpose, it resumes its transcript in the new pool (a new launch, not a restart)
    assert await root.nodes.launch_session(done) == "started"
    assert set((await root.nodes.session_request("done", "session.list"))["sessions"]) == {"busy", "done"}
    relaunch = events(reader, "done", "node_launched")[-1]
    assert relaunch["attempt"] == 2 and relaunch["restart"] is False
    # its transcript's last run had ended: nothing to continue, so it is idle (settled) at once, not "running"
    assert status(reader, "done") == "settled" and events(reader, "done")[-1]["resumed"] is True


async def test_temporary_session_is_not_relaunched(
        base: Path, root: RootSupervisor, reader: Ledger, marker: str) -> None:
    await root.nodes.launch_pool("pool", shutdown=FAST)
    await root.nodes.launch_session(spec(base, "tmp", sleep_once(base, "tmp"), marker), restart="temporary")
    await root.nodes.launch_session(spec(base, "keep", sleep_once(base, "keep"), marker))
    old = await kill_worker(root, "pool", groups=2)
    await until(lambda: live_worker(root, "pool", not_pid=old.pid), message="pool restarted")
    await until(lambda: root.nodes.session_state("keep") == "settled", message="transient session resumed")
    await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer
    assert root.nodes.session_state("tmp") == "failed" and status(reader, "tmp") == "failed"
    failed = events(reader, "tmp", "node_failed")
    assert failed[-1]["reason"] == "pool_exited" and "SIGKILL" in failed[-1]["detail"]


async def test_retiring_one_session_leaves_the_pool_and_the_others_running(
        base: Path, root: RootSupervisor, reader: Ledger, marker: str) -> None:
    await root.nodes.launch_pool("pool", shutdown=FAST)
    mine, other = f"{marker}-r1", f"{marker}-r2"
    await root.nodes.launch_session(spec(base, "r1", sleep_always(3), mine))
    await root.nodes.launch_session(spec(base, "r2", sleep_always(3), other))
    await until(lambda: len(find_marked(mine)) >= 2 and len(find_marked(other)) >= 2, message="both tools running")
    pool_pid = root.nodes.worker("pool").pid  # type: ignore[union-attr]
    await root.nodes.retire("r1")
    assert not find_marked(mine)  # its tool process group was swept by the retire
    assert root.nodes.session_state("r1") == "retired" and status(reader, "r1") == "retired"
    assert events(reader, "r1")[-1] == {"type": "node_retired", "reason": "retire"}
    assert find_marked(other)  # the other session's tool is untouched
    assert root.nodes.worker("pool").pid == pool_pid  # type: ignore[union-attr]
    listed = await root.nodes.session_request("r2", "session.list")
    assert listed["sessions"] == {"r2": "streaming"}
    assert root.nodes.session_state("r2") == "running"
    await root.stop()  # the pause retires the pool, which disposes r2 and sweeps its tool
    assert not find_marked(other)
    assert status(reader, "r2") == "retired"
    assert events(reader, "r2")[-1] == {"type": "node_retired", "reason": "session-shutdown"}


async def test_pool_restart_intensity_escalates_and_fails_its_sessions(base: Path, marker: str) -> None:
    root = make_session_root(base, max_restarts=1, restart_period=60.0)
    await root.start()
    try:
        await root.nodes.launch_pool("pool", shutdown=FAST)
        for n in ("e1", "e2"):
            await root.nodes.launch_session(spec(base, n, sleep_always(4), marker))
        old = await kill_worker(root, "pool", groups=2)
        new = await until(lambda: live_worker(root, "pool", not_pid=old.pid), message="first restart")
        await until(lambda: all(root.nodes.session_state(n) == "running" for n in ("e1", "e2")), message="relaunched")
        await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer
        await kill_worker(root, "pool", groups=2)  # the second crash within the window: past intensity 1
        assert new.pid is not None
        reason = await asyncio.wait_for(root.wait_exit(), 20)
        assert reason == ExitReason.abnormal("restart_intensity")
        assert not find_marked(marker)
        ledger = open_ledger(root.ledger_path)
        try:
            for n in ("e1", "e2"):
                assert status(ledger, n) == "failed"
                last = events(ledger, n)[-1]
                assert last["type"] == "node_failed" and last["reason"] == "restart_intensity"
                assert last["pool"] == "pool" and "SIGKILL" in last["detail"]
            assert status(ledger, "root") == "failed"
        finally:
            ledger.close()
    finally:
        if not root._closed.is_set():
            await root.stop(force=True)
        await until(lambda: not find_marked(marker), 5, "no marked process")


async def test_bad_launches_are_refused_cleanly(base: Path, root: RootSupervisor, reader: Ledger,
                                               marker: str) -> None:
    with pytest.raises(Exception, match="no running pool"):
        await root.nodes.launch_session(spec(base, "early", {"turns": ["hi"]}, marker))
    assert reader.get_node("early") is None
    await root.nodes.launch_pool("pool", inprocess={"maxActive": 1, "maxQueuedLaunches": 0}, shutdown=FAST)
    with pytest.raises(SpecError, match=r"spec\.cwd is required"):
        await root.nodes.launch_session({"nodeId": "x", "model": "scripted/s", "transcript": "/tmp/x"})
    assert reader.get_node("x") is None
    await root.nodes.launch_session(spec(base, "one", sleep_always(2), marker))
    with pytest.raises(SessionLaunchFailed) as info:  # the single slot is busy and no queue is allowed
        await root.nodes.launch_session(spec(base, "two", {"turns": ["hi"]}, marker))
    assert info.value.code == "QUEUE_FULL"
    assert status(reader, "two") == "failed"
    assert events(reader, "two")[-1]["reason"] == "start_failed"
    with pytest.raises(Exception, match="already running"):
        await root.nodes.launch_session(spec(base, "one", {"turns": ["hi"]}, marker))
    assert root.nodes.worker("pool") is not None and root.nodes.session_state("one") == "running"


async def test_crash_right_after_a_tool_start_is_covered_by_the_tool_event(base: Path, marker: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # heartbeats every 30 s: after the pool's first beat (sent before any session existed) only the
    # immediate tool_groups event can tell the root about the tool's process group. That is the pid/pgid
    # ladder's mechanism (with cgroups the dead pool's cgroup holds the tool): force that path.
    monkeypatch.setenv("LEGION_CGROUPS", "0")
    root = make_session_root(base, heartbeat_interval=30.0)
    await root.start()
    try:
        await root.nodes.launch_pool("pool", shutdown=FAST)
        await root.nodes.launch_session(spec(base, "quick", sleep_once(base, "quick"), marker))
        old = await kill_worker(root, "pool", groups=1)  # killed as soon as the root knows the group
        await until(lambda: live_worker(root, "pool", not_pid=old.pid), message="pool restarted")
        assert old.tool_sweep and not find_marked(marker)
        await until(lambda: root.nodes.session_state("quick") == "settled", message="session resumed and settled")
        await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer
    finally:
        if not root._closed.is_set():
            await root.stop(force=True)
        await until(lambda: not find_marked(marker), 5, "no marked process")


async def test_service_reports_tool_groups_in_heartbeat_and_event(base: Path, marker: str) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []

    async def send(type_: str, body: dict[str, Any]) -> None:
        sent.append((type_, body))

    service = SessionService(send=send, request=None)
    service.start()
    try:
        assert service.heartbeat_info() == {"toolPgids": [], "toolsInFlight": 0, "sessions": 0,
                                            "lastActivityMs": None}
        await service.launch(SessionSpec.from_dict(spec(base, "hb", sleep_always(1), marker)))
        body = await until(lambda: next((b for t, b in sent if t == "event" and b["name"] == "tool_groups"), None),
                           message="tool_groups event")
        assert body["nodeId"] == "hb" and len(body["pgids"]) == 1
        pgid = body["pgids"][0]
        assert os.getpgid(find_marked(marker)[0]) == pgid  # the bash tool leads that group
        beat = service.heartbeat_info()
        assert {k: beat[k] for k in ("toolPgids", "toolsInFlight", "sessions")} == {
            "toolPgids": [pgid], "toolsInFlight": 1, "sessions": 1}
        assert abs(beat["lastActivityMs"] - time.time() * 1000) < 60_000
        r = await service.handle_request({"op": "session.retire", "nodeId": "hb"})
        assert r["ok"] and r["found"] and r["survivors"] == []
        assert service.heartbeat_info()["toolPgids"] == [] and not find_marked(marker)
    finally:
        await service.close()


async def test_hung_pool_is_killed_swept_restarted_and_its_sessions_resume(
        base: Path, root: RootSupervisor, reader: Ledger, marker: str) -> None:
    await root.nodes.launch_pool("pool", shutdown=FAST)
    await root.nodes.launch_session(spec(base, "h1", sleep_once(base, "h1"), marker))
    child = await until(lambda: live_worker(root, "pool"), message="pool running")
    await until(lambda: len(child.tool_pgids) == 1 and len(find_marked(marker)) >= 2, message="tool running")
    assert child.pid is not None
    os.kill(child.pid, signal.SIGSTOP)  # silent heartbeats (its tools keep running in their own groups)
    await until(lambda: live_worker(root, "pool", not_pid=child.pid), message="hung pool replaced")
    assert child.hung and not find_marked(marker)
    await until(lambda: root.nodes.session_state("h1") == "settled", message="session resumed and settled")
    await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer
    assert events(reader, "h1", "node_launched")[1]["after"] == "pool pool: hung"
    assert events(reader, "pool", "node_launched")[1]["after"] == "abnormal(hung)"


async def test_queued_sessions_survive_a_pool_crash_and_start_when_a_slot_frees(
        base: Path, root: RootSupervisor, reader: Ledger, marker: str) -> None:
    await root.nodes.launch_pool("pool", inprocess={"maxActive": 1}, shutdown=FAST)
    assert await root.nodes.launch_session(spec(base, "q1", sleep_once(base, "q1"), marker)) == "started"
    assert await root.nodes.launch_session(spec(base, "q2", {"turns": ["q2 done"]}, marker)) == "queued"
    assert root.nodes.session_state("q2") == "starting" and status(reader, "q2") == "starting"
    old = await kill_worker(root, "pool", groups=1)
    await until(lambda: live_worker(root, "pool", not_pid=old.pid), message="pool restarted")
    # both relaunched into one slot: one runs (and settles, keeping its slot), the other waits queued
    first = await until(lambda: next((n for n in ("q1", "q2") if root.nodes.session_state(n) == "settled"), None),
                        message="one session settled")
    await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer
    second = "q2" if first == "q1" else "q1"
    assert root.nodes.session_state(second) == "starting"
    await root.nodes.retire(first)  # frees the slot: the queued relaunch is admitted and runs
    await until(lambda: root.nodes.session_state(second) == "settled", message="the queued session ran")
    await root.lifecycle.drained()  # type: ignore[union-attr]  # its facts land through the writer thread
    for n in ("q1", "q2"):
        assert derive_outcome(root.nodes.pool("pool").sessions[n].session_spec["transcript"]) == "success"  # type: ignore[union-attr]
    assert [e["restart"] for e in events(reader, "q1", "node_launched")] == [False, True]
    assert [e["restart"] for e in events(reader, "q2", "node_launched")] == [True]  # never ran before the crash
    assert not find_marked(marker)


async def test_retiring_the_pool_retires_its_sessions(base: Path, root: RootSupervisor, reader: Ledger,
                                                      marker: str) -> None:
    await root.nodes.launch_pool("pool", shutdown=FAST)
    await root.nodes.launch_session(spec(base, "p1", sleep_always(6), marker))
    await until(lambda: len(find_marked(marker)) >= 2, message="tool running")
    await root.nodes.retire("pool")
    assert not find_marked(marker) and root.nodes.worker("pool") is None
    assert root.nodes.session_state("p1") == "retired"
    assert events(reader, "p1")[-1] == {"type": "node_retired", "reason": "retire"}
    assert status(reader, "pool") == "retired"
    with pytest.raises(Exception, match="no running pool"):
        await root.nodes.launch_session(spec(base, "p2", {"turns": ["hi"]}, marker))
    with pytest.raises(Exception, match="p2"):
        await root.nodes.retire("p2")
    # the same pool id runs again and the retired session resumes in it when launched again
    await root.nodes.launch_pool("pool", shutdown=FAST)
    assert status(reader, "pool") == "running"
    p1 = root.nodes.pool("pool").sessions["p1"].session_spec  # type: ignore[union-attr]
    # the pool's stop cut the run (legion.run_cut {cause: stop}): launched again, the run continues
    cuts = [e["data"] for e in read_transcript(p1["transcript"]).entries if e.get("customType") == RUN_CUT_TYPE]
    assert cuts == [{"cause": "stop"}]
    assert await root.nodes.launch_session(p1) == "started"
    r = await root.nodes.session_request("p1", "session.prompt", text="carry on")
    assert r == {"ok": True, "disposition": "queued"}  # the continued run is busy: taken when it would stop
    await until(lambda: len(find_marked(marker)) >= 2, message="the continued run's tool running")
    await root.nodes.retire("p1")
    assert not find_marked(marker) and root.nodes.session_state("p1") == "retired"


async def test_pool_in_a_team_escalates_to_the_team_not_the_root(
        base: Path, root: RootSupervisor, reader: Ledger, marker: str) -> None:
    await root.nodes.launch_team("crew", max_restarts=0)
    await root.nodes.launch_pool("tpool", parent="crew", shutdown=FAST)
    await root.nodes.launch_session(spec(base, "m1", sleep_always(2), marker), pool="tpool")
    await kill_worker(root, "tpool", groups=1)  # intensity 0: the first crash escalates to the team
    await until(lambda: status(reader, "crew") == "failed", message="team failed")
    assert status(reader, "m1") == "failed"
    last = events(reader, "m1")[-1]
    assert last["type"] == "node_failed" and last["reason"] == "restart_intensity" and last["pool"] == "tpool"
    assert not find_marked(marker)
    assert root.supervisor is not None and root.supervisor.state == "running"  # the root carries on
    await root.nodes.launch_pool("pool2", shutdown=FAST)
    assert await root.nodes.launch_session(spec(base, "m2", {"turns": ["fine"]}, marker), pool="pool2") == "started"
    await until(lambda: root.nodes.session_state("m2") == "settled", message="a new pool works")
    await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer


async def test_a_queued_launch_is_retired_with_the_pool_not_failed(
        base: Path, root: RootSupervisor, reader: Ledger, marker: str) -> None:
    await root.nodes.launch_pool("pool", inprocess={"maxActive": 1}, shutdown=FAST)
    await root.nodes.launch_session(spec(base, "busy1", sleep_always(2), marker))
    assert await root.nodes.launch_session(spec(base, "waiting", {"turns": ["hi"]}, marker)) == "queued"
    await root.stop()
    assert status(reader, "waiting") == "retired" and status(reader, "busy1") == "retired"
    assert events(reader, "waiting") == [{"type": "node_retired", "reason": "session-shutdown"}]
    assert not find_marked(marker)


async def test_a_bogus_tool_group_report_never_hits_a_sibling_worker(
        base: Path, root: RootSupervisor, reader: Ledger, marker: str) -> None:
    sibling_marker = f"{marker}-sib"
    await root.nodes.launch_rpc_session(spec(base, "sib", sleep_always(2), sibling_marker), shutdown=FAST)
    await root.nodes.launch_pool("pool", shutdown=FAST)
    await root.nodes.launch_session(spec(base, "k1", sleep_once(base, "k1"), marker))  # resumed: no new tool
    sib = await until(lambda: live_worker(root, "sib"), message="sibling running")
    await until(lambda: len(sib.tool_pgids) == 1 and len(find_marked(sibling_marker)) >= 2, message="sibling tool")
    pool = await until(lambda: live_worker(root, "pool"), message="pool running")
    await until(lambda: len(pool.tool_pgids) == 1, message="pool tool group")
    assert sib.pid is not None and root.spawner.zygote_pid is not None
    # as if the pool had reported the sibling worker's group, its tool's group and the fork server's
    assert pool.note_tool_groups([sib.pid, *sib.tool_pgids, os.getpgid(root.spawner.zygote_pid)], replace=False)
    old = await kill_worker(root, "pool", groups=4)
    await until(lambda: live_worker(root, "pool", not_pid=old.pid), message="pool restarted")
    assert not find_marked(marker)  # the pool's own tool was swept
    assert len(find_marked(sibling_marker)) >= 2 and sib.proc is not None and sib.proc.is_alive()
    assert root.nodes.worker("sib") is sib and root.spawner.zygote_pid is not None
    own = set(old.tool_pgids) - {sib.pid, *sib.tool_pgids, os.getpgid(root.spawner.zygote_pid)}
    # with cgroups the dead pool's cgroup already held its tool: the group sweep finds nothing at all
    cgroup = old.retire_report is not None and old.retire_report.containment == "cgroup"
    assert {p.pgid for p in old.tool_sweep} == (set() if cgroup else own)


ROOT_SCRIPT = """
import asyncio, os, sys
from legion.supervision.root import RootSupervisor
from legion.supervision.spawn import DEFAULT_PRELOAD
from legion.workers.transcript import create_empty

async def main(base, marker):
    root = RootSupervisor(base + "/run", preload=(*DEFAULT_PRELOAD, "legion.workers.session_worker"))
    await root.start()
    await root.nodes.launch_pool("pool")
    call = {"name": "bash", "arguments": {"command": "sleep 60; echo late"}}
    def spec(node):
        return {"nodeId": node, "cwd": base, "model": "scripted/s", "transcript": str(create_empty(base + f"/{node}.jsonl")),
                "scripts": {"s": {"turns": [{"tool_calls": [call]}]}}, "tools": ["bash"], "inheritEnv": False,
                "env": {"LEGION_FIXTURE_MARKER": marker, "PATH": os.environ["PATH"]}, "prompt": "go"}
    for node in ("a", "b"):
        await root.nodes.launch_session(spec(node))
    await root.nodes.launch_rpc_session(spec("c"))
    print("READY", root.nodes.worker("pool").pid, root.nodes.worker("c").pid, root.spawner.zygote_pid, flush=True)
    await asyncio.Event().wait()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def test_sigkill_of_the_root_takes_pool_sessions_and_their_tools_down(base: Path, marker: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", ROOT_SCRIPT, str(base), marker], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:1] == [b"READY"], line
        workers = [int(p) for p in line[1:]]  # pool, rpc session worker, fork server
        deadline = time.monotonic() + 20
        while len(find_marked(marker)) < 6:  # bash + sleep of three tools
            assert time.monotonic() < deadline, f"only {len(find_marked(marker))} tool processes up"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(5)
        killed_at = time.monotonic()
        while find_marked(marker) or [p for p in workers if psutil.pid_exists(p) and not zombie(p)]:
            assert time.monotonic() - killed_at < 2.0, (
                f"2 s after the root died: tools {find_marked(marker)}, workers {[p for p in workers if not zombie(p)]}")
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in find_marked(marker):  # never leak into other tests, even on failure
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
