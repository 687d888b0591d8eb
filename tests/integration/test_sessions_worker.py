"""Session workers as real processes (fork server + control channel): the rpc worker hosting one
session, crash-restart resuming from the transcript, the pool worker's admission queue and pool crash."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from legion.bus.control import ControlServer, PeerUnavailable
from legion.bus.protocol import Message
from legion.supervision.spawn import DEFAULT_PRELOAD, WorkerProcess, WorkerSpawner, WorkerStart
from legion.workers.outcome import derive_outcome
from legion.workers.session import NOTE_TYPE_RESTART
from legion.workers.transcript import create_empty, read_transcript, text_of
from tests.support import poller

pytestmark = pytest.mark.timeout(60)
RPC = "legion.workers.session_worker:main"
POOL = "legion.workers.session_worker:pool_main"
PRELOAD = (*DEFAULT_PRELOAD, "legion.workers.session_worker")


@dataclass
class FakeRoot:
    """Plays the root: records frames, answers legion tool requests."""

    ready: dict[str, Message] = field(default_factory=dict)
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    tool_requests: list[dict[str, Any]] = field(default_factory=list)

    async def __call__(self, worker_id: str, msg: Message) -> dict[str, Any] | None:
        if msg.type == "ready":
            self.ready[worker_id] = msg
        elif msg.type == "event":
            self.events.append((worker_id, dict(msg.body)))
        elif msg.type == "request" and msg.body.get("op") == "legion.tool":
            self.tool_requests.append(dict(msg.body))
            return {"ok": True, "text": f"mail #{len(self.tool_requests)} sent", "details": {"id": 1}}
        return None

    def names(self, node: str) -> list[str]:
        return [b["name"] for _, b in self.events if b.get("nodeId") == node]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sw")


@pytest.fixture(scope="module")
def spawner(run_dir: Path) -> Iterator[WorkerSpawner]:
    sp = WorkerSpawner(f"ipc://{run_dir}/ctl.sock", preload=PRELOAD)
    sp.start()
    yield sp
    sp.close()


@pytest.fixture
async def root(run_dir: Path) -> AsyncIterator[tuple[FakeRoot, ControlServer]]:
    fake = FakeRoot()
    server = ControlServer(f"ipc://{run_dir}/ctl.sock", on_message=fake)
    await server.start()
    yield fake, server
    await server.close()


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for w in started:
        w.signal(signal.SIGKILL)
        w.wait_blocking(5)
        w.close()


until = poller(20.0, 0.01, await_result=True)


async def ready_from(fake: FakeRoot, worker_id: str, proc: WorkerProcess) -> Message:
    """The `ready` of this incarnation: a restarted worker reuses the id, and its predecessor's ready can
    still be in flight (the session and its tool start before that frame is handled) when the test looks."""
    await until(lambda: (m := fake.ready.get(worker_id)) is not None and m.body.get("pid") == proc.pid)
    return fake.ready[worker_id]


async def gone(server: ControlServer, worker_id: str) -> None:
    """The server no longer routes to the killed incarnation. Without admission (this fake root) a peer's
    identity is its name, and a ROUTER refuses a second connection under a name still connected: a restart that
    connects before the server has dropped its predecessor's connection would never be heard."""

    async def unroutable() -> bool:
        try:
            await server.send(worker_id, "heartbeat", {})
        except PeerUnavailable:
            return True
        return False

    await until(unroutable, message=f"{worker_id!r}'s dead connection to be dropped")


def spec(tmp_path: Path, node: str, script: dict[str, Any], **extra: Any) -> dict[str, Any]:
    path = create_empty(tmp_path / "sessions" / f"{node}.jsonl")
    return {"nodeId": node, "cwd": str(tmp_path), "model": "scripted/s", "transcript": str(path),
            "scripts": {"s": script}, "tools": ["bash", "read", "legion_mail"], "team": "red", **extra}


async def req(server: ControlServer, worker: str, op: str, **body: Any) -> dict[str, Any]:
    reply = await server.request(worker, "request", {"op": op, **body}, timeout=15)
    return dict(reply.body)


async def test_rpc_worker_hosts_a_session(tmp_path: Path, spawner: WorkerSpawner, root: tuple[FakeRoot, ControlServer],
                                          workers: list[WorkerProcess]) -> None:
    fake, server = root
    script = {"turns": [{"text": "mailing", "tool_calls": [
        {"name": "legion_mail", "arguments": {"to": "parent", "subject": "hi", "body": "done soon"}}]},
        {"text": "all done"}], "default": {"text": "again"}}
    s = spec(tmp_path, "alpha", script, prompt="start working")
    w = spawner.spawn(WorkerStart("alpha", RPC, s, heartbeat_interval=0.2))
    workers.append(w)
    await until(lambda: "alpha" in fake.ready)
    assert fake.ready["alpha"].body["resumed"] is False
    r = await req(server, "alpha", "session.wait", timeoutMs=15000)
    assert r["ok"] and r["settled"] and r["outcome"] == "success"
    assert fake.tool_requests == [{"op": "legion.tool", "tool": "legion_mail", "nodeId": "alpha", "callId": "call_0_0",
                                   "args": {"to": "parent", "subject": "hi", "body": "done soon"}}]
    await until(lambda: "agent_settled" in fake.names("alpha"))
    names = fake.names("alpha")
    assert names[:2] == ["session_started", "turn_start"] and "tool_call" in names and "text_delta" in names
    msgs = [e["message"] for e in read_transcript(s["transcript"]).entries if e["type"] == "message"]
    assert text_of(msgs[2]) == "mail #1 sent"
    r = await req(server, "alpha", "session.steer", text="one more")
    assert r == {"ok": True, "disposition": "accepted"}
    r = await req(server, "alpha", "session.wait", timeoutMs=15000)
    assert r["outcome"] == "success"
    r = await req(server, "alpha", "session.abort")
    assert r == {"ok": True, "outcome": "no-turn"}
    r = await req(server, "alpha", "session.stats")
    assert r["stats"]["turns"] == 3
    r = await req(server, "alpha", "session.fly")
    assert not r["ok"] and r["code"] == "UNKNOWN_OP" and "session.prompt" in r["error"]
    r = await req(server, "alpha", "session.prompt", text=5)
    assert not r["ok"] and "text is required" in r["error"]
    w.close_lifeline()
    assert await w.wait(10) == 0


async def test_rpc_worker_crash_restart_resumes(tmp_path: Path, spawner: WorkerSpawner,
                                                root: tuple[FakeRoot, ControlServer],
                                                workers: list[WorkerProcess]) -> None:
    fake, server = root
    marker = tmp_path / "tool.started"
    script = {"turns": [{"text": "running", "tool_calls": [{"name": "bash", "arguments": {
        "command": f"if [ -f {marker} ]; then echo second-time; else echo $$ > {tmp_path}/pgid; touch {marker}; "
                   "sleep 60; fi"}}]},
        {"text": "finished after restart"}]}
    s = spec(tmp_path, "beta", script, prompt="do it")
    w1 = spawner.spawn(WorkerStart("beta", RPC, s, heartbeat_interval=0.2))
    workers.append(w1)
    await until(marker.exists)
    await ready_from(fake, "beta", w1)  # handled before the kill: it cannot pass for the restart's
    before = Path(s["transcript"]).read_bytes()
    w1.signal(signal.SIGKILL)
    assert await w1.wait(10) == -signal.SIGKILL
    os.killpg(int((tmp_path / "pgid").read_text()), signal.SIGKILL)  # what the root's post-exit sweep does
    assert Path(s["transcript"]).read_bytes() == before  # nothing appended is lost
    await gone(server, "beta")
    fake.ready.clear()
    w2 = spawner.spawn(WorkerStart("beta", RPC, s, heartbeat_interval=0.2))
    workers.append(w2)
    assert (await ready_from(fake, "beta", w2)).body["resumed"] is True
    r = await req(server, "beta", "session.wait", timeoutMs=15000)
    assert r["outcome"] == "success"
    data = read_transcript(s["transcript"])
    assert data.header is not None and Path(s["transcript"]).read_bytes().startswith(before)
    notes = [e for e in data.entries if e.get("customType") == NOTE_TYPE_RESTART]
    assert len(notes) == 1
    roles = [e["message"]["role"] for e in data.entries if e["type"] == "message"]
    assert roles == ["user", "assistant", "toolResult", "assistant"]  # the first prompt was not re-sent
    assert derive_outcome(s["transcript"]) == "success"


async def test_pool_worker_admission_and_crash(tmp_path: Path, spawner: WorkerSpawner,
                                               root: tuple[FakeRoot, ControlServer],
                                               workers: list[WorkerProcess]) -> None:
    fake, server = root
    args = {"inprocess": {"maxActive": 1, "maxQueuedLaunches": 1}}
    pool = spawner.spawn(WorkerStart("pool", POOL, args, heartbeat_interval=0.2))
    workers.append(pool)
    await until(lambda: "pool" in fake.ready)
    assert fake.ready["pool"].body["maxActive"] == 1
    script = {"turns": [{"text": "ok"}]}
    a, b, c = (spec(tmp_path, n, script, prompt="go") for n in ("pa", "pb", "pc"))
    assert await req(server, "pool", "session.launch", spec=a) == {"ok": True, "status": "started", "resumed": False}
    assert await req(server, "pool", "session.launch", spec=b) == {"ok": True, "status": "queued"}
    r = await req(server, "pool", "session.launch", spec=c)
    assert not r["ok"] and r["code"] == "QUEUE_FULL"
    r = await req(server, "pool", "session.launch", spec={"nodeId": "x"})
    assert not r["ok"] and r["code"] == "INVALID_PARAMS" and "spec.cwd is required" in r["error"]
    await until(lambda: "launch_queued" in fake.names("pb"))
    assert (await req(server, "pool", "session.wait", nodeId="pa", timeoutMs=10000))["outcome"] == "success"
    r = await req(server, "pool", "session.retire", nodeId="pa")
    assert r["found"] and r["survivors"] == []
    await until(lambda: "session_started" in fake.names("pb"))
    assert fake.names("pb").index("launch_admitted") < fake.names("pb").index("session_started")
    assert (await req(server, "pool", "session.wait", nodeId="pb", timeoutMs=10000))["outcome"] == "success"
    # the pool crashes; a new pool resumes pb from its transcript
    pool.signal(signal.SIGKILL)
    await pool.wait(10)
    await gone(server, "pool")
    fake.ready.clear()
    pool2 = spawner.spawn(WorkerStart("pool", POOL, args, heartbeat_interval=0.2))
    workers.append(pool2)
    await ready_from(fake, "pool", pool2)
    r = await req(server, "pool", "session.launch", spec={**b, "prompt": "go"})
    # its last run had ended: nothing to continue, the prompt is not re-sent, so it is idle at once
    assert r == {"ok": True, "status": "started", "resumed": True, "idle": True, "outcome": "success", "ends": 1}
    r = await req(server, "pool", "session.list")
    assert r["sessions"] == {"pb": "idle"}
    notes = [e for e in read_transcript(b["transcript"]).entries if e.get("customType") == NOTE_TYPE_RESTART]
    assert len(notes) == 1
    pool2.close_lifeline()
    assert await pool2.wait(10) == 0


async def test_pool_crash_with_sessions_in_flight_resumes_all(tmp_path: Path, spawner: WorkerSpawner,
                                                              root: tuple[FakeRoot, ControlServer],
                                                              workers: list[WorkerProcess]) -> None:
    fake, server = root

    def script(node: str) -> dict[str, Any]:
        marker = tmp_path / f"{node}.started"
        cmd = (f"if [ -f {marker} ]; then echo rerun; else echo $$ > {tmp_path}/{node}.pgid; touch {marker}; "
               "sleep 60; fi")
        return {"turns": [{"text": "working", "tool_calls": [{"name": "bash", "arguments": {"command": cmd}}]},
                          {"text": f"{node} finished"}]}

    specs = [spec(tmp_path, n, script(n), prompt="go") for n in ("f1", "f2", "f3")]
    pool = spawner.spawn(WorkerStart("pool2", POOL, {}, heartbeat_interval=0.2))
    workers.append(pool)
    await until(lambda: "pool2" in fake.ready)
    for s in specs:
        assert (await req(server, "pool2", "session.launch", spec=s))["status"] == "started"
    await until(lambda: all((tmp_path / f"{n}.started").exists() for n in ("f1", "f2", "f3")))
    pool.signal(signal.SIGKILL)
    await pool.wait(10)
    for n in ("f1", "f2", "f3"):  # the root's post-exit sweep of the dead pool's leftovers
        os.killpg(int((tmp_path / f"{n}.pgid").read_text()), signal.SIGKILL)
    await gone(server, "pool2")
    fake.ready.clear()
    pool = spawner.spawn(WorkerStart("pool2", POOL, {}, heartbeat_interval=0.2))
    workers.append(pool)
    await ready_from(fake, "pool2", pool)
    for s in specs:
        assert await req(server, "pool2", "session.launch", spec=s) == {"ok": True, "status": "started",
                                                                          "resumed": True}
    for n, s in zip(("f1", "f2", "f3"), specs, strict=True):
        r = await req(server, "pool2", "session.wait", nodeId=n, timeoutMs=15000)
        assert r["outcome"] == "success"
        msgs = [e["message"] for e in read_transcript(s["transcript"]).entries if e["type"] == "message"]
        assert text_of(msgs[-1]) == f"{n} finished"
        assert "worker stopped while this tool call was running" in text_of(msgs[2])
    pool.close_lifeline()
    assert await pool.wait(10) == 0


async def test_graceful_pool_stop_interrupts_turns_and_leaves_no_tool_process(
        tmp_path: Path, spawner: WorkerSpawner, root: tuple[FakeRoot, ControlServer],
        workers: list[WorkerProcess]) -> None:
    fake, server = root
    pidfile = tmp_path / "tool.pid"
    script = {"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": f"echo $$ > {pidfile}; sleep 60"}}]}]}
    pool = spawner.spawn(WorkerStart("pool3", POOL, {}, heartbeat_interval=0.2))
    workers.append(pool)
    await until(lambda: "pool3" in fake.ready)
    s = spec(tmp_path, "g1", script, prompt="go")
    assert (await req(server, "pool3", "session.launch", spec=s))["status"] == "started"
    await until(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
    tool_pid = int(pidfile.read_text())
    pool.close_lifeline()
    assert await pool.wait(10) == 0
    assert not Path(f"/proc/{tool_pid}").exists() or "Z" in Path(f"/proc/{tool_pid}/stat").read_text().split()[2]
    msgs = [e["message"] for e in read_transcript(s["transcript"]).entries if e["type"] == "message"]
    assert msgs[-1]["role"] == "assistant" and msgs[-1]["stopReason"] == "aborted"
    assert derive_outcome(s["transcript"]) == "aborted"
