"""Lifecycle facts in a real ledger (:memory:) driven by a real Supervisor over fake children."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from legion.bus.protocol import Message
from legion.ledger import InvalidNodeError, open_ledger
from legion.ledger.ledger import Ledger
from legion.procs import RETIRE_FAILED
from legion.supervision.child_spec import ChildHandle, ChildSpec, ExitReason, ShutdownMode
from legion.supervision.lifecycle import Lifecycle, LifecycleObserver
from legion.supervision.root import RootSupervisor
from legion.supervision.rpc_child import RpcChild, RpcNode, describe_exit
from legion.supervision.supervisor import Backoff, Supervisor, supervisor_spec

pytestmark = pytest.mark.timeout(10)


class SurvivorsError(RuntimeError):
    """Looks like RetireFailed: carries the processes that survived."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(f"RETIRE_FAILED: {pids}")
        self.survivors = pids


class Fake:
    def __init__(self, child_id: str) -> None:
        self._id = child_id
        self.pid = 4242
        self.exit_future: asyncio.Future[ExitReason] = asyncio.get_running_loop().create_future()
        self.shutdown_error: Exception | None = None

    @property
    def id(self) -> str:
        return self._id

    async def wait_exit(self) -> ExitReason:
        return await asyncio.shield(self.exit_future)

    async def shutdown(self, mode: ShutdownMode) -> None:
        if self.shutdown_error is not None:
            raise self.shutdown_error
        if not self.exit_future.done():
            self.exit_future.set_result(ExitReason.shutdown())


class Kids:
    def __init__(self) -> None:
        self.handles: dict[str, list[Fake]] = {}

    def spec(self, child_id: str, restart: Any = "transient") -> ChildSpec:
        async def start() -> ChildHandle:
            handle = Fake(child_id)
            self.handles.setdefault(child_id, []).append(handle)
            return handle

        return ChildSpec(child_id, start, restart)

    def crash(self, child_id: str, detail: str = "exit code 1") -> None:
        self.handles[child_id][-1].exit_future.set_result(ExitReason.abnormal(detail))


async def settle() -> None:
    for _ in range(100):
        await asyncio.sleep(0)


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    led = open_ledger(":memory:")
    yield led
    led.close()


@pytest.fixture
def published() -> list[tuple[str, dict[str, Any]]]:
    return []


@pytest.fixture
def lifecycle(ledger: Ledger, published: list[tuple[str, dict[str, Any]]]) -> Lifecycle:
    lc = Lifecycle(ledger, lambda t, b: published.append((t, b)))
    lc.ensure_root("root")
    return lc


def facts(ledger: Ledger, node_id: str) -> list[tuple[str, dict[str, Any]]]:
    return [(e.type, e.data) for e in ledger.events_after(0, node_id=node_id)]


def status(ledger: Ledger, node_id: str) -> str:
    row = ledger.get_node(node_id)
    assert row is not None
    return str(row["status"])


def test_transitions_write_status_and_event_together(ledger: Ledger, lifecycle: Lifecycle,
                                                     published: list[tuple[str, dict[str, Any]]]) -> None:
    lifecycle.reserve("w", parent_id="root", role="worker")
    assert status(ledger, "w") == "starting"
    row = ledger.get_node("w")
    assert row is not None and row["depth"] == 1 and row["parent_id"] == "root"
    lifecycle.launched("w", pid=7, attempt=1)
    assert status(ledger, "w") == "running"
    ledger.update_node("w", phase="reviewing")
    lifecycle.retired("w", "session-shutdown")
    assert status(ledger, "w") == "retired"
    row = ledger.get_node("w")
    assert row is not None and row["phase"] == "reviewing"  # a pause never touches the phase
    assert facts(ledger, "w") == [
        ("node_launched", {"pid": 7, "attempt": 1, "restart": False}),
        ("node_retired", {"reason": "session-shutdown"}),
    ]
    assert ("node_retired", {"node_id": "w", "status": "retired", "reason": "session-shutdown"}) in published
    assert lifecycle.tree["w"]["status"] == "retired"


def test_ledger_errors_never_escape(ledger: Ledger, lifecycle: Lifecycle,
                                    published: list[tuple[str, dict[str, Any]]]) -> None:
    lifecycle.failed("no-such-node", "crash")
    assert lifecycle.errors == 1
    assert [t for t, _ in published].count("lifecycle_error") == 1
    with pytest.raises(InvalidNodeError):  # reserving comes first and must not silently fail
        lifecycle.reserve("Bad Name!", parent_id="root", role="worker")
    assert ledger.events_after(0, node_id="no-such-node") == []


async def test_observer_records_restart_escalation_and_retire(ledger: Ledger, lifecycle: Lifecycle) -> None:
    obs = LifecycleObserver(lifecycle)
    kids = Kids()
    for node_id in ("a", "b"):
        lifecycle.reserve(node_id, parent_id="root", role="worker")
    sup = Supervisor("root", children=[kids.spec("a"), kids.spec("b")], max_restarts=1,
                     backoff=Backoff(base=0.0), observer=obs)
    await sup.start()
    assert status(ledger, "a") == "running"
    kids.crash("b")
    await settle()
    assert facts(ledger, "b")[-1] == ("node_launched", {"pid": 4242, "attempt": 2, "restart": True,
                                                        "after": "abnormal(exit code 1)"})
    kids.crash("b", "signal SIGSEGV")
    await settle()
    assert sup.exit_reason == ExitReason.abnormal("restart_intensity")
    assert status(ledger, "b") == "failed"
    assert facts(ledger, "b")[-1] == ("node_failed", {"reason": "signal SIGSEGV", "supervisor": "root"})
    assert status(ledger, "a") == "retired"
    assert facts(ledger, "a")[-1] == ("node_retired", {"reason": "restart_intensity"})


async def test_failed_retire_is_node_failed_never_node_retired(ledger: Ledger, lifecycle: Lifecycle) -> None:
    obs = LifecycleObserver(lifecycle)
    kids = Kids()
    lifecycle.reserve("stuck", parent_id="root", role="worker")
    sup = Supervisor("root", children=[kids.spec("stuck")], observer=obs)
    await sup.start()
    kids.handles["stuck"][-1].shutdown_error = SurvivorsError([111, 222])
    with pytest.raises(SurvivorsError):
        await sup.terminate_child("stuck", cause="retire")  # the cause travels as an argument
    assert status(ledger, "stuck") == "failed"
    types = [t for t, _ in facts(ledger, "stuck")]
    assert "node_retired" not in types
    assert facts(ledger, "stuck")[-1][1]["reason"] == RETIRE_FAILED
    assert facts(ledger, "stuck")[-1][1]["survivors"] == [111, 222]
    assert facts(ledger, "stuck")[-1][1]["cause"] == "retire"
    await sup.stop()


async def test_strategy_bystander_is_restarted_not_retired(ledger: Ledger, lifecycle: Lifecycle) -> None:
    obs = LifecycleObserver(lifecycle)
    kids = Kids()
    for node_id in ("a", "b"):
        lifecycle.reserve(node_id, parent_id="root", role="worker")
    sup = Supervisor("root", strategy="one_for_all", children=[kids.spec("a"), kids.spec("b")], observer=obs)
    await sup.start()
    kids.crash("b")
    await settle()
    assert [t for t, _ in facts(ledger, "a")] == ["node_launched", "node_launched"]
    assert status(ledger, "a") == "running"
    await sup.stop()


async def test_team_escalation_fails_the_team_node(ledger: Ledger, lifecycle: Lifecycle) -> None:
    obs = LifecycleObserver(lifecycle)
    kids = Kids()
    lifecycle.reserve("team", parent_id="root", role="team")
    lifecycle.reserve("m", parent_id="team", role="worker")

    def make() -> Supervisor:
        return Supervisor("team", children=[kids.spec("m")], max_restarts=0, observer=obs)

    root = Supervisor("root", children=[supervisor_spec("team", make, restart="temporary")], observer=obs)
    await root.start()
    assert status(ledger, "team") == "running"
    kids.crash("m")
    await settle()
    assert status(ledger, "team") == "failed"
    assert facts(ledger, "team")[-1] == ("node_failed", {"reason": "restart_intensity", "supervisor": "root"})
    assert status(ledger, "m") == "failed"
    await root.stop()


@pytest.mark.parametrize(
    ("code", "reason"),
    [(0, ExitReason.normal()), (3, ExitReason.abnormal("exit code 3")), (-9, ExitReason.abnormal("signal SIGKILL")),
     (None, ExitReason.abnormal("exit status unknown")), (-256, ExitReason.abnormal("exit status unknown"))],
)
def test_describe_exit(code: int | None, reason: ExitReason) -> None:
    assert describe_exit(code) == reason


async def test_control_messages_are_validated_and_never_raise(tmp_path: Any) -> None:
    root = RootSupervisor(tmp_path / "run", monitor=False)
    child = RpcChild(RpcNode("w", "legion.workers.fixture_worker:main"), root)
    root.register(child)
    assert await root._on_message("w", Message("ready", "w", {"pid": "not-a-pid"})) is None
    assert root.bad_bodies == 1 and child.ready_body is None
    assert await root._on_message("w", Message("ready", "w", {"pid": True})) is None
    assert root.bad_bodies == 2
    assert await root._on_message("w", Message("log", "w", {"level": "nonsense", "msg": "x" * 10_000})) is None
    assert await root._on_message("w", Message("event", "w", {"name": "tool_call", "tool": "bash"})) is None
    assert await root._on_message("w", Message("heartbeat", "w", {})) is None
    reply = await root._on_message("w", Message("request", "w", {"op": "format_disk"}, corr="1"))
    assert reply == {"ok": False, "error": "unsupported op 'format_disk'"}
    assert await root._on_message("ghost", Message("ready", "ghost", {"pid": 1})) is None
    reply = await root._on_message("ghost", Message("request", "ghost", {"op": "x"}, corr="2"))
    assert reply is not None and reply["ok"] is False
    assert root.unknown_frames == 2
    assert await root._on_message("w", Message("ready", "w", {"pid": 1234})) is None
    assert child.ready_body == {"pid": 1234}
    root.unregister(child)
    assert root.nodes.worker("w") is None


class ClosedWaiterProc:
    """A WorkerProcess that close() released after the ladder saw the exit: its pending waiters are woken
    with the exit code (WorkerProcess.close never cancels them)."""

    pid = 99999
    returncode = -15

    async def wait(self, timeout: float | None = None) -> int | None:
        await asyncio.sleep(0)
        return self.returncode

    def is_alive(self) -> bool:
        return False


async def test_exit_is_learned_when_close_woke_the_shared_waiter(tmp_path: Any) -> None:
    root = RootSupervisor(tmp_path / "run", monitor=False)
    child = RpcChild(RpcNode("w", "legion.workers.fixture_worker:main"), root)
    child.proc = ClosedWaiterProc()
    child._stopping = True  # the ladder owns the cleanup
    await asyncio.wait_for(child._watch_exit(), 2)
    assert await asyncio.wait_for(child.wait_exit(), 1) == ExitReason.abnormal("signal SIGTERM")


class UnkillableProc:
    pid = 99998
    pgid = 99998
    returncode = None
    worker_id = "w"

    async def wait(self, timeout: float | None = None) -> int | None:
        await asyncio.Event().wait()
        return None

    def is_alive(self) -> bool:
        return True


async def test_a_hung_worker_that_cannot_be_killed_is_reported_not_left_running(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from legion.procs import ProcRef, RetireFailed, RetireReport
    from legion.supervision import rpc_child

    calls: list[bool] = []

    async def failing_retire(proc: Any, *, graceful: bool = True, timeouts: Any = None) -> RetireReport:
        calls.append(graceful)
        report = RetireReport(worker_id="w", pid=proc.pid, graceful=graceful, step="not_dead",
                              survivors=[ProcRef(pid=proc.pid, pgid=proc.pgid, create_time=0.0)])
        raise RetireFailed(report)

    monkeypatch.setattr(rpc_child, "retire_worker", failing_retire)
    root = RootSupervisor(tmp_path / "run", monitor=False)
    child = RpcChild(RpcNode("w", "legion.workers.fixture_worker:main"), root)
    child.proc = UnkillableProc()
    child._start_done = True
    root.register(child)
    child._watch_task = asyncio.create_task(child._watch_exit())
    child._on_hung("w", 0.7)
    reason = await asyncio.wait_for(child.wait_exit(), 2)
    assert reason == ExitReason.abnormal("hung; RETIRE_FAILED")
    assert calls == [False]  # killed without the graceful step
    assert root.nodes.worker("w") is None
    await asyncio.sleep(0)
    assert child._watch_task.cancelled() or child._watch_task.done()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None)
@given(
    type_=st.sampled_from(["ready", "heartbeat", "event", "log", "request", "shutdown", "reply"]),
    extra=st.dictionaries(st.text(max_size=10), json_values, max_size=5),
    sender=st.sampled_from(["w", "ghost"]),
    corr=st.none() | st.text(min_size=1, max_size=5),
)
def test_control_handler_never_raises_on_any_valid_frame(
    type_: str, extra: dict[str, Any], sender: str, corr: str | None
) -> None:
    required = {"event": {"name": "x"}, "log": {"level": "info", "msg": "m"}, "request": {"op": "o"}}
    body = {**extra, **required.get(type_, {})}

    async def run() -> None:
        root = RootSupervisor("/nonexistent/run", monitor=False)
        child = RpcChild(RpcNode("w", "legion.workers.fixture_worker:main"), root)
        root.register(child)
        result = await root._on_message(sender, Message(type_, sender, body, corr))
        assert result is None or isinstance(result, dict)
        if corr is None:
            assert result is None

    asyncio.run(run())


async def test_drained_waits_for_the_facts_before_it_and_not_for_later_ones(tmp_path: Any) -> None:
    """`drained`: returns once the facts submitted before it have landed and been published (no write of its own),
    and facts submitted after it do not hold it (a busy root's launches never wait on each other's facts)."""
    import threading

    from legion.ledger import LedgerWriter

    path = tmp_path / "legion.db"
    led = open_ledger(path)
    writer = LedgerWriter(path)
    published: list[tuple[str, str]] = []
    life = Lifecycle(led, lambda type_, body: published.append((type_, str(body.get("node_id")))), writer=writer)
    gate, held = threading.Event(), threading.Event()

    def hold(_led: Ledger) -> None:  # the writer thread waits here: everything queued behind it waits too
        held.set()
        gate.wait(5)

    try:
        life.ensure_root("root")
        await life.drained()
        await life.drained()  # nothing submitted since: at once
        blocker = writer.submit(hold, "hold")
        assert await asyncio.to_thread(held.wait, 5)
        life.reserve("w1", parent_id="root", role="worker")
        first = asyncio.ensure_future(life.drained())
        await asyncio.sleep(0.05)
        assert not first.done()  # its fact has not landed
        life.reserve("w2", parent_id="root", role="worker")  # submitted after the first drain
        gate.set()
        await asyncio.wait_for(first, 5)
        assert "w1" in {n for _, n in published}  # landed, and published before the drain returned
        await asyncio.wait_for(life.drained(), 5)
        assert {n for _, n in published} >= {"w1", "w2"}
        assert led.get_node("w1") is not None and led.get_node("w2") is not None
        blocker.result(5)
        assert await asyncio.to_thread(writer.close, 5)  # (its count of landed ops is kept after the results)
        assert writer.ops == 4  # ensure_root, hold, w1, w2: no write of the drains' own
    finally:
        gate.set()
        writer.close(5)
        led.close()
