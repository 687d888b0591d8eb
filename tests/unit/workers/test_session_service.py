"""SessionSpec validation and SessionService request routing (in-process, fake send/request)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from legion.workers.pool import PoolLimits
from legion.workers.session_service import SessionService
from legion.workers.session_spec import SessionSpec, SpecError
from tests.support import poller

pytestmark = pytest.mark.timeout(30)


def spec(tmp_path: Path, node: str, **extra: Any) -> dict[str, Any]:
    return {"nodeId": node, "cwd": str(tmp_path), "model": "scripted/s", "transcript": str(tmp_path / f"{node}.jsonl"),
            "scripts": {"s": {"default": {"text": "ok"}}}, **extra}


until = poller(10.0, 0.005)


@pytest.mark.parametrize(("patch", "message"), [
    ({"nodeId": ""}, "spec.nodeId is required"),
    ({"modle": "x"}, "unknown key 'modle'"),
    ({"budget": {"turns": 1}}, "spec.budget: unknown key 'turns'"),
    ({"budget": {"turnBudget": -1}}, "turn_budget must be a non-negative integer"),
    ({"env": {"A": 1}}, "spec.env must map names to string values"),
    ({"tools": "bash"}, "spec.tools must be list"),
    ({"depth": True}, "spec.depth must be int"),
    ({"config": {"fsync": "sometimes"}}, "fsync must be one of"),
])
def test_spec_errors(tmp_path: Path, patch: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        SessionSpec.from_dict({**spec(tmp_path, "n"), **patch})


def test_spec_round_trip(tmp_path: Path) -> None:
    s = SessionSpec.from_dict(spec(tmp_path, "n", team="red", role="worker", acceptanceRole="read-only",
                                   budget={"turnBudget": 3, "toolTimeoutMs": 500}, env={"K": "v"},
                                   config={"emptyRetries": 1, "emptyBackoffMs": 5, "fsync": "always"}))
    assert s.context.team == "red" and s.context.read_only and s.context.budget.turn_budget == 3
    assert s.context.env["K"] == "v" and s.context.env["PATH"] == os.environ["PATH"]
    assert s.config.empty_retries == 1 and s.config.empty_backoff_s == 0.005
    alone = SessionSpec.from_dict(spec(tmp_path, "n", env={"K": "v"}, inheritEnv=False))
    assert dict(alone.context.env) == {"K": "v"}


class Usage:
    def __init__(self) -> None:
        self.rows: dict[str, tuple[int, int, float, int]] = {}

    def upsert_usage(self, node_id: str, tokens_in: int, tokens_out: int, cost_usd: float,
                     unknown_cost_tokens: int = 0) -> None:
        self.rows[node_id] = (tokens_in, tokens_out, cost_usd, unknown_cost_tokens)


async def test_service_routes_ops_and_streams_events(tmp_path: Path) -> None:
    sent: list[tuple[str, dict[str, Any]]] = []

    async def send(type_: str, body: dict[str, Any]) -> None:
        sent.append((type_, body))

    async def request(type_: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        return {"ok": False, "text": "refused by the root"}

    usage = Usage()
    svc = SessionService(send=send, request=request, limits=PoolLimits(max_active=2, max_queued=1), ledger=usage)
    svc.start()
    script = {"turns": [{"tool_calls": [{"name": "legion_tree", "arguments": {}}]}, {"text": "fine"}]}
    r = await svc.handle_request({"op": "session.launch", "spec": spec(tmp_path, "a", scripts={"s": script},
                                                                       tools=["legion_tree"], prompt="go")})
    assert r == {"ok": True, "status": "started", "resumed": False}
    r = await svc.handle_request({"op": "session.wait", "timeoutMs": 5000})
    assert r["outcome"] == "success"
    await until(lambda: any(b["name"] == "agent_settled" for _, b in sent))
    assert usage.rows["a"][1] > 0
    tool_events = [b for _, b in sent if b["name"] == "tool_call"]
    assert [b["phase"] for b in tool_events] == ["start", "end"] and tool_events[1]["isError"] is True
    r = await svc.handle_request({"op": "session.launch", "spec": spec(tmp_path, "b")})
    assert r["status"] == "started"
    r = await svc.handle_request({"op": "session.steer", "text": "x"})
    assert not r["ok"] and "nodeId is required" in r["error"]
    r = await svc.handle_request({"op": "session.steer", "nodeId": "zz", "text": "x"})
    assert not r["ok"] and "no session 'zz'" in r["error"] and "hosted: a, b" in r["error"]
    r = await svc.handle_request({"op": "session.launch", "spec": spec(tmp_path, "c")})
    assert r == {"ok": True, "status": "queued"}
    r = await svc.handle_request({"op": "session.launch", "spec": spec(tmp_path, "d")})
    assert r["code"] == "QUEUE_FULL"
    r = await svc.handle_request({"op": "session.admission"})  # what the root's admission gate asks
    assert r == {"ok": True, "slots": ["a", "b"], "queued": ["c"], "maxActive": 2, "maxQueued": 1}
    r = await svc.handle_request({"op": "session.launch", "spec": spec(tmp_path, "a")})
    assert r["code"] == "DUPLICATE"
    r = await svc.handle_request({"op": "session.retire", "nodeId": "a"})
    assert r["found"]
    await until(lambda: any(b["name"] == "session_started" and b["nodeId"] == "c" for _, b in sent))
    r = await svc.handle_request({"op": "session.list"})
    assert r["sessions"] == {"b": "idle", "c": "idle"}
    r = await svc.handle_request({"op": "session.stats"})
    assert set(r["stats"]) == {"b", "c"}
    r = await svc.handle_request({"op": "session.wait", "nodeId": "b", "timeoutMs": -1})
    assert r["code"] == "INVALID_PARAMS"
    await svc.close()
    assert svc.host.active_count == 0


async def test_launch_failure_is_reported_not_raised(tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []

    async def send(type_: str, body: dict[str, Any]) -> None:
        sent.append(body)

    svc = SessionService(send=send, request=None, limits=PoolLimits(max_active=1, max_queued=2))
    svc.start()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"not": "pi"}\n')
    r = await svc.handle_request({"op": "session.launch", "spec": {**spec(tmp_path, "x"), "transcript": str(bad)}})
    assert r["code"] == "START_FAILED" and "not a pi session file" in r["error"]
    await svc.handle_request({"op": "session.launch", "spec": spec(tmp_path, "a")})
    r = await svc.handle_request({"op": "session.launch", "spec": {**spec(tmp_path, "y"), "transcript": str(bad)}})
    assert r["status"] == "queued"
    await svc.handle_request({"op": "session.retire", "nodeId": "a"})
    await until(lambda: any(b["name"] == "launch_failed" for b in sent))
    failed = next(b for b in sent if b["name"] == "launch_failed")
    assert failed["nodeId"] == "y" and failed["code"] == "START_FAILED"
    await svc.close()


async def test_two_sessions_never_share_a_transcript(tmp_path: Path) -> None:
    svc = SessionService(send=None, request=None)
    await svc.handle_request({"op": "session.launch", "spec": spec(tmp_path, "a")})
    r = await svc.handle_request({"op": "session.launch",
                                  "spec": {**spec(tmp_path, "b"), "transcript": str(tmp_path / "x" / ".." / "a.jsonl")}})
    assert r["code"] == "DUPLICATE" and "already in use by session 'a'" in r["error"]
    await svc.close()


async def test_legion_tool_error_reply_is_shown(tmp_path: Path) -> None:
    async def request(type_: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        return {"ok": False, "error": "unsupported op 'legion.tool'"}

    script = {"turns": [{"tool_calls": [{"name": "legion_tree", "arguments": {}}]}, {"text": "ok"}]}
    svc = SessionService(send=None, request=request)
    await svc.handle_request({"op": "session.launch", "spec": spec(tmp_path, "a", scripts={"s": script},
                                                                   tools=["legion_tree"], prompt="go")})
    await svc.handle_request({"op": "session.wait", "timeoutMs": 5000})
    session = svc.host.get("a")
    assert session is not None
    result = session.transcript.messages()[2]
    assert result["isError"] and result["content"][0]["text"] == "legion_tree failed: unsupported op 'legion.tool'"
    await svc.close()


async def test_usage_reaches_a_real_ledger(tmp_path: Path) -> None:
    from legion.ledger import open_ledger

    ledger = open_ledger(tmp_path / "legion.db")
    try:
        ledger.insert_node(id="u1", name="u1", role="worker", depth=1)
        script = {"turns": [{"text": "one", "usage": {"input": 100, "output": 40, "cacheRead": 10, "cost": 0.5}}]}
        svc = SessionService(send=None, request=None, ledger=ledger)
        await svc.handle_request({"op": "session.launch", "spec": spec(tmp_path, "u1", scripts={"s": script},
                                                                       prompt="go")})
        await svc.handle_request({"op": "session.wait", "timeoutMs": 5000})
        await svc.close()
        row = ledger.get_usage("u1")
        assert row is not None
        assert (row["tokens_in"], row["tokens_out"], row["cost_usd"]) == (110, 40, 0.5)
    finally:
        ledger.close()


def test_the_run_s_totals_hold_when_a_usage_write_lands_between_two_reads(tmp_path: Path) -> None:
    """The budget gates read the run's totals while the writer thread lands this worker's usage: a write that lands
    during the read must not count the node's old row against its new one (a CI run let a third turn run past a
    spent fleet budget when the totals were two reads and the write landed between them)."""
    from legion.ledger import Ledger, open_ledger

    class Landing(Ledger):
        pending: tuple[str, int, int, float] | None = None

        def usage_totals(self, node_ids: list[str] | None = None, *,
                         excluding: list[str] | None = None) -> dict[str, Any]:
            out = super().usage_totals(node_ids, excluding=excluding)
            if self.pending is not None:  # the writer thread commits just after this read
                row, self.pending = self.pending, None
                self.upsert_usage(*row)
            return out

    open_ledger(tmp_path / "legion.db").close()
    ledger = Landing(tmp_path / "legion.db")
    try:
        for node in ("u1", "u2"):
            ledger.insert_node(id=node, name=node, role="worker", depth=1)
        ledger.upsert_usage("u1", 10, 1, 0.1)
        ledger.upsert_usage("u2", 5, 1, 0.05)
        svc = SessionService(send=None, request=None, ledger=ledger)
        svc._latest_usage["u1"] = {"tokens_in": 20, "tokens_out": 2, "cost_usd": 0.2, "unknown_cost_tokens": 0}
        ledger.pending = ("u1", 20, 2, 0.2)
        totals = svc._run_totals()
        assert (totals["tokens_in"], totals["tokens_out"]) == (25, 3)
        assert totals["cost_usd"] == pytest.approx(0.25)
    finally:
        ledger.close()


async def test_a_session_event_leaves_before_its_ledger_heartbeat_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The beat is a ledger write behind the run's write lock: a session's `turn_start` (the rpc launch latency's
    end) must not wait for it. (Beats every 0 s here: a launch is a stamp, so a session beats first after the
    interval.)"""
    from legion.ledger import Ledger, open_ledger
    from legion.workers import session_service

    monkeypatch.setattr(session_service, "_HEARTBEAT_S", 0.0)

    order: list[str] = []

    class Recording(Ledger):
        def heartbeat(self, node_id: str) -> None:
            order.append("beat")
            super().heartbeat(node_id)

    async def send(type_: str, body: dict[str, Any]) -> None:
        order.append(f"sent {body['name']}")

    ticks = iter(range(1_000, 10**9, 1_000))
    open_ledger(tmp_path / "legion.db").close()
    ledger = Recording(tmp_path / "legion.db", clock=lambda: next(ticks))
    try:
        ledger.insert_node(id="b1", name="b1", role="worker", depth=1)
        before = ledger.get_node("b1")["updated_at"]
        svc = SessionService(send=send, request=None, ledger=ledger)
        svc.start()
        await svc.handle_request({"op": "session.launch", "spec": spec(tmp_path, "b1", prompt="go")})
        await svc.handle_request({"op": "session.wait", "timeoutMs": 5000})
        await until(lambda: "sent agent_settled" in order)
        await svc.close()
        assert order.index("sent turn_start") < order.index("beat")
        assert ledger.get_node("b1")["updated_at"] > before  # and it was written
    finally:
        ledger.close()


async def test_a_settled_transcript_is_synced_by_the_ledger_writer_not_on_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/architecture.md §5, "Durability": the settle's sync joins the writer's group commit (one syncfs for
    every transcript of it, before the batch that carries the settle's usage), instead of an fsync on the loop."""
    from legion.ledger import LedgerWriter, open_ledger
    from legion.ledger import writer as writer_module

    ledger = open_ledger(tmp_path / "legion.db")
    writer = LedgerWriter(tmp_path / "legion.db", linger=0.05)
    synced: list[list[str]] = []
    real_sync = writer_module.sync_paths
    monkeypatch.setattr(writer_module, "sync_paths", lambda paths: (synced.append(list(paths)), real_sync(paths))[1])
    fsyncs: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    try:
        ledger.insert_node(id="t1", name="t1", role="worker", depth=1)
        svc = SessionService(send=None, request=None, ledger=ledger, writer=writer)
        await svc.handle_request({"op": "session.launch", "spec": spec(tmp_path, "t1", prompt="go")})
        await svc.handle_request({"op": "session.wait", "timeoutMs": 5000})
        await svc.close()  # disposes the session: its close asks for a sync too
        assert await asyncio.to_thread(writer.close, 10.0)
        transcript = str(tmp_path / "t1.jsonl")
        assert any(transcript in files for files in synced), synced
        assert fsyncs == []  # no fsync of the transcript on the event loop (syncfs took them all)
        assert writer.synced_files >= 1 and ledger.get_usage("t1") is not None
    finally:
        ledger.close()


async def test_the_budget_reader_opens_with_the_first_budgeted_session_and_closes_with_the_service(
        tmp_path: Path) -> None:
    """A worker's second ledger connection is opened for the budgets only (`open_reader`): sessions without a
    budget never open it; the first one with a budget opens it once, its gate reads the real ledger there, and
    `close` closes it."""
    from legion.ledger import Ledger, open_ledger

    opened: list[Ledger] = []
    closed: list[Ledger] = []

    class Reader(Ledger):
        def close(self) -> None:
            closed.append(self)
            super().close()

    def open_reader() -> Ledger:
        reader = Reader(tmp_path / "legion.db")
        opened.append(reader)
        return reader

    ledger = open_ledger(tmp_path / "legion.db")
    try:
        for node in ("p1", "b1", "b2", "spent"):
            ledger.insert_node(id=node, name=node, role="worker", depth=1)
        ledger.upsert_usage("spent", 900, 100, 1.0)
        svc = SessionService(send=None, request=None, open_reader=open_reader)
        await svc.handle_request({"op": "session.launch", "spec": spec(tmp_path, "p1", prompt="go")})
        await svc.handle_request({"op": "session.wait", "timeoutMs": 5000})
        assert opened == [] and svc.ledger is None
        budget = {"maxTokens": 500}  # the ledger already holds 1,000 tokens: the gate refuses the model call
        for node in ("b1", "b2"):
            await svc.handle_request({"op": "session.launch",
                                      "spec": spec(tmp_path, node, prompt="go", treeBudget=budget)})
        assert len(opened) == 1 and svc.ledger is opened[0]
        for node in ("b1", "b2"):  # refused by the gate, which read the 1,000 tokens through the reader
            await until(lambda n=node: "token budget is spent (1000 of 500)" in (tmp_path / f"{n}.jsonl").read_text())
        assert "token budget" not in Path(tmp_path / "p1.jsonl").read_text()
        await svc.close()
        assert closed == opened
    finally:
        ledger.close()


async def test_a_launch_is_its_node_s_first_stamp(tmp_path: Path) -> None:
    """The root wrote the node's row (its `updated_at`) to launch it: a session working less than the stamp
    interval (5 s) writes no stamp of its own, only its usage."""
    from legion.ledger import Ledger, open_ledger

    beats: list[str] = []

    class Recording(Ledger):
        def heartbeat(self, node_id: str) -> None:
            beats.append(node_id)
            super().heartbeat(node_id)

    open_ledger(tmp_path / "legion.db").close()
    ledger = Recording(tmp_path / "legion.db")
    try:
        ledger.insert_node(id="q1", name="q1", role="worker", depth=1)
        svc = SessionService(send=None, request=None, ledger=ledger)
        await svc.handle_request({"op": "session.launch", "spec": spec(tmp_path, "q1", prompt="go")})
        await svc.handle_request({"op": "session.wait", "timeoutMs": 5000})
        await svc.close()
        assert beats == [] and ledger.get_usage("q1") is not None
    finally:
        ledger.close()


async def test_an_rpc_session_that_settles_at_once_carries_its_usage_in_its_settle(tmp_path: Path) -> None:
    """An rpc worker's `HeldWriter`: the usage of a session that settles within the hold travels in its
    `agent_settled` event, and no ledger writer is ever opened; a session whose tool outlives the hold gets its
    writer opened, and then writes its usage (and the transcript's sync) itself."""
    from legion.ledger import LedgerWriter, open_ledger
    from legion.workers.held_writer import HeldWriter

    ledger = open_ledger(tmp_path / "legion.db")
    opened: list[LedgerWriter] = []

    def opener() -> LedgerWriter:
        opened.append(LedgerWriter(tmp_path / "legion.db", linger=0.01))
        return opened[-1]

    async def run(node: str, script: dict[str, Any]) -> dict[str, Any]:
        sent: list[dict[str, Any]] = []

        async def send(type_: str, body: dict[str, Any]) -> None:
            sent.append(body)

        writer = HeldWriter(opener, 0.05)
        svc = SessionService(send=send, request=None, writer=writer)
        svc.start()
        await svc.handle_request({"op": "session.launch", "spec": spec(tmp_path, node, scripts={"s": script},
                                                                       prompt="go")})
        await svc.handle_request({"op": "session.wait", "timeoutMs": 10000})
        await until(lambda: any(b["name"] == "agent_settled" for b in sent))
        await svc.close()
        assert await writer.aclose(10.0)
        return next(b for b in sent if b["name"] == "agent_settled")

    try:
        for node in ("fast", "slow"):
            ledger.insert_node(id=node, name=node, role="worker", depth=1)
        usage = {"input": 100, "output": 40, "cacheRead": 10, "cost": 0.5}
        settled = await run("fast", {"turns": [{"text": "done", "usage": usage}]})
        assert opened == [] and ledger.get_usage("fast") is None
        carried = settled["usage"]
        assert {k: carried[k] for k in ("tokens_in", "tokens_out", "cost_usd", "unknown_cost_tokens")} == {
            "tokens_in": 110, "tokens_out": 40, "cost_usd": 0.5, "unknown_cost_tokens": 0}
        assert isinstance(carried["at"], int) and carried["at"] > 0

        slow = {"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 0.5"}}], "usage": usage},
                          {"text": "done", "usage": usage}]}
        settled = await run("slow", slow)
        assert len(opened) == 1 and "usage" not in settled
        row = ledger.get_usage("slow")
        assert row is not None and (row["tokens_in"], row["tokens_out"]) == (220, 80)
    finally:
        ledger.close()
