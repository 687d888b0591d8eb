"""OTP supervisor semantics, in the spirit of OTP's supervisor_SUITE (fake children, manual clock)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from legion.supervision.child_spec import (
    BRUTAL_KILL,
    ChildHandle,
    ChildSpec,
    ChildSpecError,
    ExitKind,
    ExitReason,
    RestartType,
    RetireTimeouts,
    ShutdownMode,
)
from legion.supervision.supervisor import (
    Backoff,
    ChildAlreadyPresent,
    ChildNotFound,
    ChildRunning,
    ShutdownTimeout,
    StartFailed,
    Strategy,
    Supervisor,
    SupervisorNotRunning,
    SupervisorObserver,
    supervisor_spec,
)

pytestmark = pytest.mark.timeout(10)
NO_BACKOFF = Backoff(base=0.0)


class ManualClock:
    """Monotonic clock and sleep under test control: sleeps resolve only when `advance` passes them."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.now + delay, fut))
        await fut

    async def advance(self, dt: float) -> None:
        self.now += dt
        for due, fut in list(self._sleepers):
            if due <= self.now and not fut.done():
                fut.set_result(None)
        self._sleepers = [(d, f) for d, f in self._sleepers if not f.done()]
        await settle()


async def settle(rounds: int = 100) -> None:
    """Let every ready task run (all children are in-loop fakes: no real I/O to wait for)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


class FakeHandle:
    def __init__(self, child_id: str, world: World) -> None:
        self._id = child_id
        self.world = world
        self.exit_future: asyncio.Future[ExitReason] = asyncio.get_running_loop().create_future()
        self.shutdown_modes: list[ShutdownMode] = []
        self.block_shutdown: asyncio.Event | None = None
        self.shutdown_error: Exception | None = None

    @property
    def id(self) -> str:
        return self._id

    async def wait_exit(self) -> ExitReason:
        return await asyncio.shield(self.exit_future)

    def exit(self, reason: ExitReason) -> None:
        if not self.exit_future.done():
            self.exit_future.set_result(reason)

    async def shutdown(self, mode: ShutdownMode) -> None:
        self.world.log.append(("stop", self._id))
        self.shutdown_modes.append(mode)
        if self.block_shutdown is not None:
            await self.block_shutdown.wait()
        if self.shutdown_error is not None:
            raise self.shutdown_error
        self.exit(ExitReason.shutdown())


class World:
    """Builds child specs whose starts and stops are logged in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.handles: dict[str, list[FakeHandle]] = {}
        self.fail_starts: dict[str, int] = {}

    def spec(
        self,
        child_id: str,
        restart: RestartType = "transient",
        shutdown: ShutdownMode | None = None,
        significant: bool = False,
    ) -> ChildSpec:
        async def start() -> ChildHandle:
            if self.fail_starts.get(child_id, 0) > 0:
                self.fail_starts[child_id] -= 1
                self.log.append(("start_failed", child_id))
                raise RuntimeError(f"{child_id} refuses to start")
            handle = FakeHandle(child_id, self)
            self.handles.setdefault(child_id, []).append(handle)
            self.log.append(("start", child_id))
            return handle

        return ChildSpec(child_id, start, restart, shutdown or RetireTimeouts(), significant)

    def current(self, child_id: str) -> FakeHandle:
        return self.handles[child_id][-1]

    def starts(self, child_id: str) -> int:
        return len(self.handles.get(child_id, []))

    def mark(self) -> int:
        return len(self.log)

    def since(self, mark: int) -> list[tuple[str, str]]:
        return self.log[mark:]


class Recorder(SupervisorObserver):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def child_started(self, sup: Supervisor, child_id: str, handle: ChildHandle, *, restart: bool) -> None:
        self.events.append(("started", sup.id, child_id, restart))

    def child_exited(self, sup: Supervisor, child_id: str, reason: ExitReason, *, restarting: bool) -> None:
        self.events.append(("exited", sup.id, child_id, reason, restarting))

    def child_terminated(self, sup: Supervisor, child_id: str, error: BaseException | None, *, why: str,
                         cause: str | None = None) -> None:
        self.events.append(("terminated", sup.id, child_id, error, why))

    def child_start_failed(self, sup: Supervisor, child_id: str, error: BaseException) -> None:
        self.events.append(("start_failed", sup.id, child_id))

    def supervisor_exited(self, sup: Supervisor, reason: ExitReason) -> None:
        self.events.append(("sup_exited", sup.id, reason))


def make_sup(world: World, specs: list[ChildSpec], clock: ManualClock | None = None, **kwargs: Any) -> Supervisor:
    clock = clock or ManualClock()
    kwargs.setdefault("backoff", NO_BACKOFF)
    return Supervisor("sup", children=specs, clock=clock, sleep=clock.sleep, rand=lambda: 0.5, **kwargs)


REASONS = {
    "normal": ExitReason.normal(),
    "shutdown": ExitReason.shutdown(),
    "abnormal": ExitReason.abnormal("crash"),
}
# restart type x exit reason -> is the exiting child restarted (OTP restart policy)
POLICY = {
    ("permanent", "normal"): True,
    ("permanent", "shutdown"): True,
    ("permanent", "abnormal"): True,
    ("transient", "normal"): False,
    ("transient", "shutdown"): False,
    ("transient", "abnormal"): True,
    ("temporary", "normal"): False,
    ("temporary", "shutdown"): False,
    ("temporary", "abnormal"): False,
}
# strategy -> (siblings stopped in this order, children started in this order) when b is restarted
STRATEGY_EFFECT: dict[str, tuple[list[str], list[str]]] = {
    "one_for_one": ([], ["b"]),
    "one_for_all": (["c", "a"], ["a", "b", "c"]),
    "rest_for_one": (["c"], ["b", "c"]),
}


@pytest.mark.parametrize("strategy", ["one_for_one", "one_for_all", "rest_for_one"])
@pytest.mark.parametrize("restart", ["permanent", "transient", "temporary"])
@pytest.mark.parametrize("why", ["normal", "shutdown", "abnormal"])
async def test_strategy_restart_type_exit_reason_table(strategy: Strategy, restart: RestartType, why: str) -> None:
    world = World()
    sup = make_sup(world, [world.spec("a", "permanent"), world.spec("b", restart), world.spec("c", "permanent")],
                   strategy=strategy)
    await sup.start()
    assert world.log == [("start", "a"), ("start", "b"), ("start", "c")]
    mark = world.mark()
    world.current("b").exit(REASONS[why])
    await settle()
    if POLICY[(restart, why)]:
        stopped, started = STRATEGY_EFFECT[strategy]
        assert world.since(mark) == [("stop", x) for x in stopped] + [("start", x) for x in started]
        assert all(info.running for info in sup.which_children())
    else:
        assert world.since(mark) == []
        ids = [info.id for info in sup.which_children()]
        if restart == "temporary":
            assert ids == ["a", "c"]  # a temporary child is forgotten once it stops
        else:
            assert ids == ["a", "b", "c"]
            assert not next(i for i in sup.which_children() if i.id == "b").running
    assert sup.state == "running"
    await sup.stop()


@pytest.mark.parametrize("strategy", ["one_for_all", "rest_for_one"])
async def test_temporary_bystanders_are_stopped_and_never_restarted(strategy: Strategy) -> None:
    world = World()
    sup = make_sup(world, [world.spec("a", "temporary"), world.spec("b", "permanent"), world.spec("c", "temporary")],
                   strategy=strategy)
    await sup.start()
    mark = world.mark()
    world.current("b").exit(ExitReason.abnormal("crash"))
    await settle()
    if strategy == "one_for_all":
        assert world.since(mark) == [("stop", "c"), ("stop", "a"), ("start", "b")]
        assert [i.id for i in sup.which_children()] == ["b"]
    else:
        assert world.since(mark) == [("stop", "c"), ("start", "b")]
        assert [i.id for i in sup.which_children()] == ["a", "b"]
    await sup.stop()


@pytest.mark.parametrize("strategy", ["one_for_all", "rest_for_one"])
async def test_a_temporary_bystander_is_reported_stopped_for_good_and_its_node_retired(strategy: Strategy) -> None:
    """The observer must not be told "strategy" (restarted next) for a child that is never restarted."""
    from legion.ledger import open_ledger
    from legion.supervision.lifecycle import Lifecycle, LifecycleObserver

    world, rec, ledger = World(), Recorder(), open_ledger(":memory:")
    lifecycle = Lifecycle(ledger)
    lifecycle.ensure_root()
    for node_id in ("a", "b"):
        lifecycle.reserve(node_id, parent_id="root", role="worker")

    class Both(LifecycleObserver):
        def child_terminated(self, sup: Supervisor, child_id: str, error: BaseException | None, *, why: str,
                         cause: str | None = None) -> None:
            rec.child_terminated(sup, child_id, error, why=why)
            super().child_terminated(sup, child_id, error, why=why)

    sup = make_sup(world, [world.spec("a", "permanent"), world.spec("b", "temporary")], strategy=strategy,
                   observer=Both(lifecycle))  # fmt: skip
    await sup.start()
    world.current("a").exit(ExitReason.abnormal("crash"))
    await settle()
    assert rec.events == [("terminated", "sup", "b", None, "bystander")]
    assert [i.id for i in sup.which_children()] == ["a"]
    node_b = ledger.get_node("b")
    assert node_b is not None and node_b["status"] == "retired"  # not "starting" forever
    await sup.stop()
    ledger.close()


async def test_one_for_all_also_starts_siblings_that_had_stopped_like_otp() -> None:
    world = World()
    sup = make_sup(world, [world.spec("a", "transient"), world.spec("b", "permanent")], strategy="one_for_all")
    await sup.start()
    world.current("a").exit(ExitReason.normal())
    await settle()
    assert not sup.which_children()[0].running
    mark = world.mark()
    world.current("b").exit(ExitReason.abnormal("crash"))
    await settle()
    assert world.since(mark) == [("start", "a"), ("start", "b")]
    await sup.stop()


async def crash(world: World, child_id: str, clock: ManualClock | None = None, dt: float = 0.0) -> None:
    if clock is not None and dt:
        await clock.advance(dt)
    world.current(child_id).exit(ExitReason.abnormal("crash"))
    await settle()


@pytest.mark.parametrize("max_restarts", [0, 1, 3, 5])
async def test_escalation_at_exactly_intensity_plus_one(max_restarts: int) -> None:
    world, clock, rec = World(), ManualClock(), Recorder()
    sup = make_sup(world, [world.spec("a", "permanent"), world.spec("b", "transient"), world.spec("c", "permanent")],
                   clock, max_restarts=max_restarts, restart_period=60.0, observer=rec)
    await sup.start()
    for n in range(max_restarts):
        await crash(world, "b", clock, dt=1.0)
        assert sup.state == "running", f"escalated at restart {n + 1} of {max_restarts}"
        assert world.starts("b") == n + 2
    mark = world.mark()
    await crash(world, "b", clock, dt=1.0)
    assert sup.state == "stopped"
    assert sup.exit_reason == ExitReason.abnormal("restart_intensity")
    assert sup.escalated_by == ("b", ExitReason.abnormal("crash"))
    assert world.since(mark) == [("stop", "c"), ("stop", "a")]  # reverse start order, b not restarted
    assert not any(i.running for i in sup.which_children())
    assert rec.events[-1] == ("sup_exited", "sup", ExitReason.abnormal("restart_intensity"))
    assert ("exited", "sup", "b", ExitReason.abnormal("crash"), False) in rec.events  # not "restarting"
    assert [e[2] for e in rec.events if e[0] == "terminated" and e[4] == "restart_intensity"] == ["c", "a"]
    assert await asyncio.wait_for(sup.wait_exit(), 1) == ExitReason.abnormal("restart_intensity")


async def test_intensity_is_counted_per_supervisor_across_children() -> None:
    world, clock = World(), ManualClock()
    sup = make_sup(world, [world.spec("a", "permanent"), world.spec("b", "permanent")], clock, max_restarts=2)
    await sup.start()
    await crash(world, "a", clock, 1)
    await crash(world, "b", clock, 1)
    assert sup.state == "running"
    await crash(world, "a", clock, 1)
    assert sup.exit_reason == ExitReason.abnormal("restart_intensity")


@pytest.mark.parametrize("restart", ["permanent", "transient"])
@pytest.mark.parametrize("strategy", ["one_for_one", "one_for_all"])
async def test_a_settled_childs_exit_is_not_restarted_nor_counted(restart: RestartType, strategy: Strategy) -> None:
    """A child whose handle says `settled` (its work ended: the process only caches it) exits: no restart, no stamp
    in the intensity window, its spec forgotten, `settled_child_exited` reported — however many such exits come."""
    world, clock = World(), ManualClock()
    dropped: list[tuple[str, ExitReason]] = []

    class Rec(Recorder):
        def settled_child_exited(self, sup: Supervisor, child_id: str, reason: ExitReason) -> None:
            dropped.append((child_id, reason))

    rec = Rec()
    names = ["a", "b", "c", "d", "e"]
    sup = make_sup(world, [world.spec(n, restart) for n in names], clock, strategy=strategy, max_restarts=3,
                   observer=rec)
    await sup.start()
    mark = world.mark()
    for n in names:  # five kills within one period: more than the intensity of 3
        world.current(n).settled = True  # type: ignore[attr-defined]
        world.current(n).exit(ExitReason.abnormal("signal SIGKILL"))
        await clock.advance(1.0)
    assert sup.state == "running" and sup.restarts_in_window() == 0
    assert world.since(mark) == []  # nothing restarted, no sibling stopped
    assert dropped == [(n, ExitReason.abnormal("signal SIGKILL")) for n in names]
    assert sup.which_children() == [] and not [e for e in rec.events if e[0] == "exited"]
    await sup.start_child(world.spec("a", restart))  # relaunched on demand: a fresh start
    assert world.starts("a") == 2


async def test_window_slides_old_restarts_fall_out() -> None:
    world, clock = World(), ManualClock()
    sup = make_sup(world, [world.spec("w", "permanent")], clock, max_restarts=3, restart_period=60.0)
    await sup.start()
    await crash(world, "w", clock, 0.0)  # t=0
    await crash(world, "w", clock, 10.0)  # t=10
    await crash(world, "w", clock, 10.0)  # t=20
    assert sup.restarts_in_window() == 3
    await crash(world, "w", clock, 41.0)  # t=61: the t=0 restart fell out -> 3 in window
    assert sup.state == "running"
    assert sup.restarts_in_window() == 3
    await crash(world, "w", clock, 1.0)  # t=62: 10, 20, 61, 62 -> 4 > 3
    assert sup.exit_reason == ExitReason.abnormal("restart_intensity")


@pytest.mark.parametrize(("gap", "escalates"), [(60.0, True), (60.001, False)])
async def test_window_boundary_is_inclusive_as_otp(gap: float, escalates: bool) -> None:
    world, clock = World(), ManualClock()
    sup = make_sup(world, [world.spec("w", "permanent")], clock, max_restarts=1, restart_period=60.0)
    await sup.start()
    await crash(world, "w", clock)
    await crash(world, "w", clock, gap)
    assert (sup.state == "stopped") is escalates


async def test_stop_shuts_children_down_in_reverse_order_with_their_modes() -> None:
    world, rec = World(), Recorder()
    ladder = RetireTimeouts(retire=0.5, signal=0.1, kill=0.1)
    sup = make_sup(world, [world.spec("a", shutdown=ladder), world.spec("b", shutdown=BRUTAL_KILL), world.spec("c")],
                   observer=rec)
    await sup.start()
    mark = world.mark()
    assert await sup.stop() == ExitReason.shutdown()
    assert world.since(mark) == [("stop", "c"), ("stop", "b"), ("stop", "a")]
    assert world.current("a").shutdown_modes == [ladder]
    assert world.current("b").shutdown_modes == [BRUTAL_KILL]
    assert world.current("c").shutdown_modes == [RetireTimeouts()]
    assert sup.state == "stopped"
    assert [e[2] for e in rec.events if e[0] == "terminated"] == ["c", "b", "a"]
    assert await sup.stop() == ExitReason.shutdown()  # idempotent
    with pytest.raises(SupervisorNotRunning):
        await sup.start_child(world.spec("d"))


async def test_brutal_stop_propagates_brutal_kill_to_every_child() -> None:
    world = World()
    sup = make_sup(world, [world.spec("a"), world.spec("b")])
    await sup.start()
    await sup.stop(brutal=True)
    assert world.current("a").shutdown_modes == [BRUTAL_KILL]
    assert world.current("b").shutdown_modes == [BRUTAL_KILL]


async def test_a_stopping_supervisor_never_restarts() -> None:
    world = World()
    sup = make_sup(world, [world.spec("a", "permanent"), world.spec("b", "permanent")])
    await sup.start()
    gate = asyncio.Event()
    world.current("b").block_shutdown = gate
    stopping = asyncio.create_task(sup.stop())
    await settle()
    assert world.log[-1] == ("stop", "b")
    world.current("a").exit(ExitReason.abnormal("crash"))  # crashes while the supervisor is stopping
    await settle()
    gate.set()
    await asyncio.wait_for(stopping, 2)
    assert world.starts("a") == 1 and world.starts("b") == 1
    assert sup.state == "stopped"


async def test_stop_cancels_a_pending_backoff_restart() -> None:
    world, clock, rec = World(), ManualClock(), Recorder()
    sup = make_sup(world, [world.spec("w", "permanent")], clock, backoff=Backoff(base=1.0, jitter=0.0),
                   observer=rec)
    await sup.start()
    await crash(world, "w")  # first restart: immediate
    assert world.starts("w") == 2
    await crash(world, "w")  # second: waits 1 s
    assert world.starts("w") == 2 and clock.sleeps == [1.0]
    assert sup.which_children()[0].restarting
    await sup.stop()
    await clock.advance(5.0)
    assert world.starts("w") == 2
    assert rec.events[-2] == ("terminated", "sup", "w", None, "stop")  # the observer learns it is stopped
    assert not sup.which_children()[0].restarting


async def test_backoff_first_restart_immediate_then_exponential_with_jitter_and_cap() -> None:
    world, clock = World(), ManualClock()
    backoff = Backoff(base=0.1, factor=2.0, cap=0.5, jitter=0.2)
    sup = make_sup(world, [world.spec("w", "permanent")], clock, max_restarts=10, backoff=backoff)
    await sup.start()
    await crash(world, "w")
    assert world.starts("w") == 2 and clock.sleeps == []  # immediate
    expected = [0.1 * 0.9, 0.2 * 0.9, 0.4 * 0.9, 0.5 * 0.9, 0.5 * 0.9]  # rand=0.5, jitter 0.2 -> x0.9
    for n, delay in enumerate(expected):
        await crash(world, "w")
        assert clock.sleeps[-1] == pytest.approx(delay)
        await clock.advance(delay * 0.99)
        assert world.starts("w") == n + 2, "restarted before its backoff elapsed"
        await clock.advance(delay * 0.02)
        assert world.starts("w") == n + 3
    assert len(clock.sleeps) == len(expected)


async def test_backoff_resets_when_the_window_empties() -> None:
    world, clock = World(), ManualClock()
    sup = make_sup(world, [world.spec("w", "permanent")], clock, backoff=Backoff(base=1.0, jitter=0.0),
                   restart_period=10.0)
    await sup.start()
    await crash(world, "w")
    await crash(world, "w")
    await clock.advance(1.0)
    assert world.starts("w") == 3 and clock.sleeps == [1.0]
    await crash(world, "w", clock, 30.0)  # window empty again: immediate
    assert world.starts("w") == 4 and clock.sleeps == [1.0]


def test_backoff_delay_formula() -> None:
    b = Backoff(base=0.05, factor=2.0, cap=1.0, jitter=0.5)
    assert b.delay(1, 0.9) == 0.0
    assert b.delay(2, 0.0) == pytest.approx(0.05)
    assert b.delay(3, 1.0) == pytest.approx(0.05)  # 0.1 * (1 - 0.5)
    assert b.delay(20, 0.0) == pytest.approx(1.0)
    with pytest.raises(ChildSpecError):
        Backoff(jitter=2.0)


async def test_supervisor_responsive_during_backoff() -> None:
    world, clock = World(), ManualClock()
    sup = make_sup(world, [world.spec("w", "permanent")], clock, backoff=Backoff(base=5.0, jitter=0.0))
    await sup.start()
    await crash(world, "w")
    await crash(world, "w")
    handle = await asyncio.wait_for(sup.start_child(world.spec("x")), 1)  # not blocked by the 5 s backoff
    assert handle.id == "x"
    await sup.terminate_child("w")  # cancels the pending restart
    await clock.advance(10.0)
    assert world.starts("w") == 2
    await sup.stop()


async def test_failed_restart_counts_against_intensity_and_is_retried() -> None:
    world, clock, rec = World(), ManualClock(), Recorder()
    sup = make_sup(world, [world.spec("w", "permanent")], clock, max_restarts=3, observer=rec,
                   backoff=Backoff(base=0.5, jitter=0.0))
    await sup.start()
    world.fail_starts["w"] = 1
    await crash(world, "w")
    assert world.log[-1] == ("start_failed", "w")
    assert sup.restarts_in_window() == 2
    await clock.advance(0.5)
    assert world.log[-1] == ("start", "w")
    assert sup.state == "running"
    world.fail_starts["w"] = 5
    await crash(world, "w")  # 3rd restart waits its backoff, then fails -> the 4th count escalates
    assert clock.sleeps == [0.5, 1.0] and sup.state == "running"
    await clock.advance(1.0)
    assert sup.exit_reason == ExitReason.abnormal("restart_intensity")
    assert ("start_failed", "sup", "w") in rec.events
    exited = [e for e in rec.events if e[0] == "exited"]
    assert exited[-1][3].detail.startswith("start_failed") and exited[-1][4] is False


async def test_start_failure_stops_started_children_and_raises() -> None:
    world = World()
    world.fail_starts["b"] = 1
    sup = make_sup(world, [world.spec("a"), world.spec("b"), world.spec("c")])
    with pytest.raises(StartFailed) as info:
        await sup.start()
    assert info.value.child_id == "b"
    assert world.log == [("start", "a"), ("start_failed", "b"), ("stop", "a")]
    assert sup.state == "stopped" and sup.exit_reason is not None and sup.exit_reason.is_abnormal


async def test_start_returning_a_non_handle_is_a_start_failure() -> None:
    async def bad() -> Any:
        return 42

    sup = Supervisor("s")
    await sup.start()
    with pytest.raises(StartFailed, match="not a ChildHandle"):
        await sup.start_child(ChildSpec("bad", bad))
    assert sup.which_children() == []
    await sup.stop()


async def test_wait_exit_raising_or_bad_reason_is_an_abnormal_exit() -> None:
    world = World()
    sup = make_sup(world, [world.spec("a"), world.spec("b")])
    await sup.start()
    world.current("a").exit_future.set_exception(RuntimeError("lost"))
    world.current("b").exit_future.set_result("garbage")
    await settle()
    assert world.starts("a") == 2 and world.starts("b") == 2  # transient: abnormal -> restarted
    await sup.stop()


async def test_shutdown_error_is_reported_and_the_rest_still_stop() -> None:
    world, rec = World(), Recorder()
    sup = make_sup(world, [world.spec("a"), world.spec("b")], observer=rec)
    await sup.start()
    world.current("b").shutdown_error = RuntimeError("RETIRE_FAILED")
    await sup.stop()
    assert world.log[-2:] == [("stop", "b"), ("stop", "a")]
    errors = {e[2]: e[3] for e in rec.events if e[0] == "terminated"}
    assert isinstance(errors["b"], RuntimeError) and errors["a"] is None


# ----- dynamic children ----------------------------------------------------------------------------


async def test_dynamic_children_start_terminate_delete_restart() -> None:
    world = World()
    sup = make_sup(world, [world.spec("a")])
    await sup.start()
    handle = await sup.start_child(world.spec("b"))
    assert handle is world.current("b") and sup.handle_of("b") is handle
    await sup.start_child(world.spec("t", "temporary"))
    assert [i.id for i in sup.which_children()] == ["a", "b", "t"]
    with pytest.raises(ChildAlreadyPresent):
        await sup.start_child(world.spec("b"))
    with pytest.raises(ChildRunning):
        await sup.delete_child("b")
    await sup.terminate_child("b")
    assert world.log[-1] == ("stop", "b")
    assert [(i.id, i.running) for i in sup.which_children()] == [("a", True), ("b", False), ("t", True)]
    await settle()
    assert world.starts("b") == 1  # supervisor-initiated stop is never restarted
    await sup.restart_child("b")
    assert world.starts("b") == 2 and sup.restarts_in_window() == 0
    await sup.terminate_child("t")
    assert [i.id for i in sup.which_children()] == ["a", "b"]  # temporary spec is forgotten
    await sup.terminate_child("b")
    await sup.delete_child("b")
    assert [i.id for i in sup.which_children()] == ["a"]
    with pytest.raises(ChildNotFound):
        await sup.terminate_child("b")
    with pytest.raises(ChildNotFound):
        await sup.delete_child("zzz")
    world.fail_starts["c"] = 1
    with pytest.raises(StartFailed):
        await sup.start_child(world.spec("c"))
    assert [i.id for i in sup.which_children()] == ["a"]
    mark = world.mark()
    await sup.stop()
    assert world.since(mark) == [("stop", "a")]


async def test_dynamic_children_follow_strategy_order() -> None:
    world = World()
    sup = make_sup(world, [world.spec("a", "permanent")], strategy="rest_for_one")
    await sup.start()
    await sup.start_child(world.spec("b", "permanent"))
    await sup.start_child(world.spec("c", "permanent"))
    mark = world.mark()
    await crash(world, "b")
    assert world.since(mark) == [("stop", "c"), ("start", "b"), ("start", "c")]
    await sup.stop()


# ----- significant children and auto_shutdown -------------------------------------------------------


def test_significant_child_validation() -> None:
    world = World()
    with pytest.raises(ChildSpecError, match="auto_shutdown"):
        Supervisor("s", children=[world.spec("x", "transient", significant=True)])
    with pytest.raises(ChildSpecError, match="cannot be permanent"):
        world.spec("x", "permanent", significant=True)


@pytest.mark.parametrize(
    ("restart", "why", "shuts_down"),
    [
        ("transient", "normal", True),
        ("transient", "shutdown", True),
        ("transient", "abnormal", False),  # restarted instead
        ("temporary", "normal", True),
        ("temporary", "abnormal", True),
    ],
)
async def test_any_significant(restart: RestartType, why: str, shuts_down: bool) -> None:
    world = World()
    sup = make_sup(world, [world.spec("other", "permanent"), world.spec("sig", restart, significant=True)],
                   auto_shutdown="any_significant")
    await sup.start()
    world.current("sig").exit(REASONS[why])
    await settle()
    if shuts_down:
        assert sup.exit_reason == ExitReason.shutdown("auto_shutdown")
        assert world.log[-1] == ("stop", "other")
    else:
        assert sup.state == "running" and world.starts("sig") == 2
        await sup.stop()


async def test_all_significant_waits_for_the_last_one() -> None:
    world = World()
    sup = make_sup(world, [world.spec("s1", significant=True), world.spec("n"), world.spec("s2", significant=True)],
                   auto_shutdown="all_significant")
    await sup.start()
    world.current("s1").exit(ExitReason.normal())
    world.current("n").exit(ExitReason.normal())
    await settle()
    assert sup.state == "running"
    world.current("s2").exit(ExitReason.normal())
    await settle()
    assert sup.exit_reason == ExitReason.shutdown("auto_shutdown")


async def test_supervisor_terminating_a_significant_child_is_no_auto_shutdown() -> None:
    world = World()
    sup = make_sup(world, [world.spec("sig", significant=True), world.spec("b")], auto_shutdown="any_significant")
    await sup.start()
    await sup.terminate_child("sig")
    await settle()
    assert sup.state == "running"
    await sup.stop()


async def test_significant_bystander_in_one_for_all_is_no_auto_shutdown() -> None:
    world = World()
    sup = make_sup(world, [world.spec("sig", significant=True), world.spec("b", "permanent")],
                   strategy="one_for_all", auto_shutdown="any_significant")
    await sup.start()
    await crash(world, "b")
    assert sup.state == "running" and world.starts("sig") == 2
    await sup.stop()


# ----- nesting ----------------------------------------------------------------------------------------


def team_factory(world: World, clock: ManualClock, rec: Recorder, made: list[Supervisor],
                 **kwargs: Any) -> Callable[[], Supervisor]:
    def make() -> Supervisor:
        kwargs.setdefault("max_restarts", 1)
        sup = Supervisor("team", children=[world.spec("w1", "permanent"), world.spec("w2", "permanent")],
                         clock=clock, sleep=clock.sleep, backoff=NO_BACKOFF, observer=rec, **kwargs)
        made.append(sup)
        return sup

    return make


async def test_nested_escalation_restarts_the_team_under_its_parent() -> None:
    world, clock, rec = World(), ManualClock(), Recorder()
    made: list[Supervisor] = []
    root = Supervisor("root", children=[world.spec("sibling", "permanent"),
                                        supervisor_spec("team", team_factory(world, clock, rec, made))],
                      clock=clock, sleep=clock.sleep, backoff=NO_BACKOFF, observer=rec)
    await root.start()
    assert world.log == [("start", "sibling"), ("start", "w1"), ("start", "w2")]
    await crash(world, "w1")
    assert made[0].state == "running"
    mark = world.mark()
    await crash(world, "w1")  # team: 2 restarts > 1 -> escalates
    assert made[0].exit_reason == ExitReason.abnormal("restart_intensity")
    assert ("exited", "root", "team", ExitReason.abnormal("restart_intensity"), True) in rec.events
    assert world.since(mark) == [("stop", "w2"), ("start", "w1"), ("start", "w2")]  # fresh team
    assert len(made) == 2 and made[1].state == "running" and made[1].restarts_in_window() == 0
    assert root.restarts_in_window() == 1
    mark = world.mark()
    await root.stop()
    assert world.since(mark) == [("stop", "w2"), ("stop", "w1"), ("stop", "sibling")]


async def test_nested_escalation_chains_up_to_the_root() -> None:
    world, clock, rec = World(), ManualClock(), Recorder()
    made: list[Supervisor] = []
    root = Supervisor("root", max_restarts=0,
                      children=[world.spec("sibling", "permanent"),
                                supervisor_spec("team", team_factory(world, clock, rec, made))],
                      clock=clock, sleep=clock.sleep, backoff=NO_BACKOFF, observer=rec)
    await root.start()
    await crash(world, "w2")
    await crash(world, "w2")
    assert root.exit_reason == ExitReason.abnormal("restart_intensity")
    assert root.escalated_by == ("team", ExitReason.abnormal("restart_intensity"))
    assert world.log[-1] == ("stop", "sibling")
    assert not any(i.running for i in root.which_children())


async def test_temporary_team_is_not_restarted_after_escalation() -> None:
    world, clock, rec = World(), ManualClock(), Recorder()
    made: list[Supervisor] = []
    root = Supervisor("root", children=[supervisor_spec("team", team_factory(world, clock, rec, made),
                                                        restart="temporary")],
                      clock=clock, sleep=clock.sleep, backoff=NO_BACKOFF, observer=rec)
    await root.start()
    await crash(world, "w1")
    await crash(world, "w1")
    assert len(made) == 1 and root.which_children() == [] and root.state == "running"
    await root.stop()


async def test_parent_brutal_kill_of_a_team_reaches_its_children() -> None:
    world, clock, rec = World(), ManualClock(), Recorder()
    made: list[Supervisor] = []
    root = Supervisor("root", children=[supervisor_spec("team", team_factory(world, clock, rec, made))])
    await root.start()
    await root.stop(brutal=True)
    assert world.current("w1").shutdown_modes == [BRUTAL_KILL]
    assert made[0].exit_reason is not None and made[0].exit_reason.kind is ExitKind.SHUTDOWN


async def test_auto_shutdown_of_a_team_is_a_shutdown_exit_for_the_parent() -> None:
    world, rec = World(), Recorder()

    def make() -> Supervisor:
        return Supervisor("team", auto_shutdown="any_significant", observer=rec,
                          children=[world.spec("lead", "transient", significant=True), world.spec("m")])

    root = Supervisor("root", children=[supervisor_spec("team", make)], observer=rec)
    await root.start()
    world.current("lead").exit(ExitReason.normal())
    await settle()
    assert ("exited", "root", "team", ExitReason.shutdown("auto_shutdown"), False) in rec.events
    assert [(i.id, i.running) for i in root.which_children()] == [("team", False)]  # transient: not restarted
    await root.stop()


# ----- flags and specs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"strategy": "simple_one_for_one"},
        {"max_restarts": -1},
        {"max_restarts": 1.5},
        {"restart_period": 0},
        {"auto_shutdown": "sometimes"},
    ],
)
def test_bad_supervisor_flags_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ChildSpecError):
        Supervisor("s", **kwargs)


def test_bad_child_specs_are_refused() -> None:
    async def start() -> ChildHandle:
        raise AssertionError

    with pytest.raises(ChildSpecError, match="restart"):
        ChildSpec("x", start, restart="sometimes")
    with pytest.raises(ChildSpecError, match="shutdown"):
        ChildSpec("x", start, shutdown="later")
    with pytest.raises(ChildSpecError, match="child id"):
        ChildSpec("", start)
    with pytest.raises(ValueError, match=r"RetireTimeouts\.retire"):
        RetireTimeouts(retire=-1)
    with pytest.raises(ChildSpecError, match="duplicate"):
        Supervisor("s", children=[ChildSpec("x", start), ChildSpec("x", start)])
    assert ChildSpec("x", start).restart == "transient"


async def test_keep_stopped_specs_false_never_revives_a_settled_child() -> None:
    world = World()
    sup = make_sup(world, [world.spec("settled"), world.spec("retired"), world.spec("b", "permanent")],
                   strategy="one_for_all", keep_stopped_specs=False)
    await sup.start()
    world.current("settled").exit(ExitReason.normal())
    await settle()
    await sup.terminate_child("retired")
    assert [i.id for i in sup.which_children()] == ["b"]  # both specs forgotten
    mark = world.mark()
    await crash(world, "b")
    assert world.since(mark) == [("start", "b")]
    assert world.starts("settled") == 1 and world.starts("retired") == 1
    await sup.stop()


def gated_spec(world: World, child_id: str, gate: asyncio.Event, entered: list[str],
               restart: RestartType = "transient") -> ChildSpec:
    inner = world.spec(child_id, restart)

    async def start() -> ChildHandle:
        entered.append(child_id)
        await gate.wait()
        return await inner.start()

    return ChildSpec(child_id, start, restart)


async def test_dynamic_starts_run_concurrently_and_keep_start_order() -> None:
    world, gate = World(), asyncio.Event()
    entered: list[str] = []
    sup = make_sup(world, [world.spec("a", "permanent")], strategy="one_for_all")
    await sup.start()
    starts = [asyncio.create_task(sup.start_child(gated_spec(world, x, gate, entered))) for x in ("x", "y")]
    await settle()
    assert entered == ["x", "y"]  # both starts are in flight at once
    with pytest.raises(ChildAlreadyPresent):
        await sup.start_child(world.spec("x"))
    with pytest.raises(ChildRunning):
        await sup.terminate_child("x")
    with pytest.raises(ChildRunning):
        await sup.delete_child("y")
    mark = world.mark()
    await crash(world, "a")  # one_for_all leaves starting children alone
    assert world.since(mark) == [("start", "a")]
    gate.set()
    await asyncio.wait_for(asyncio.gather(*starts), 2)
    assert [(i.id, i.running) for i in sup.which_children()] == [("a", True), ("x", True), ("y", True)]
    mark = world.mark()
    await crash(world, "a")
    assert world.since(mark) == [("stop", "y"), ("stop", "x"), ("start", "a"), ("start", "x"), ("start", "y")]
    await sup.stop()


async def test_stop_waits_for_a_start_in_flight_and_shuts_the_new_child_down() -> None:
    world, gate, rec = World(), asyncio.Event(), Recorder()
    entered: list[str] = []
    sup = make_sup(world, [world.spec("a")], observer=rec)
    await sup.start()
    start = asyncio.create_task(sup.start_child(gated_spec(world, "late", gate, entered)))
    await settle()
    stopping = asyncio.create_task(sup.stop())
    await settle()
    assert not stopping.done() and world.log[-1] == ("stop", "a")
    gate.set()
    with pytest.raises(SupervisorNotRunning):
        await asyncio.wait_for(start, 2)
    await asyncio.wait_for(stopping, 2)
    assert world.log[-2:] == [("start", "late"), ("stop", "late")]
    assert ("terminated", "sup", "late", None, "stop") in rec.events
    assert [i.id for i in sup.which_children()] == ["a"] and not sup.which_children()[0].running


async def test_a_failed_dynamic_start_releases_its_reservation() -> None:
    world = World()
    sup = make_sup(world, [])
    await sup.start()
    world.fail_starts["x"] = 1
    with pytest.raises(StartFailed):
        await sup.start_child(world.spec("x"))
    assert sup.which_children() == []
    await sup.start_child(world.spec("x"))
    assert [i.id for i in sup.which_children()] == ["x"]
    await sup.stop()


async def test_a_child_exiting_while_the_supervisor_stops_is_reported_stopped() -> None:
    world, gate, rec = World(), asyncio.Event(), Recorder()
    inner = world.spec("x", "permanent")

    async def slow_restart() -> ChildHandle:
        if world.starts("x") >= 1:
            await gate.wait()  # the restart of x holds the supervisor while a exits and stop() queues up
        return await inner.start()

    sup = make_sup(world, [world.spec("a", "permanent"), ChildSpec("x", slow_restart, "permanent")], observer=rec)
    await sup.start()
    world.current("x").exit(ExitReason.abnormal("crash"))
    await settle()
    world.current("a").exit(ExitReason.abnormal("crash"))  # its exit waits for the lock ...
    await settle()
    stopping = asyncio.create_task(sup.stop())  # ... ahead of stop()
    await settle()
    gate.set()
    await asyncio.wait_for(stopping, 2)
    assert world.starts("a") == 1  # never restarted: the supervisor was stopping
    assert ("terminated", "sup", "a", None, "stop") in rec.events
    assert ("terminated", "sup", "x", None, "stop") in rec.events


async def test_a_child_stuck_in_shutdown_is_bounded_and_reported() -> None:
    world, rec = World(), Recorder()
    quick = RetireTimeouts(retire=0.01, signal=0.01, kill=0.01)
    sup = make_sup(world, [world.spec("a", shutdown=quick), world.spec("stuck", shutdown=quick)], observer=rec)
    sup.shutdown_margin = 0.05  # bound = 2 * (0.01 + 2 * 0.02) + 0.05 = 0.15 s
    await sup.start()
    world.current("stuck").block_shutdown = asyncio.Event()  # never set: the handle hangs
    await asyncio.wait_for(sup.stop(), 2)
    assert world.log[-2:] == [("stop", "stuck"), ("stop", "a")]  # the rest still stopped
    errors = {e[2]: e[3] for e in rec.events if e[0] == "terminated"}
    assert isinstance(errors["stuck"], ShutdownTimeout) and errors["a"] is None
    assert sup.state == "stopped"


async def test_stop_stops_settled_children_together_first_then_the_others_in_reverse_order() -> None:
    """A settled child only caches finished work: a supervisor's stop ends all of them at once (their shutdowns
    overlap), before the others, which stop one by one in reverse start order as OTP has it."""
    world = World()
    names = ["a", "s1", "b", "s2", "c"]
    sup = make_sup(world, [world.spec(n) for n in names])
    await sup.start()
    gate = asyncio.Event()
    for n in ("s1", "s2"):
        world.current(n).settled = True  # type: ignore[attr-defined]
        world.current(n).block_shutdown = gate
    mark = world.mark()
    stopping = asyncio.ensure_future(sup.stop())
    await settle()
    assert world.since(mark) == [("stop", "s2"), ("stop", "s1")]  # both in their shutdown at once, nothing else
    gate.set()
    await stopping
    assert world.since(mark) == [("stop", "s2"), ("stop", "s1"), ("stop", "c"), ("stop", "b"), ("stop", "a")]


async def test_child_info_names_one_child_without_listing_the_others() -> None:
    world = World()
    sup = make_sup(world, [world.spec("a"), world.spec("b", "permanent")])
    await sup.start()
    info = sup.child_info("b")
    assert info is not None and (info.id, info.restart, info.running) == ("b", "permanent", True)
    assert sup.child_info("nope") is None
    await sup.terminate_child("a")
    info = sup.child_info("a")
    assert info is not None and not info.running
    assert [i.id for i in sup.which_children()] == ["a", "b"]  # start order kept
    await sup.delete_child("a")
    assert sup.child_info("a") is None and [i.id for i in sup.which_children()] == ["b"]
