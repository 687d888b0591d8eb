"""Model-based test of the orchestrator: random sequences of `subagent` actions from random nodes and from the
operator, and of runs ending, against a pure model of the tree, its budgets and its authority rules
(`tree_model.py`, written from docs/spec-conformance.md §2). After every step the real orchestrator's reply must be
the one the model predicts, and the trees must agree: each node's parent, depth, generations, status, rounds and
whether its session is hosted, in the orchestrator, in the ledger's rows and in the pool; the results each parent is
still owed (the ledger's `undelivered`); one `budget_refused` per budget refusal; one transcript per launch (a
refusal creates nothing).

The orchestrator is the real one, with a real ledger (a SQLite file) and the real root side of an in-process pool
(tests/unit/orchestration/pool_double.py: only the pool worker process is replaced, its sessions' runs end when the
machine says so). No process is started, but 200 runs of up to 30 steps through the real launch pipeline and ledger take
about half a minute of CPU, hence integration. CI runs the `orchestrator-model` profile (200 examples, derandomized: the
same ones every run); `LEGION_MODEL_EXAMPLES=N` runs N random ones instead, to look further.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from legion.ledger.constants import BUDGET_REFUSED
from legion.orchestration.launch import LaunchRequest
from legion.orchestration.orchestrator import Orchestrator
from tests.integration.tree_model import BUDGET_EXCEEDED, OPERATOR, Budgets, Expected, TreeModel
from tests.support import until
from tests.unit.orchestration.pool_double import CARDS, Project, start_run, transcripts, write_project

pytestmark = pytest.mark.timeout(600)

T = TypeVar("T")
PROFILE = "orchestrator-model"
settings.register_profile(PROFILE, max_examples=200, stateful_step_count=30, deadline=None, derandomize=True,
                          database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
RUN_COST = 0.02  # each ended run's cost (max costs below are never a sum of these and 0.05 reservations)
NAMES = ("root", "a", "b", "c", "d", "lead-1", "worker-1", "mid-2")
MESSAGES = ("go on", "go on", "")


class Projects:
    """One project per budget choice, made once."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._made: dict[tuple[int, int, int], Project] = {}

    def get(self, b: Budgets) -> Project:
        key = (b.max_depth, b.max_children, b.max_active)
        if key not in self._made:
            self._made[key] = write_project(self.base / "-".join(map(str, key)), {
                "maxDepth": b.max_depth, "maxChildrenPerNode": b.max_children, "maxActiveNodes": b.max_active})
        return self._made[key]


# ----- what a call may be ----------------------------------------------------------------------------

def _names(known: list[str]) -> st.SearchStrategy[str]:
    """Mostly a node of the tree, sometimes any name (one no node has, one a later launch may take)."""
    return st.one_of(st.sampled_from(sorted(known)), st.sampled_from(sorted(known)), st.sampled_from(sorted(known)),
                     st.sampled_from(NAMES))


def _launch_args(names: st.SearchStrategy[str]) -> st.SearchStrategy[dict[str, Any]]:
    agents = st.sampled_from([*CARDS, *CARDS, *CARDS, "ghost"])
    name = st.one_of(st.none(), st.none(), st.sampled_from(NAMES), names, st.just("Bad Name"))
    single = st.fixed_dictionaries({"agent": agents, "task": st.sampled_from(["do it"] * 7 + [" "])},
                                   optional={"name": name})
    step = st.fixed_dictionaries({"task": st.sampled_from(["a step"] * 7 + [""])},
                                 optional={"agent": agents, "name": st.sampled_from(NAMES)})
    batch = st.fixed_dictionaries({"tasks": st.lists(step, min_size=1, max_size=3), "agent": agents})
    return st.one_of(single, single, single, batch)


def _call(names: st.SearchStrategy[str], *, operator: bool) -> st.SearchStrategy[dict[str, Any]]:
    """One action's arguments (waits and collects never block: timeoutMs 0)."""
    message = st.sampled_from(MESSAGES)
    names_list = st.lists(names, min_size=1, max_size=2)
    calls = {
        "launch": _launch_args(names),
        "steer": st.fixed_dictionaries({"name": names, "message": message}),
        "continue": st.fixed_dictionaries({"name": names}, optional={"message": message, "task": message}),
        "abort": st.fixed_dictionaries({"name": names}),
        "resume": st.fixed_dictionaries({"name": names}, optional={"message": st.sampled_from(["more", ""])}),
        "retire": st.fixed_dictionaries({"name": names}, optional={"force": st.booleans()}),
        "stop": st.fixed_dictionaries({"name": names}, optional={"force": st.booleans()}),
        "status": st.fixed_dictionaries({}, optional={"name": st.one_of(names, st.just("nobody"))}),
        "collect": st.fixed_dictionaries({"name": names, "timeoutMs": st.just(0)}),
        "list": st.just({}),
        "wait": st.fixed_dictionaries({"timeoutMs": st.just(0)}, optional={"names": names_list}),
        "diagnose": st.fixed_dictionaries({}, optional={"section": st.sampled_from(["tree", "models", "errors",
                                                                                    "machine"])}),
        "extend": st.fixed_dictionaries({"timeoutMs": st.just(0), "decision": st.sampled_from(
            ["extend", "steer_again", "stop", "force_stop", "later"])}, optional={"names": names_list,
                                                                                 "message": message}),
    }
    if not operator:  # (the operator socket refuses an unknown verb before it reaches the orchestrator)
        calls["explode"] = st.just({})
    weights = {"launch": 8, "steer": 2, "continue": 2, "retire": 2, "stop": 1, "abort": 2, "resume": 2, "wait": 2,
               "collect": 2}
    choices = [a for a in calls for _ in range(weights.get(a, 1))]
    return st.sampled_from(choices).flatmap(lambda a: calls[a].map(lambda args: {**args, "action": a}))


# ----- the machine -----------------------------------------------------------------------------------

class OrchestratorMachine(RuleBasedStateMachine):
    """The real orchestrator and the model, step by step (see the module docstring)."""

    def __init__(self, projects: Projects, runs: Path) -> None:
        super().__init__()
        self.projects = projects
        self.runs = runs
        self.loop = asyncio.new_event_loop()
        self.run_dir: Path | None = None
        self.orch: Orchestrator | None = None
        self.budget_events = 0  # the replies' budget refusals
        self.budget_refused, self.events_seen = 0, 0  # the ledger's budget_refused events, read up to event id
        self.last = ""

    @initialize(budgets=st.builds(Budgets, max_depth=st.sampled_from([1, 2, 3, 3, 5]),
                                  max_children=st.sampled_from([1, 2, 3, 3]),
                                  max_active=st.sampled_from([2, 4, 8, 8]),
                                  max_cost=st.sampled_from([None, None, 0.175, 0.375])),
                root_role=st.sampled_from(["lead", "lead", "mid"]))
    def start(self, budgets: Budgets, root_role: str) -> None:
        project = self.projects.get(budgets)
        self.run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=self.runs))
        self.orch, self.pool = start_run(self.run_dir, project, max_cost=budgets.max_cost, run_cost=RUN_COST)
        self.ledger = self.pool.ledger
        self.model = TreeModel(budgets, CARDS, RUN_COST)
        self._step(self.orch.launch(None, LaunchRequest(agent=root_role, task="the run's task", name="root",
                                                        model="scripted/echo")))
        self.model.launch_root(root_role)

    # ----- steps -------------------------------------------------------------------------------
    @precondition(lambda self: bool(self.model.running()))
    @rule(data=st.data())
    def node_calls(self, data: st.DataObject) -> None:
        """A running node's session calls `subagent`."""
        caller = data.draw(st.sampled_from(self.model.running()), label="caller")
        args = data.draw(_call(_names(list(self.model.nodes)), operator=False), label="args")
        self.last = f"{caller}: subagent {args}"
        reply = self._step(self.orch_().handle_tool(caller, "subagent", dict(args)))
        self._agree(self.model.call(caller, args), reply, args)

    @rule(data=st.data())
    def operator_calls(self, data: st.DataObject) -> None:
        """The operator's verb (`legion ACTION RUN …`): authority over every node; a launch is made as its parent."""
        args = data.draw(_call(_names(list(self.model.nodes)), operator=True), label="args")
        action = args.pop("action")
        if action == "launch":
            parent = data.draw(st.one_of(st.none(), _names(list(self.model.nodes))), label="parent")
            self.last = f"operator: {action} {args} under {parent}"
            reply = self._step(self.orch_().handle_operator(action, {**args, "parent": parent}))
            expected = self.model.operator_launch(parent, args)
        else:
            self.last = f"operator: {action} {args}"
            reply = self._step(self.orch_().handle_operator(action, dict(args)))
            expected = self.model.call(OPERATOR, {**args, "action": action})
        self._agree(expected, reply, {**args, "action": action})

    @precondition(lambda self: bool(self.model.running()))
    @rule(data=st.data(), outcome=st.sampled_from(["success", "success", "failed", "truncated"]))
    def a_run_ends(self, data: st.DataObject, outcome: str) -> None:
        """A running node's model ends its run."""
        name = data.draw(st.sampled_from(self.model.running()), label="node")
        self.last = f"{name}'s run ends: {outcome}"
        self._step(self.pool.settle(name, outcome))
        self.model.settle(name, outcome)

    # ----- the comparison ------------------------------------------------------------------------
    def _agree(self, expected: Expected, reply: dict[str, Any], args: dict[str, Any]) -> None:
        where = f"after {self.last}: reply {reply}, model {expected}"
        assert reply["ok"] is expected.ok, where
        if not expected.ok:  # (a batch that launched some of its steps has no code)
            assert reply.get("code") in expected.codes if expected.codes else "code" not in reply, where
        details = reply.get("details") or {}
        action = args["action"]
        for key, want in expected.details.items():
            if action == "launch" and key == "launched":
                assert [(d["name"], d["status"]) for d in details.get(key, [])] == [(n, "started") for n in want], where
            elif action == "launch" and key == "refused":
                got = details.get(key, [])
                assert [d["name"] for d in got] == [n for n, _ in want], where
                for d, (_, codes) in zip(got, want, strict=True):
                    assert d["code"] in codes, where
                    self.budget_events += d["code"] == BUDGET_EXCEEDED
            elif key in ("retired", "stopped"):
                self._retired_in_order(details.get(key, []), want, where)
            elif key == "children":
                assert sorted((c["name"], c["status"]) for c in details.get(key, [])) == want, where
            elif key == "how":
                said = f"({want})" if want else "running already"
                assert said in reply["text"], where
            else:
                assert details.get(key) == want, f"{key}: {where}"
        if action in ("retire", "stop") and expected.ok and not expected.details:
            assert "retired" not in details, where
        if action == "abort" and expected.details.get("outcome") == "interrupted":  # its settle was recorded by now
            assert "still being recorded" not in reply["text"], where

    def _retired_in_order(self, got: list[str], want: list[str], where: str) -> None:
        """The same nodes, each after every descendant of it (children first)."""
        assert sorted(got) == sorted(want), where
        for i, name in enumerate(got):
            below = {n.name for n in self.model.subtree(name)}
            assert not below & set(got[i + 1:]), f"{name} retired before its descendants: {where}"

    @invariant()
    def trees_agree(self) -> None:
        if self.orch is None:
            return
        model, orch, where = self.model, self.orch_(), f"after {self.last}"
        want = {n.name: (n.parent, n.depth, n.generations, n.status, n.rounds) for n in model.nodes.values()}
        got = {n.id: (n.parent, n.depth, n.generations, n.status, n.rounds) for n in orch.tree}
        assert got == want, f"tree {where}: orchestrator {got}, model {want}"
        rows = {r["id"]: (r["parent_id"], r["depth"], r["status"]) for r in self.ledger.list_nodes()}
        assert rows == {k: (p, d, s) for k, (p, d, _, s, _) in want.items()}, f"ledger rows {where}: {rows}"
        hosted = {n: self.pool.nodes.hosted(n) for n in model.nodes}
        assert hosted == {n.name: n.hosted for n in model.nodes.values()}, f"hosted {where}: {hosted}"
        assert sorted(self.pool.running()) == sorted(model.running()), f"runs in the pool {where}"
        artifacts = Counter(str(a["node_id"]) for a in self.ledger.list_artifacts())
        assert artifacts == Counter({n.name: n.rounds for n in model.nodes.values() if n.rounds}), f"artifacts {where}"
        for name in model.nodes:
            owed = sorted((str(a["node_id"]), int(a["round"])) for a in self.ledger.undelivered(name))
            assert owed == sorted(model.owed.get(name, [])), f"results owed to {name} {where}: {owed}"
        for event in self.ledger.events_after(self.events_seen, limit=100_000):
            self.events_seen = event.id
            self.budget_refused += event.type == BUDGET_REFUSED
        assert self.budget_refused == self.budget_events, f"budget_refused events {where}"
        assert transcripts(self.run_dir_()) == model.transcripts, f"transcripts {where}: a refusal created one?"

    # ----- plumbing ------------------------------------------------------------------------------
    def _step(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one step on the machine's loop, then until the orchestrator's background work is done."""
        async def step() -> T:
            result = await coro
            await asyncio.sleep(0)
            orch = self.orch_()
            await until(lambda: not orch._tasks and not self.pool.nodes._tasks, 10.0,
                        f"the orchestrator's background work after {self.last}", interval=0.001)
            return result

        return self.loop.run_until_complete(step())

    def orch_(self) -> Orchestrator:
        assert self.orch is not None
        return self.orch

    def run_dir_(self) -> Path:
        assert self.run_dir is not None
        return self.run_dir

    def teardown(self) -> None:
        try:
            if self.orch is not None:
                self.loop.run_until_complete(self.orch.close())
                self.pool.close()
        finally:
            self.loop.close()
            if self.run_dir is not None:
                shutil.rmtree(self.run_dir, ignore_errors=True)


def test_the_orchestrator_agrees_with_the_model(tmp_path_factory: pytest.TempPathFactory) -> None:
    projects = Projects(tmp_path_factory.mktemp("projects"))
    # each step commits to the ledger (synchronous FULL) and writes artifacts: on a tmpfs when there is one, so that
    # the disk's fsyncs do not set the test's pace
    shm = Path("/dev/shm")
    runs = Path(tempfile.mkdtemp(prefix="legion-model-", dir=shm)) if os.access(shm, os.W_OK) else \
        tmp_path_factory.mktemp("runs")
    chosen = settings.get_profile(PROFILE)
    if examples := os.environ.get("LEGION_MODEL_EXAMPLES"):
        chosen = settings(chosen, max_examples=int(examples), derandomize=False)
    try:
        run_state_machine_as_test(lambda: OrchestratorMachine(projects, runs), settings=chosen)
    finally:
        shutil.rmtree(runs, ignore_errors=True)

