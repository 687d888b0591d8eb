"""A settled rpc session worker under a real RootSupervisor (fork server, control channel, scripted model, ledger
file): it is no longer watched for hangs and sends no heartbeat; after its idle grace its process exits, a settled
exit (no restart counted, its status kept, the node parked); input that meets it while it is being parked is
answered NO_SESSION once it is gone; a relaunch from its transcript carries its conversation on. And the hang
detector through real processes: workers stopped together are load, one stopped alone is hung."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from legion.ledger.ledger import Ledger
from legion.supervision import dispatch
from legion.supervision.child_spec import RetireTimeouts
from legion.supervision.root import RootSupervisor
from legion.supervision.rpc_child import RpcChild, RpcNode
from legion.workers.fixture_worker import ENTRY, find_marked
from legion.workers.session_service import NO_SESSION
from legion.workers.transcript import context_messages, create_empty, read_transcript, text_of
from tests.support import events, make_session_root, poller, status

pytestmark = pytest.mark.timeout(90)
FAST = RetireTimeouts(retire=3.0, signal=0.5, kill=0.5)
until = poller(30.0, 0.02)


def spec(base: Path, node: str, **extra: Any) -> dict[str, Any]:
    path = create_empty(base / "sessions" / f"{node}.jsonl")
    return {"nodeId": node, "cwd": str(base), "model": "scripted/s", "transcript": str(path),
            "scripts": {"s": {"turns": [{"text": f"{node} first"}], "default": {"text": f"{node} again"}}},
            "tools": [], "prompt": "go", **extra}


def gone(pid: int | None) -> bool:
    try:
        return pid is None or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def texts(transcript: str) -> list[str]:
    """The conversation as the model sees it (user and assistant texts)."""
    context = context_messages(read_transcript(transcript).leaf_path())
    return [text_of(m) for m in context if m.get("role") in ("user", "assistant")]


@pytest.fixture
async def parking_root(base: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[RootSupervisor]:
    """A session root whose settled rpc workers give their process back after 1.5 s (heartbeats every 0.5 s, every
    heartbeat frame the root receives recorded in `root.beats`)."""
    sup = make_session_root(base, idle_grace=1.5, max_restarts=0)
    beats: list[str] = []
    heartbeat = dispatch.HANDLERS["heartbeat"]

    async def recording(root: RootSupervisor, child: RpcChild, body: dict[str, Any], reply: bool) -> None:
        beats.append(child.id)
        return await heartbeat(root, child, body, reply)

    monkeypatch.setitem(dispatch.HANDLERS, "heartbeat", recording)
    sup.beats = beats  # type: ignore[attr-defined]
    await sup.start()
    yield sup
    if not sup._closed.is_set():
        await sup.stop(force=True)


async def test_a_settled_rpc_worker_is_quiet_then_gives_its_process_back_and_comes_back_with_its_conversation(
        base: Path, parking_root: RootSupervisor) -> None:
    root, beats = parking_root, parking_root.beats  # type: ignore[attr-defined]
    s = spec(base, "q")
    child = await root.nodes.launch_rpc_session(s, shutdown=FAST)
    pid = child.pid
    await until(lambda: child.settled, message="the session settled")
    assert "q" not in root.hang.watching()
    heard = len(beats)
    reader = root.ledger
    assert reader is not None
    # (without an orchestrator nothing records the run's outcome: the node stays as its launch left it)
    before = (status(reader, "q"), events(reader, "q"))
    await until(lambda: gone(pid), message="its process given back after the grace")
    assert beats[heard:].count("q") == 0  # not one heartbeat while it idled (3 intervals and more)
    await until(lambda: root.nodes.parked("q"), message="parked")
    assert (status(reader, "q"), events(reader, "q")) == before and not root.nodes.hosted("q")
    assert root.supervisor is not None and root.supervisor.restarts_in_window() == 0 and root.running
    # new input relaunches it from its transcript (as Orchestrator.revive does), its conversation carried on
    relaunch = {**{k: v for k, v in s.items() if k != "prompt"}, "restarted": False}  # parked: nothing was cut
    again = await root.nodes.launch_rpc_session(relaunch, resume=True, shutdown=FAST)
    assert again.pid != pid and again.settled  # started idle
    reply = await root.nodes.session_request("q", "session.prompt", text="more")
    assert reply["ok"], reply
    await until(lambda: texts(s["transcript"])[-1:] == ["q again"], message="answered after the relaunch")
    assert texts(s["transcript"]) == ["go", "q first", "more", "q again"]
    assert not root.nodes.parked("q")
    await until(lambda: again.settled, message="settled again")
    before = (status(reader, "q"), events(reader, "q"))
    await until(lambda: gone(again.pid), message="given back again after it settled again")
    await until(lambda: root.nodes.parked("q"), message="parked again")
    assert (status(reader, "q"), events(reader, "q")) == before
    assert [e["type"] for e in events(reader, "q")] == ["node_launched", "node_resumed"]


async def test_input_that_meets_a_worker_being_parked_is_answered_no_session_once_it_is_gone(
        base: Path, parking_root: RootSupervisor) -> None:
    root = parking_root
    child = await root.nodes.launch_rpc_session(spec(base, "r"), shutdown=FAST)
    await until(lambda: child.settled, message="the session settled")
    assert root.ledger is not None
    before = status(root.ledger, "r")
    root.nodes.park_idle(child)  # as its grace running out does
    reply = await root.nodes.session_request("r", "session.prompt", text="too late")
    assert reply["code"] == NO_SESSION and not reply["ok"]
    assert gone(child.pid) and root.nodes.parked("r") and not root.nodes.hosted("r")
    assert status(root.ledger, "r") == before and not events(root.ledger, "r", "node_resumed")


async def test_new_input_in_the_grace_keeps_the_process(base: Path, parking_root: RootSupervisor) -> None:
    root = parking_root
    s = spec(base, "k")
    child = await root.nodes.launch_rpc_session(s, shutdown=FAST)
    await until(lambda: child.settled, message="the session settled")
    reply = await root.nodes.session_request("k", "session.prompt", text="more")
    assert reply["ok"], reply
    assert root.nodes.worker("k") is child and not gone(child.pid)  # the same process took the input
    await until(lambda: texts(s["transcript"])[-1:] == ["k again"], message="answered")
    assert root.ledger is not None
    assert len(events(root.ledger, "k", "node_launched")) == 1 and len(events(root.ledger, "k", "node_resumed")) == 1


async def test_workers_silent_together_are_load_and_one_silent_alone_is_hung(base: Path, marker: str) -> None:
    root = RootSupervisor(base / "run", heartbeat_interval=0.5, hang_misses=4, max_restarts=5)  # hung: 2 s alone
    await root.start()
    try:
        names = ["a", "b", "c", "d"]
        kids = {n: await root.nodes.launch(RpcNode(n, ENTRY, {"marker": marker}, shutdown=FAST)) for n in names}
        pids = {n: kids[n].pid for n in names}
        for pid in pids.values():
            os.kill(pid, signal.SIGSTOP)  # type: ignore[arg-type]
        try:
            await until(lambda: all((root.hang.silent_for(n) or 0) > root.hang.limit + 0.3 for n in names),
                        message="every worker silent past the limit")
            assert root.hang.shared_silences >= 1
        finally:
            for pid in pids.values():
                os.kill(pid, signal.SIGCONT)  # type: ignore[arg-type]
        await until(lambda: all((root.hang.silent_for(n) or 0) < 1.0 for n in names), message="all heard again")
        assert not any(k.hung for k in kids.values()) and root.nodes.worker("a") is kids["a"]
        assert all(len(events(root.ledger, n, "node_launched")) == 1 for n in names)  # type: ignore[arg-type]
        os.kill(pids["a"], signal.SIGSTOP)  # type: ignore[arg-type]
        reader: Ledger = root.ledger  # type: ignore[assignment]
        await until(lambda: len(events(reader, "a", "node_launched")) >= 2, message="the lone silent worker restarted")
        assert kids["a"].hung and events(reader, "a", "node_launched")[1]["after"] == "abnormal(hung)"
        assert not any(kids[n].hung for n in ("b", "c", "d"))
    finally:
        await root.stop(force=True)
    await until(lambda: not find_marked(marker), 5, "no marked process after the root stopped")
