"""RootSupervisor with real worker processes (the fixture worker), a real ROUTER and a real ledger file."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest
import zmq
import zmq.asyncio

from legion.bus.monitor import MonitorClient, MonitorEvent
from legion.bus.protocol import Message, encode
from legion.ledger import InvalidNodeError, open_ledger
from legion.ledger.ledger import Ledger
from legion.supervision.child_spec import ChildSpecError, ExitReason, RetireTimeouts
from legion.supervision.root import RootSupervisor
from legion.supervision.rpc_child import RpcNode
from legion.supervision.run_lock import RunDirBusy
from legion.supervision.supervisor import (
    ChildAlreadyPresent,
    ChildNotFound,
    StartFailed,
    SupervisorNotRunning,
)
from legion.workers.fixture_worker import ENTRY, find_marked
from tests.support import events, poller, status

pytestmark = pytest.mark.timeout(60)
FAST = RetireTimeouts(retire=2.0, signal=0.5, kill=0.5)


until = poller(10.0, 0.02)


@pytest.fixture
def run_dir() -> Iterator[Path]:
    # ipc:// paths are limited to ~107 bytes: keep the run directory short
    base = Path(tempfile.mkdtemp(prefix="lgr", dir="/tmp"))
    yield base / "run"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def marker() -> str:
    return f"otp-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def root(run_dir: Path) -> AsyncIterator[RootSupervisor]:
    sup = RootSupervisor(run_dir, heartbeat_interval=0.5, hang_misses=3, max_restarts=3,
                         restart_period=60.0)  # hung = 1.5 s silent
    await sup.start()
    yield sup
    if not sup._closed.is_set():
        await sup.stop(force=True)


def gone(pid: int | None) -> bool:
    """The process has exited (a zombie counts as gone)."""
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def node(node_id: str, marker: str, **args: Any) -> RpcNode:
    return RpcNode(node_id, ENTRY, {"marker": marker, **args}, shutdown=FAST, start_timeout=10.0)


async def test_crash_is_restarted_transient(root: RootSupervisor, reader: Ledger, marker: str) -> None:
    ready_file = root.run_dir / "crasher.ready"
    first = await root.nodes.launch(node("crasher", marker, mode="crash", exit_after=0.3, children=1,
                                   ready_file=str(ready_file), report_env=["LEGION_WORKER_ATTEMPT"]))
    assert status(reader, "crasher") == "running"
    first_pid = first.pid
    launched = await until(lambda: len(events(reader, "crasher", "node_launched")) >= 2, message="a restart")
    assert launched
    second = events(reader, "crasher", "node_launched")[1]
    assert second["restart"] is True and second["attempt"] == 2
    assert second["after"] == "abnormal(exit code 1)"
    assert second["pid"] != first_pid
    assert gone(first_pid)

    def attempt_seen() -> str | None:
        try:
            return str(orjson.loads(ready_file.read_bytes())["env"]["LEGION_WORKER_ATTEMPT"])
        except (OSError, ValueError, KeyError):
            return None

    await until(lambda: attempt_seen() == "2", message="the restarted worker knows it is attempt 2")
    await root.stop()
    assert find_marked(marker) == []


async def test_normal_exit_is_not_restarted(root: RootSupervisor, reader: Ledger, marker: str) -> None:
    await root.nodes.launch(node("done", marker, mode="exit", code=0, exit_after=0.1))
    await until(lambda: status(reader, "done") == "settled", message="settled")
    assert [e["type"] for e in events(reader, "done")] == ["node_launched", "node_settled"]
    await asyncio.sleep(0.3)  # a restart would have happened by now (the first one is immediate)
    assert len(events(reader, "done", "node_launched")) == 1
    assert root.nodes.worker("done") is None
    await root.stop()


async def test_nonzero_exit_is_abnormal_and_temporary_is_not_restarted(
    root: RootSupervisor, reader: Ledger, marker: str
) -> None:
    # exit_after: a worker that exits at once can lose its `ready` (see rpc_child.READY_GRACE)
    spec = RpcNode("temp", ENTRY, {"mode": "exit", "code": 3, "exit_after": 0.3, "marker": marker},
                   restart="temporary", shutdown=FAST)
    await root.nodes.launch(spec)
    await until(lambda: status(reader, "temp") == "failed", message="failed")
    failed = events(reader, "temp", "node_failed")
    assert failed[0]["reason"] == "exit code 3"
    assert len(events(reader, "temp", "node_launched")) == 1
    await root.stop()


async def test_hung_worker_is_detected_by_app_heartbeat_and_restarted(
    root: RootSupervisor, reader: Ledger, marker: str
) -> None:
    first = await root.nodes.launch(node("spinner", marker, mode="busy", children=2))
    first_pid = first.pid
    await until(lambda: len(events(reader, "spinner", "node_launched")) >= 2, deadline=10, message="hung restart")
    second = events(reader, "spinner", "node_launched")[1]
    assert second["after"] == "abnormal(hung)"
    assert first.hung and first.retire_report is not None and first.retire_report.step in ("term", "kill")
    assert gone(first_pid)
    await root.stop(force=True)
    assert find_marked(marker) == []


async def test_team_restart_intensity_fails_the_team_and_leaves_no_survivors(
    root: RootSupervisor, reader: Ledger, marker: str
) -> None:
    team = await root.nodes.launch_team(
        "team-a",
        members=[node("sibling", marker, children=2, setsid_children=1),
                 node("flaky", marker, mode="crash", exit_after=0.05, children=1)],
        max_restarts=2, restart="temporary",
    )
    assert status(reader, "team-a") == "running"
    await until(lambda: status(reader, "team-a") == "failed", deadline=15, message="team failed")
    assert team.exit_reason == ExitReason.abnormal("restart_intensity")
    team_failed = events(reader, "team-a", "node_failed")
    assert team_failed[-1]["reason"] == "restart_intensity"
    assert events(reader, "sibling", "node_retired")[-1]["reason"] == "restart_intensity"
    assert status(reader, "sibling") == "retired"
    assert status(reader, "flaky") == "failed"
    assert len(events(reader, "flaky", "node_launched")) == 3  # first start + 2 restarts, the 3rd escalates
    await until(lambda: find_marked(marker) == [], deadline=5, message="no survivors")
    assert root.supervisor is not None and root.supervisor.state == "running"  # the root carries on
    await root.stop()


async def test_root_restart_intensity_fails_the_root_node(run_dir: Path, marker: str) -> None:
    root = RootSupervisor(run_dir, heartbeat_interval=0.5, max_restarts=1)
    await root.start()
    await root.nodes.launch(node("bystander", marker, children=1))
    await root.nodes.launch(node("flaky", marker, mode="crash", exit_after=0.05))
    reason = await asyncio.wait_for(root.wait_exit(), 20)
    assert reason == ExitReason.abnormal("restart_intensity")
    with open_ledger(root.ledger_path) as ledger:
        assert events(ledger, "root", "node_failed")[-1]["reason"] == "restart_intensity"
        assert events(ledger, "root", "node_failed")[-1]["child"] == "flaky"
        assert status(ledger, "bystander") == "retired"
        assert events(ledger, "bystander", "node_retired")[-1]["reason"] == "restart_intensity"
    await until(lambda: find_marked(marker) == [], deadline=5, message="no survivors")


async def test_stop_is_a_pause_retired_session_shutdown_phase_untouched(
    root: RootSupervisor, reader: Ledger, marker: str
) -> None:
    await root.nodes.launch(node("a", marker, children=1))
    await root.nodes.launch_team("team-b", members=[node("b", marker, children=1)])
    reader.update_node("a", phase="implementing")
    reason = await root.stop()
    assert reason == ExitReason.shutdown("session-shutdown")
    for node_id in ("a", "b", "team-b", "root"):
        assert status(reader, node_id) == "retired", node_id
        assert events(reader, node_id, "node_retired")[-1]["reason"] == "session-shutdown", node_id
    row = reader.get_node("a")
    assert row is not None and row["phase"] == "implementing"
    assert not any(e.type == "phase_change" for e in reader.events_after(0))
    assert find_marked(marker) == []
    assert await asyncio.wait_for(root.wait_exit(), 5) == reason


async def test_retire_one_worker_with_the_ladder(root: RootSupervisor, reader: Ledger, marker: str) -> None:
    child = await root.nodes.launch(node("r", marker, children=2, setsid_children=1))
    await root.nodes.launch(node("keep", marker))
    await root.nodes.retire("r", cause="retire")
    assert status(reader, "r") == "retired"
    assert events(reader, "r", "node_retired")[-1]["reason"] == "retire"
    assert child.retire_report is not None and child.retire_report.step == "graceful"
    assert root.nodes.worker("keep") is not None and status(reader, "keep") == "running"
    await asyncio.sleep(0.2)
    assert len(events(reader, "r", "node_launched")) == 1  # a retire is never restarted
    relaunched = await root.nodes.launch(node("r", marker))  # the name can be reused after retire
    assert relaunched.pid != child.pid and status(reader, "r") == "running"
    assert events(reader, "r", "node_launched")[-1]["restart"] is False  # a relaunch is not a restart
    await root.stop()
    assert find_marked(marker) == []


async def test_start_timeout_kills_the_worker_and_fails_the_launch(
    root: RootSupervisor, reader: Ledger, marker: str
) -> None:
    slow = RpcNode("slow", ENTRY, {"start_delay": 30, "marker": marker, "children": 0}, shutdown=FAST,
                   start_timeout=0.5)
    with pytest.raises(Exception, match="not ready within"):
        await root.nodes.launch(slow)
    assert status(reader, "slow") == "failed"
    assert events(reader, "slow", "node_failed")[-1]["reason"] == "start_failed"
    await until(lambda: find_marked(marker) == [], deadline=5, message="slow worker gone")
    await root.stop()


def _garbage_frames() -> list[list[bytes]]:
    ready = encode(Message("ready", "evil", {"pid": 1}))
    return [
        [b"not json"],
        [b"[1,2,3]"],
        [b'{"v": 99, "t": "ready", "s": "evil", "c": null, "b": {}}'],
        [b'{"v": 1, "t": "no-such-type", "s": "evil", "c": null, "b": {}}'],
        [b'{"v": 1, "t": "log", "s": "evil", "c": null, "b": {"level": 5}}'],
        [b'{"v": 1, "t": "ready", "s": "someone-else", "c": null, "b": {}}'],
        [b"x" * (2 << 20)],
        [ready, ready],
        [b"\xff\xfe\x00"],
        [ready],  # well-formed but from a worker the root never spawned
        [encode(Message("request", "evil", {"op": "launch"}, corr="c1"))],
    ]


async def test_malformed_frames_at_the_router_do_not_kill_the_root(
    root: RootSupervisor, reader: Ledger, marker: str
) -> None:
    assert root.control is not None and root.control_endpoint is not None
    ctx = zmq.asyncio.Context()
    evil = ctx.socket(zmq.DEALER)
    evil.setsockopt(zmq.IDENTITY, b"evil")
    evil.setsockopt(zmq.LINGER, 0)
    evil.connect(root.control_endpoint)
    try:
        for _ in range(20):
            for frames in _garbage_frames():
                await evil.send_multipart(frames)
        await until(lambda: root.control is not None and root.control.drops.total >= 20 * 9, message="drops counted")
        await until(lambda: root.control is not None and root.control.drops["unknown_peer"] >= 20,
                    message="frames from an identity that is no worker refused")
        reply = await asyncio.wait_for(evil.recv(), 5)  # the request got an answer, not a crash
        assert b"unknown worker" in reply
    finally:
        evil.close()
        ctx.term()
    child = await root.nodes.launch(node("after", marker))  # the root still spawns and hears readiness
    assert child.ready_body is not None and child.ready_body["pid"] == child.pid
    assert root.supervisor is not None and root.supervisor.state == "running"
    await root.stop()


async def test_ledger_and_run_dir_are_private(root: RootSupervisor) -> None:
    assert os.stat(root.run_dir).st_mode & 0o777 == 0o700
    assert root.control_endpoint == f"ipc://{root.run_dir}/ctl.sock"
    await root.stop()


async def test_signal_pauses_the_run(root: RootSupervisor, reader: Ledger, marker: str) -> None:
    # SIGUSR1 stands in for SIGTERM/SIGINT so a broken handler could never kill the test runner quietly
    await root.nodes.launch(node("s", marker, children=1))
    root.install_signal_handlers(signals=(signal.SIGUSR1,))
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        reason = await asyncio.wait_for(root.wait_exit(), 10)
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
    assert reason == ExitReason.shutdown("session-shutdown")
    assert status(reader, "s") == "retired"
    assert events(reader, "s", "node_retired")[-1]["reason"] == "session-shutdown"
    assert find_marked(marker) == []


async def test_worker_dying_before_ready_fails_the_launch(root: RootSupervisor, reader: Ledger) -> None:
    bad = RpcNode("bad", "legion.workers.no_such_module:main", shutdown=FAST, start_timeout=10.0)
    with pytest.raises(StartFailed, match="exited before it was ready"):
        await root.nodes.launch(bad)
    assert status(reader, "bad") == "failed"
    assert "exit code 78" in events(reader, "bad", "node_failed")[-1]["detail"]
    assert root.nodes.worker("bad") is None
    await root.stop()


async def test_launching_a_live_id_is_refused_without_touching_its_status(
    root: RootSupervisor, reader: Ledger, marker: str
) -> None:
    await root.nodes.launch(node("dup", marker))
    with pytest.raises(ChildAlreadyPresent):
        await root.nodes.launch(node("dup", marker))
    with pytest.raises(ChildAlreadyPresent):
        await root.nodes.launch_team("t", members=[node("dup", marker)])
    assert status(reader, "dup") == "running"
    assert len(events(reader, "dup", "node_launched")) == 1
    await root.stop()
    with pytest.raises(SupervisorNotRunning):
        await root.nodes.launch(node("late", marker))
    assert reader.get_node("late") is None


async def test_lifecycle_is_published_on_the_monitor_stream(root: RootSupervisor, marker: str) -> None:
    client = MonitorClient(root.run_dir)
    snap = await client.attach()
    try:
        assert snap.state["root"] == "root" and snap.state["nodes"]["root"]["status"] == "running"
        await root.nodes.launch(node("seen", marker, mode="crash", exit_after=0.2))
        got: list[tuple[str, dict[str, Any]]] = []

        async def collect() -> None:
            while not any(t == "node_launched" and b.get("attempt") == 2 for t, b in got):
                item = await client.next(timeout=5)
                if isinstance(item, MonitorEvent):
                    got.append((item.type, item.body))

        await asyncio.wait_for(collect(), 10)
        types = [t for t, b in got if b.get("node_id") == "seen"]
        assert types[:2] == ["node_status", "node_launched"]
        assert "child_exited" in types
        assert client.gaps == 0
        assert root.monitor is not None
        later = MonitorClient(root.run_dir)
        snap2 = await later.attach()  # a late subscriber gets the state first
        await later.close()
        assert snap2.state["nodes"]["seen"]["status"] in ("running", "starting")
    finally:
        await client.close()
    await root.stop()


async def test_one_for_all_team_restarts_siblings_but_never_a_settled_member(
    root: RootSupervisor, reader: Ledger, marker: str
) -> None:
    await root.nodes.launch_team(
        "squad",
        members=[node("calm", marker), node("done", marker, mode="exit", code=0),
                 node("boom", marker, mode="crash", exit_after=0.3)],
        strategy="one_for_all", max_restarts=5,
    )
    await until(lambda: status(reader, "done") == "settled", message="settled member")
    await until(lambda: len(events(reader, "calm", "node_launched")) >= 2, message="sibling restarted (one_for_all)")
    assert len(events(reader, "done", "node_launched")) == 1  # a settled agent is never revived
    assert status(reader, "done") == "settled"
    await root.stop()
    assert status(reader, "done") == "settled"  # a pause retires live nodes only
    assert status(reader, "calm") == "retired"
    assert find_marked(marker) == []


@pytest.mark.parametrize(
    ("shutdown", "args", "step"),
    [
        (RetireTimeouts(retire=2.0, signal=0.5, kill=0.5), {}, "graceful"),
        ("brutal_kill", {}, "term"),
        (RetireTimeouts(retire=0.3, signal=0.3, kill=0.5), {"mode": "busy", "ignore_term": True}, "kill"),
    ],
)
async def test_shutdown_modes_walk_the_ladder(
    root: RootSupervisor, reader: Ledger, marker: str, shutdown: Any, args: dict[str, Any], step: str
) -> None:
    spec = RpcNode("s", ENTRY, {"marker": marker, "children": 1, **args}, shutdown=shutdown)
    child = await root.nodes.launch(spec)
    await root.nodes.retire("s", cause="retire")
    assert child.retire_report is not None and child.retire_report.step == step
    assert child.retire_report.survivors == []
    assert status(reader, "s") == "retired"
    assert find_marked(marker) == []
    await root.stop()


async def test_a_blocked_event_loop_is_hung_too(root: RootSupervisor, reader: Ledger, marker: str) -> None:
    await root.nodes.launch(node("blocked", marker, mode="block"))
    await until(lambda: len(events(reader, "blocked", "node_launched")) >= 2, message="hung restart")
    assert events(reader, "blocked", "node_launched")[1]["after"] == "abnormal(hung)"
    await root.stop(force=True)
    assert find_marked(marker) == []


async def test_concurrent_launches_of_one_id_start_it_once(root: RootSupervisor, reader: Ledger, marker: str) -> None:
    results = await asyncio.gather(*(root.nodes.launch(node("twin", marker)) for _ in range(3)), return_exceptions=True)
    started = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, ChildAlreadyPresent)]
    assert len(started) == 1 and len(refused) == 2
    assert status(reader, "twin") == "running"
    assert len(events(reader, "twin", "node_launched")) == 1
    await root.stop()


async def test_team_start_failure_fails_the_unstarted_members(root: RootSupervisor, reader: Ledger, marker: str) -> None:
    bad = RpcNode("m2", "legion.workers.no_such_module:main", shutdown=FAST)
    with pytest.raises(StartFailed):
        await root.nodes.launch_team("t2", members=[node("m1", marker), bad, node("m3", marker)])
    assert status(reader, "t2") == "failed"
    assert status(reader, "m1") == "retired"  # started, then stopped with its team
    assert status(reader, "m2") == "failed" and status(reader, "m3") == "failed"
    await until(lambda: find_marked(marker) == [], deadline=5, message="no survivors")
    await root.stop()


async def test_team_ends_when_its_significant_lead_settles(root: RootSupervisor, reader: Ledger, marker: str) -> None:
    lead = RpcNode("lead", ENTRY, {"mode": "exit", "code": 0, "exit_after": 0.2, "marker": marker},
                   significant=True, shutdown=FAST)
    with pytest.raises(ChildSpecError, match="auto_shutdown"):
        await root.nodes.launch_team("crew", members=[lead, node("hand", marker)])
    assert reader.get_node("crew") is None
    team = await root.nodes.launch_team("crew", members=[lead, node("hand", marker, children=1)],
                                  auto_shutdown="any_significant")
    await until(lambda: status(reader, "crew") == "retired", message="team auto-shutdown")
    assert team.exit_reason == ExitReason.shutdown("auto_shutdown")
    assert events(reader, "crew", "node_retired")[-1]["reason"] == "auto_shutdown"
    assert status(reader, "lead") == "settled"
    assert events(reader, "hand", "node_retired")[-1]["reason"] == "auto_shutdown"
    await until(lambda: find_marked(marker) == [], deadline=5, message="no survivors")
    await root.stop()


async def test_a_tcp_monitor_without_curve_is_refused_and_the_root_cleans_up(run_dir: Path) -> None:
    root = RootSupervisor(run_dir, monitor_tcp=("tcp://127.0.0.1:47001", "tcp://127.0.0.1:47002"))
    with pytest.raises(Exception, match=r"(?i)curve"):
        await root.start()
    assert root._closed.is_set()
    assert root._spawner is None  # refused before any process was started
    assert root.control is not None and root.control.zmq_socket is None  # the ROUTER was closed again


async def test_retiring_a_team_retires_its_members_with_the_same_cause(
    root: RootSupervisor, reader: Ledger, marker: str
) -> None:
    await root.nodes.launch_team("tm", members=[node("m-a", marker, children=1), node("m-b", marker)])
    await root.nodes.launch(node("later", marker), parent="tm")  # a member added after the team started
    await root.nodes.retire("tm", cause="over-budget")
    for node_id in ("tm", "m-a", "m-b", "later"):
        assert status(reader, node_id) == "retired", node_id
        assert events(reader, node_id, "node_retired")[-1]["reason"] == "over-budget", node_id
    team = root.nodes.team("tm")
    assert team is not None and team.state == "stopped"
    with pytest.raises(ChildNotFound):
        await root.nodes.launch(node("x", marker), parent="tm")
    assert find_marked(marker) == []
    await root.stop()


@pytest.mark.parametrize("yields", [0, 3, 6, 12, 40])
async def test_a_cancelled_launch_leaks_nothing(root: RootSupervisor, reader: Ledger, marker: str,
                                                yields: int) -> None:
    launch = asyncio.create_task(root.nodes.launch(node("c", marker, children=1)))
    for _ in range(yields):
        await asyncio.sleep(0)
    await asyncio.sleep(0.001 * yields)
    launch.cancel()
    try:
        await launch
        await root.nodes.retire("c")  # finished before the cancel arrived: retire it the normal way
    except asyncio.CancelledError:
        pass
    assert status(reader, "c") in ("failed", "retired")
    assert root.nodes.worker("c") is None
    await root.stop()
    await until(lambda: find_marked(marker) == [], deadline=5, message="no leaked grandchild")


async def test_a_launch_cancelled_after_its_worker_started_retires_it(root: RootSupervisor, reader: Ledger,
                                                                    marker: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The window the parametrised test above hits only by chance (seen under two busy loops): the worker is
    ready and `running`, and the cancel arrives while the launch waits for its facts to land. Its caller never
    gets the node, so the launch retires it before the cancellation goes on."""
    lifecycle = root.lifecycle
    assert lifecycle is not None
    landed, waiting = lifecycle.drained, asyncio.Event()
    calls = 0

    async def drained() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:  # the launch's own barrier: held until the test cancels it
            waiting.set()
            await asyncio.Event().wait()
        await landed()

    monkeypatch.setattr(lifecycle, "drained", drained)
    launch = asyncio.create_task(root.nodes.launch(node("c", marker, children=1)))
    await asyncio.wait_for(waiting.wait(), 30)
    assert root.nodes.worker("c") is not None
    await until(lambda: status(reader, "c") == "running", message="its running status landed")
    launch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await launch
    assert status(reader, "c") == "retired"
    assert events(reader, "c", "node_retired")[-1]["reason"] == "launch cancelled"
    assert root.nodes.worker("c") is None
    await root.stop()
    await until(lambda: find_marked(marker) == [], deadline=5, message="no leaked grandchild")


async def test_one_root_per_run_directory(root: RootSupervisor, reader: Ledger, marker: str) -> None:
    await root.nodes.launch(node("mine", marker))
    intruder = RootSupervisor(root.run_dir)
    with pytest.raises(RunDirBusy, match=f"pid {os.getpid()}"):
        await intruder.start()
    assert intruder._spawner is None and intruder.control is None  # refused before binding anything
    assert root.nodes.worker("mine") is not None and status(reader, "mine") == "running"
    await root.stop()
    successor = RootSupervisor(root.run_dir)  # the lock went with the first root
    await successor.start()
    await successor.stop()


async def test_a_name_the_ledger_refuses_launches_nothing(root: RootSupervisor, reader: Ledger, marker: str) -> None:
    with pytest.raises(InvalidNodeError):
        await root.nodes.launch(node("Not A Slug", marker))
    with pytest.raises(InvalidNodeError):
        await root.nodes.launch_team("fine-team", members=[node("ok", marker), node("BAD!", marker)])
    assert reader.get_node("Not A Slug") is None and reader.get_node("fine-team") is None
    assert reader.get_node("ok") is None
    assert root.supervisor is not None and root.supervisor.which_children() == []
    named = await root.nodes.launch(RpcNode("w-1.x", ENTRY, {"marker": marker}, name="w-1-x", shutdown=FAST))
    row = reader.get_node("w-1.x")
    assert row is not None and row["name"] == "w-1-x" and named.pid is not None
    await root.stop()
