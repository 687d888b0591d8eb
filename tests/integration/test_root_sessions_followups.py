"""Follow-ups of the root-sessions review, through real processes: a real RootSupervisor, pool workers
from the fork server, scripted models, a real ledger file.

- a model emitting lone surrogates (text and tool arguments) neither crashes the pool nor loses events;
- a pool stopped as a bystander of a one_for_all team restart: its sessions' cut runs continue after
  the relaunch (the transcript says the cut was a worker stop), while an explicit abort stays idle;
- reopening a settled in-pool session writes node_resumed;
- a pi session reports its pi child's process group like native tool groups.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from legion.ledger.ledger import Ledger
from legion.supervision.child_spec import RetireTimeouts
from legion.supervision.root import RootSupervisor
from legion.supervision.rpc_child import RpcChild
from legion.workers.fixture_worker import MARKER_ENV, find_marked
from legion.workers.outcome import derive_outcome
from legion.workers.session import CUT_ABORT, CUT_STOP, NOTE_TYPE_RESTART, RUN_CUT_TYPE
from legion.workers.session_service import SessionService
from legion.workers.session_spec import SessionSpec
from legion.workers.transcript import create_empty, read_transcript, text_of
from tests.support import events, poller

pytestmark = pytest.mark.timeout(90)
FAST = RetireTimeouts(retire=3.0, signal=0.5, kill=0.5)
REPAIRED = "\ufffd"


until = poller(30.0, 0.02)


def spec(base: Path, node: str, script: dict[str, Any] | str, marker: str, **extra: Any) -> dict[str, Any]:
    path = create_empty(base / "sessions" / f"{node}.jsonl")
    return {"nodeId": node, "cwd": str(base), "model": "scripted/s", "transcript": str(path),
            "scripts": {"s": script}, "tools": ["bash", "ls"], "inheritEnv": False,
            "env": {MARKER_ENV: marker, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}, "prompt": "go", **extra}


def long_tool_then(done: str) -> dict[str, Any]:
    """Turn 1 runs a 60 s tool; any later turn (a continued run) answers `done`."""
    return {"turns": [{"text": "working", "tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60"}}]}],
            "default": {"text": done}}


def live_worker(root: RootSupervisor, node_id: str, not_pid: int | None = None) -> RpcChild | None:
    child = root.nodes.worker(node_id)
    if child is None or child.pid is None or child.pid == not_pid or child.ready_body is None:
        return None
    return child


def settled(root: RootSupervisor, node: str) -> Callable[[], bool]:
    return lambda: root.nodes.session_state(node) == "settled"


def entries(transcript: str) -> list[dict[str, Any]]:
    return read_transcript(transcript).entries


def cuts(transcript: str) -> list[str]:
    return [e["data"]["cause"] for e in entries(transcript) if e.get("customType") == RUN_CUT_TYPE]


def last_text(transcript: str) -> str:
    msgs = [e["message"] for e in entries(transcript) if e["type"] == "message"]
    return text_of(msgs[-1])


def restart_notes(transcript: str) -> int:
    return len([e for e in entries(transcript) if e.get("customType") == NOTE_TYPE_RESTART])


async def test_lone_surrogates_from_the_model_reach_the_root_repaired_and_the_pool_survives(
        base: Path, root: RootSupervisor, marker: str) -> None:
    seen: list[dict[str, Any]] = []
    publish = root.publish

    def spy(type_: str, body: dict[str, Any]) -> None:
        if "worker" in body:  # a session event, under its own name and node id (one name end to end)
            seen.append({"name": type_, "data": {**body, "nodeId": body["node_id"]}})
        publish(type_, body)

    root.publish = spy  # type: ignore[method-assign]
    script = base / "lone.json"  # a file: json.loads keeps the lone \ud83d escapes
    script.write_text('{"turns": [{"text": "smile \\ud83d now", "chunks": 4, "tool_calls": [{"name": "ls", '
                      '"arguments": {"path": "dir-\\ud83d"}}]}], "default": {"text": "bye \\ud83d"}}')
    await root.nodes.launch_pool("pool", shutdown=FAST)
    pid = live_worker(root, "pool").pid  # type: ignore[union-attr]
    s = spec(base, "lone", str(script), marker)
    assert await root.nodes.launch_session(s, pool="pool") == "started"
    await until(lambda: root.nodes.session_state("lone") == "settled", message="the session settled")
    await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer
    await until(lambda: any(b["name"] == "agent_settled" for b in seen if b["data"].get("nodeId") == "lone"),
                message="agent_settled at the root")
    mine = [b for b in seen if b["data"].get("nodeId") == "lone"]
    deltas = "".join(b["data"]["delta"] for b in mine if b["name"] == "text_delta")
    assert deltas == f"smile {REPAIRED} nowbye {REPAIRED}"  # nothing lost, every lone half repaired
    calls = [b["data"] for b in mine if b["name"] == "tool_call" and b["data"]["phase"] == "start"]
    assert calls and calls[0]["args"] == {"path": f"dir-{REPAIRED}"}
    assert live_worker(root, "pool").pid == pid  # type: ignore[union-attr]  # the pool never died
    assert root.control is not None and root.control.drops["unencodable"] == 0
    assert derive_outcome(s["transcript"]) == "success"
    # operator text with a lone surrogate (an undecodable argv byte) reaches the session repaired
    r = await root.nodes.session_request("lone", "session.prompt", text="again \udcff")
    assert r["ok"]
    await until(lambda: root.nodes.session_state("lone") == "settled", message="settled again")
    await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer
    users = [text_of(e["message"]) for e in entries(s["transcript"])
             if e["type"] == "message" and e["message"]["role"] == "user"]
    assert users[-1] == f"again {REPAIRED}"


async def test_bystander_pool_of_a_one_for_all_restart_continues_its_sessions(
        base: Path, root: RootSupervisor, reader: Ledger, marker: str) -> None:
    await root.nodes.launch_team("crew", strategy="one_for_all")
    await root.nodes.launch_pool("p1", parent="crew", shutdown=FAST)
    await root.nodes.launch_pool("p2", parent="crew", shutdown=FAST)
    crashed = spec(base, "a", long_tool_then("a finished"), marker)
    bystanders = {n: spec(base, n, long_tool_then(f"{n} finished"), marker) for n in ("b1", "b2")}
    assert await root.nodes.launch_session(crashed, pool="p1") == "started"
    for s in bystanders.values():
        assert await root.nodes.launch_session(s, pool="p2") == "started"
    p1 = await until(lambda: live_worker(root, "p1"), message="p1 running")
    p2 = await until(lambda: live_worker(root, "p2"), message="p2 running")
    await until(lambda: len(p1.tool_pgids) == 1 and len(p2.tool_pgids) == 2, message="three tools running")
    assert p1.pid is not None
    os.kill(p1.pid, signal.SIGKILL)
    await until(lambda: live_worker(root, "p2", not_pid=p2.pid), message="p2 restarted with the team")
    for n in ("a", "b1", "b2"):
        await until(settled(root, n), message=f"{n} resumed and finished")
    await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer
    for n, s in {"a": crashed, **bystanders}.items():
        t = s["transcript"]
        assert last_text(t) == f"{n} finished" and derive_outcome(t) == "success"
        assert restart_notes(t) == 1
        assert [e["restart"] for e in events(reader, n, "node_launched")] == [False, True]
    for s in bystanders.values():
        assert cuts(s["transcript"]) == [CUT_STOP]  # the stop that cut the run is on record
    assert cuts(crashed["transcript"]) == []  # a SIGKILL records nothing; the tool result says so
    assert not find_marked(marker)


async def test_an_explicit_abort_stays_idle_after_a_relaunch_but_a_stop_continues(base: Path, marker: str) -> None:
    """The decision is made from the transcript alone: the same relaunch continues a run its worker's
    stop cut and leaves a run an explicit abort ended idle (and continuable on new input)."""
    for cause in (CUT_ABORT, CUT_STOP):
        s = SessionSpec.from_dict(spec(base, cause, long_tool_then("finished"), marker))
        first = SessionService(send=None, request=None)
        try:
            session, _ = await first.launch(s)
            await until(first.tool_pgids, message="tool running")
            if cause == CUT_ABORT:
                assert await session.abort() == "interrupted"
        finally:
            await first.close()  # the worker stops (dispose): cause "stop" unless already aborted
        assert cuts(s.transcript) == [cause]
        second = SessionService(send=None, request=None)
        try:
            session, resumed = await second.launch(s)
            assert resumed
            if cause == CUT_STOP:
                r = await second.handle_request({"op": "session.wait", "timeoutMs": 20000})
                assert r["settled"] and r["outcome"] == "success" and last_text(s.transcript) == "finished"
            else:
                assert session.state == "idle" and last_text(s.transcript) == ""  # the aborted turn is last
                assert await session.prompt("carry on") == "accepted"  # continuable
                r = await second.handle_request({"op": "session.wait", "timeoutMs": 20000})
                assert r["settled"] and last_text(s.transcript) == "finished"
        finally:
            await second.close()
    assert not find_marked(marker)


async def test_reopening_a_settled_pool_session_writes_node_resumed(
        base: Path, root: RootSupervisor, reader: Ledger, marker: str) -> None:
    await root.nodes.launch_pool("pool", shutdown=FAST)
    await root.nodes.launch_session(spec(base, "done", {"turns": ["first"], "default": {"text": "again"}}, marker))
    await until(lambda: root.nodes.session_state("done") == "settled", message="settled")
    await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer
    # many rounds: the settle of the run a prompt starts often overtakes the prompt's reply (events and
    # replies travel separately); the facts must come out in order every time, never stuck `running`
    rounds = 15
    for _ in range(rounds):
        r = await root.nodes.session_request("done", "session.prompt", text="once more")
        assert r == {"ok": True, "disposition": "accepted"}
        await until(lambda: root.nodes.session_state("done") == "settled", 15, message="settled again")
        await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer
    assert root.lifecycle is not None
    await root.lifecycle.drained()  # facts land through the ledger writer thread, in order
    assert [e["type"] for e in events(reader, "done")] == ["node_launched", "node_settled",
                                                          *["node_resumed", "node_settled"] * rounds]
    assert all(e["reopened"] is True for e in events(reader, "done", "node_resumed"))
    assert reader.get_node("done")["status"] == "settled"
    # input a settled session does not take (a refused op) leaves it settled, with the fact recorded
    r = await root.nodes.session_request("done", "session.prompt")  # no text: INVALID_PARAMS
    assert not r["ok"] and root.nodes.session_state("done") == "settled"
    assert events(reader, "done")[-1] == {"type": "node_settled", "reason": "input_not_taken"}


FAKE_PI = Path(__file__).with_name("fake_pi.py")


@pytest.mark.skipif(not FAKE_PI.exists(), reason="fake pi fixture missing")
async def test_pi_session_reports_its_process_group(base: Path, marker: str) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []

    async def send(type_: str, body: dict[str, Any]) -> None:
        sent.append((type_, body))

    service = SessionService(send=send, request=None)
    service.start()
    try:
        s = spec(base, "pi", {"default": {"text": "x"}}, marker, engine="pi",
                 piCommand=[sys.executable, str(FAKE_PI)], prompt=None)
        session, _ = await service.launch(SessionSpec.from_dict(s))
        pgids = session.tool_pgids
        assert len(pgids) == 1
        pgid = next(iter(pgids))
        assert os.getpgid(pgid) == pgid  # the pi child leads its own group
        assert service.heartbeat_info()["toolPgids"] == [pgid]
        body = await until(lambda: next((b for t, b in sent if t == "event" and b["name"] == "tool_groups"), None),
                           message="tool_groups event for the pi group")
        assert body == {"name": "tool_groups", "nodeId": "pi", "pgids": [pgid]}
    finally:
        await service.close()
    assert service.heartbeat_info()["toolPgids"] == []


async def test_pi_wait_settled_reports_the_settle_that_woke_it(base: Path) -> None:
    """A run that starts right at the settle (pi already wrote the next user message) must not show
    through: the waiter gets the settled run's stop reason and outcome."""
    from legion.workers.context import SessionContext
    from legion.workers.pi_engine import PiSession

    path = base / "race.jsonl"
    holder: list[PiSession] = []

    def on_event(type_: str, body: dict[str, Any]) -> None:
        if type_ == "agent_settled" and len(holder) == 1:
            holder.append(holder[0])  # once: the next run starts before any waiter wakes
            session = holder[0]
            session._dispatch({"type": "agent_start"})
            with path.open("a") as f:  # what pi writes first for the next prompt
                f.write('{"type":"message","id":"next0001","parentId":null,"timestamp":"2026-01-01T00:00:00Z",'
                        '"message":{"role":"user","content":[{"type":"text","text":"next"}],"timestamp":1}}\n')

    session = await PiSession.create(context=SessionContext(node_id="race", cwd=str(base)), model="openai/gpt-4o",
                                     transcript_path=path, command=[sys.executable, str(FAKE_PI)], on_event=on_event)
    holder.append(session)
    try:
        assert await session.prompt("SLOW hello") == "accepted"  # streams for ~1 s: the waiter waits
        r = await session.wait_settled(15)
        assert r.settled and r.stop_reason == "stop" and r.outcome == "success", r
        assert session.state == "streaming"  # the next run did start
    finally:
        await session.dispose(2.0)


async def test_a_killed_pools_pi_session_group_is_swept_by_the_root(
        base: Path, root: RootSupervisor, marker: str) -> None:
    # pi wrapped so its group outlives the pool: pi exits on stdin EOF, the wrapper's `sleep` stays.
    # The session's environment is clean (inheritEnv false): only the reported group leads the root to it.
    wrapper = ["bash", "-c", f'{sys.executable} {FAKE_PI} "$@"; sleep 60', "pi"]
    await root.nodes.launch_pool("pool", shutdown=FAST)
    s = spec(base, "pi", {"default": {"text": "x"}}, marker, engine="pi", piCommand=wrapper, model="openai/gpt-4o")
    assert await root.nodes.launch_session(s, pool="pool") == "started"
    await until(lambda: root.nodes.session_state("pi") == "settled", message="the pi session answered")
    await root.lifecycle.drained()  # type: ignore[union-attr]  # facts land through the writer
    child = await until(lambda: live_worker(root, "pool"), message="pool running")
    await until(lambda: len(child.tool_pgids) == 1, message="the pi group reported to the root")
    pgid = next(iter(child.tool_pgids))
    assert {os.getpgid(p) for p in find_marked(marker)} == {pgid}
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    await until(lambda: live_worker(root, "pool", not_pid=child.pid), message="pool restarted")
    # by the reported group (pid/pgid ladder), or with the dead pool's cgroup (cgroup containment)
    cgroup = child.retire_report is not None and child.retire_report.containment == "cgroup"
    assert {p.pgid for p in child.tool_sweep} == (set() if cgroup else {pgid})
    assert not find_marked(marker)  # the wrapper's sleep, orphaned by the SIGKILL, was swept


async def test_an_rpc_session_spec_with_a_lone_surrogate_starts_repaired(
        base: Path, root: RootSupervisor, marker: str) -> None:
    s = spec(base, "solo", {"turns": ["ok"]}, marker, prompt="hi \udcff there")  # an undecodable argv byte
    await root.nodes.launch_rpc_session(s, shutdown=FAST)
    r = await root.nodes.session_request("solo", "session.wait", timeoutMs=15000)
    assert r["ok"] and r["settled"] and r["outcome"] == "success"
    users = [text_of(e["message"]) for e in entries(s["transcript"])
             if e["type"] == "message" and e["message"]["role"] == "user"]
    assert users == [f"hi {REPAIRED} there"]
