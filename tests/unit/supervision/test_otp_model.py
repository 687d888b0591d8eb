"""Model-based check: random exit sequences against a small reference model of OTP's rules.

The model encodes, independently of the implementation: the restart policy per restart type, the
three strategies (temporary bystanders removed, one_for_all/rest_for_one start every remaining
sibling), and the sliding intensity window (stamps older than `period` drop out; restart number
max + 1 escalates and stops everything).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from legion.supervision.child_spec import ChildHandle, ChildSpec, ExitReason, RestartType, ShutdownMode
from legion.supervision.supervisor import Backoff, Strategy, Supervisor

pytestmark = pytest.mark.timeout(60)

KINDS = {"normal": ExitReason.normal(), "shutdown": ExitReason.shutdown(), "abnormal": ExitReason.abnormal("x")}


class Handle:
    def __init__(self, child_id: str) -> None:
        self._id = child_id
        self.exit_future: asyncio.Future[ExitReason] = asyncio.get_running_loop().create_future()

    @property
    def id(self) -> str:
        return self._id

    async def wait_exit(self) -> ExitReason:
        return await asyncio.shield(self.exit_future)

    async def shutdown(self, mode: ShutdownMode) -> None:
        if not self.exit_future.done():
            self.exit_future.set_result(ExitReason.shutdown())


@dataclass
class ModelChild:
    id: str
    restart: RestartType
    running: bool = True
    starts: int = 1


class Model:
    def __init__(self, strategy: Strategy, children: list[ModelChild], max_restarts: int, period: float) -> None:
        self.strategy = strategy
        self.children = children
        self.max_restarts = max_restarts
        self.period = period
        self.stamps: deque[float] = deque()
        self.stopped = False

    def exit(self, child: ModelChild, kind: str, now: float) -> None:
        restart = child.restart == "permanent" or (child.restart == "transient" and kind == "abnormal")
        if not restart:
            child.running = False
            if child.restart == "temporary":
                self.children.remove(child)
            return
        while self.stamps and self.stamps[0] < now - self.period:
            self.stamps.popleft()
        self.stamps.append(now)
        if len(self.stamps) > self.max_restarts:
            for c in self.children:
                c.running = False
            self.stopped = True
            return
        if self.strategy == "one_for_one":
            targets = [child]
        elif self.strategy == "one_for_all":
            targets = list(self.children)
        else:
            targets = self.children[self.children.index(child):]
        for c in targets:
            if c is not child and c.restart == "temporary":
                self.children.remove(c)
        for c in self.children:
            if c in targets:
                c.running = True
                c.starts += 1


restart_types = st.sampled_from(["permanent", "transient", "temporary"])
Op = tuple[str, int, str, float, RestartType]
# (operation, index, exit kind or restart type, seconds that pass first)
OPS = ("exit", "exit", "exit", "terminate", "add")
events = st.lists(
    st.tuples(st.sampled_from(OPS), st.integers(0, 5), st.sampled_from(sorted(KINDS)),
              st.sampled_from([0.0, 1.0, 7.0, 20.0]), restart_types),
    min_size=1, max_size=25,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    strategy=st.sampled_from(["one_for_one", "one_for_all", "rest_for_one"]),
    types=st.lists(restart_types, min_size=1, max_size=5),
    max_restarts=st.integers(0, 4),
    script=events,
)
def test_supervisor_matches_the_otp_model(
    strategy: Strategy, types: list[RestartType], max_restarts: int, script: list[Op]
) -> None:
    asyncio.run(_run(strategy, types, max_restarts, script))


async def _run(strategy: Strategy, types: list[RestartType], max_restarts: int, script: list[Op]) -> None:
    clock = [0.0]
    handles: dict[str, list[Handle]] = {}

    def spec(child_id: str, restart: RestartType) -> ChildSpec:
        async def start() -> ChildHandle:
            handle = Handle(child_id)
            handles.setdefault(child_id, []).append(handle)
            return handle

        return ChildSpec(child_id, start, restart)

    ids = [f"c{i}" for i in range(len(types))]
    sup = Supervisor("m", strategy=strategy, max_restarts=max_restarts, restart_period=30.0,
                     children=[spec(i, t) for i, t in zip(ids, types, strict=True)],
                     backoff=Backoff(base=0.0), clock=lambda: clock[0])
    model = Model(strategy, [ModelChild(i, t) for i, t in zip(ids, types, strict=True)], max_restarts, 30.0)
    await sup.start()
    added = 0
    for op, index, kind, dt, new_type in script:
        running = [c for c in model.children if c.running]
        if model.stopped:
            break
        clock[0] += dt
        if op == "add":  # start_child appends to the start order
            added += 1
            new_id = f"d{added}"
            await sup.start_child(spec(new_id, new_type))
            model.children.append(ModelChild(new_id, new_type))
        elif not running:
            continue
        elif op == "terminate":  # supervisor-initiated: never restarted; temporary specs forgotten
            victim = running[index % len(running)]
            await sup.terminate_child(victim.id)
            victim.running = False
            if victim.restart == "temporary":
                model.children.remove(victim)
        else:
            victim = running[index % len(running)]
            handles[victim.id][-1].exit_future.set_result(KINDS[kind])
            model.exit(victim, kind, clock[0])
        for _ in range(60):
            await asyncio.sleep(0)
        assert (sup.state == "stopped") == model.stopped
        assert [(i.id, i.running) for i in sup.which_children()] == [(c.id, c.running) for c in model.children]
        for c in model.children:
            assert len(handles[c.id]) == c.starts, c.id
    await sup.stop()
