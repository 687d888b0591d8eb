"""Each launch budget refused at exactly its limit, with nothing created by the refused launch; the pool's
`maxActive` queues a launch and admits it when a slot frees (docs/spec-conformance.md §2.4–§2.5)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import (
    Outcome,
    Project,
    call,
    final_text,
    kill_tree,
    launch,
    node_rows,
    project,
    subagent,
    tool_results,
    tools,
)
from tests.support import wait_until

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def proj() -> Iterator[Project]:
    with project() as p:
        yield p


def assert_nothing_created(run: Path, name: str) -> None:
    """A refused launch left no node row, no transcript and no artifact."""
    assert name not in node_rows(run)
    assert not list(run.glob(f"{name}.jsonl")) and not list(run.glob(f"{name}.*.jsonl"))
    assert not (run / "artifacts" / name).exists()


def refusals(proj: Project, run: Path) -> list[dict[str, Any]]:
    return [e for e in proj.events(run) if e["type"] == "budget_refused"]


def leaves(proj: Project, names: list[str]) -> list[dict[str, Any]]:
    """One `tasks[]` step per name, each a worker answering with its own name."""
    return [{"name": n, "agent": "worker", "task": f"report {n}", "model": proj.script(n, {"text": f"result of {n}"})}
            for n in names]


def test_the_ninth_child_is_refused(proj: Project) -> None:
    names = [f"w{i}" for i in range(1, 10)]
    root = proj.script("root", launch(*leaves(proj, names)), subagent("wait"), {"text": "root done"})
    out = proj.run("nine children", "--model", root)
    assert out.code == 0, out.explain()
    rows = node_rows(out.run_dir)
    assert sorted(rows) == sorted(["root", *names[:8]])
    assert all(rows[n]["status"] == "settled" for n in names[:8])
    assert_nothing_created(out.run_dir, "w9")
    [refused] = refusals(proj, out.run_dir)
    assert refused["node"] == "root"
    assert refused["scope"] == "children" and refused["limit"] == 8 and refused["current"] == 8
    reply = tool_results(out.run_dir / "root.jsonl")[0]
    assert "✗ w9: BUDGET_EXCEEDED" in reply and "maxChildrenPerNode" in reply, reply
    assert reply.count("▶ w") == 8


def test_the_31st_live_node_is_refused(proj: Project) -> None:
    # 30 children from one call: the root plus 29 of them make 30 live nodes; the 30th child is the 31st node
    proj.settings({"legion": {"maxChildrenPerNode": 40}})
    names = [f"n{i}" for i in range(1, 31)]
    root = proj.script("root", launch(*leaves(proj, names)), subagent("wait"), {"text": "root done"})
    out = proj.run("thirty children", "--model", root)
    assert out.code == 0, out.explain()
    rows = node_rows(out.run_dir)
    assert len(rows) == 30 and "n30" not in rows
    assert_nothing_created(out.run_dir, "n30")
    [refused] = refusals(proj, out.run_dir)
    assert refused["scope"] == "active" and refused["limit"] == 30 and refused["current"] == 30
    assert "✗ n30: BUDGET_EXCEEDED" in tool_results(out.run_dir / "root.jsonl")[0]


def test_depth_stops_at_the_fifth_generation(proj: Project) -> None:
    """maxDepth 4: depths 1–4 launch; the depth-4 node is a leaf (R = 1), so it is not even offered `subagent`
    (docs/spec-conformance.md §2.3: 1 = leaf, may not spawn; §10 R6: no nesting tool on a hard leaf) and nothing exists at 5."""
    proj.card("deep", tools=["read", "subagent"], allowNestedSubagents=True)
    chain = ["d1", "d2", "d3", "d4", "d5"]
    for here, below in zip(chain, [*chain[1:], "d6"], strict=True):
        proj.script(here, launch({"name": below, "agent": "deep", "task": f"go {below}",
                                  "model": f"scripted/scripts/{below}.yaml"}),
                    subagent("wait"), {"text": f"{here} done"})
    root = proj.script("root", launch({"name": "d1", "agent": "deep", "task": "go d1",
                                       "model": "scripted/scripts/d1.yaml"}), subagent("wait"), {"text": "root done"})
    out = proj.run("a deep chain", "--model", root)
    assert out.code == 0, out.explain()
    rows = node_rows(out.run_dir)
    assert {n: rows[n]["depth"] for n in rows} == {"root": 0, "d1": 1, "d2": 2, "d3": 3, "d4": 4}
    assert_nothing_created(out.run_dir, "d5")
    assert "unknown tool 'subagent'" in tool_results(out.run_dir / "d4.jsonl")[0]
    assert "▶ d4" in tool_results(out.run_dir / "d3.jsonl")[0]


def test_max_depth_is_capped_at_the_hard_ceiling(proj: Project) -> None:
    """Issue 21 item 17: legion.maxDepth 10 is capped at the hard ceiling 4, with one warning for the run: the
    depth-4 node is a leaf (no `subagent`), and a launch under it — the operator's — is refused BUDGET_EXCEEDED
    with a `budget_refused` and creates nothing (docs/spec-conformance.md §2.4). It launched before."""
    proj.settings({"legion": {"maxDepth": 10}})
    proj.card("deep", tools=["read", "bash", "subagent"], allowNestedSubagents=True)
    gate = proj.dir / "gate"
    for here, below in (("d1", "d2"), ("d2", "d3"), ("d3", "d4")):
        proj.script(here, launch({"name": below, "agent": "deep", "task": f"go {below}",
                                  "model": f"scripted/scripts/{below}.yaml"}), subagent("wait"), {"text": f"{here} done"})
    proj.script("d4", tools(call("bash", {"command": f"until [ -e {gate} ]; do sleep 0.02; done"})),
                launch({"name": "d5", "agent": "deep", "task": "go d5", "model": "scripted/scripts/d5.yaml"}),
                subagent("wait"), {"text": "d4 done"}, default={"text": "d4 noted"})
    d5 = proj.script("d5", {"text": "d5 done"})
    root = proj.script("root", launch({"name": "d1", "agent": "deep", "task": "go d1",
                                       "model": "scripted/scripts/d1.yaml"}), subagent("wait"), {"text": "root done"})
    proc, run = proj.start("a deep chain", "--model", root, "--timeout", "60")
    try:
        wait_until(lambda: node_rows(run).get("d4", {}).get("status") == "running", 40, "d4 working")
        op = proj.cli("launch", run.name, "--agent", "deep", "--task", "go d6", "--name", "d6", "--model", d5,
                      "--parent", "d4", timeout=60)
        gate.touch()
        _, stderr = proc.communicate(timeout=60)
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, stderr
    assert op.returncode == 1 and "BUDGET_EXCEEDED" in op.stdout + op.stderr, (op.stdout, op.stderr)
    assert "legion.maxDepth 10 capped at the hard ceiling 4" in op.stdout + op.stderr, (op.stdout, op.stderr)
    assert stderr.count("legion.maxDepth 10 exceeds the hard ceiling 4") == 1, stderr
    rows = node_rows(run)
    assert {n: rows[n]["depth"] for n in rows} == {"root": 0, "d1": 1, "d2": 2, "d3": 3, "d4": 4}
    assert_nothing_created(run, "d5")
    assert_nothing_created(run, "d6")
    assert "unknown tool 'subagent'" in tool_results(run / "d4.jsonl")[0]
    [refused] = refusals(proj, run)
    assert refused["node"] == "d4", refused
    assert {k: refused.get(k) for k in ("scope", "depth", "requestedMaxDepth", "effectiveMaxDepth")} == {
        "scope": "depth", "depth": 5, "requestedMaxDepth": 10, "effectiveMaxDepth": 4}, refused


@pytest.mark.parametrize("where", ["--max-cost", "settings"])
def test_the_tree_cost_budget(proj: Project, where: str) -> None:
    """Each live node holds a reservation (default $0.05); the root's first turn spent $0.01. With $0.22:
    root 0.05 + c1..c3 0.15 + spent 0.01 = 0.21 fits, the 4th child would make 0.26 and is refused."""
    names = ["c1", "c2", "c3", "c4"]
    # the children stay live until the root's launch call has been answered (it then opens the gate): a child that
    # settled while the batch was still launching would free its reservation and let the 4th in on a loaded machine
    gate = proj.dir / "gate"
    hold = tools(call("bash", {"command": f"until [ -e {gate} ]; do sleep 0.02; done"}))
    first = launch(*[{"name": n, "agent": "worker", "task": f"report {n}",
                      "model": proj.script(n, hold, {"text": f"result of {n}"})} for n in names])
    first["usage"] = {"input": 100, "output": 10, "cost": 0.01}
    root = proj.script("root", first, tools(call("bash", {"command": f"touch {gate}"})), subagent("wait"),
                       {"text": "root done"})
    args = ["--model", root]
    if where == "settings":
        proj.settings({"legion": {"budget": {"maxCostUsd": 0.22}}})
    else:
        args += ["--max-cost", "0.22"]
    out = proj.run("costly children", *args)
    assert out.code == 0, out.explain()
    assert sorted(node_rows(out.run_dir)) == ["c1", "c2", "c3", "root"]
    assert_nothing_created(out.run_dir, "c4")
    [refused] = refusals(proj, out.run_dir)
    data = refused
    assert data["scope"] == "tree-cost" and data["limit"] == pytest.approx(0.22)
    assert data["spent"] == pytest.approx(0.01) and data["reserved"] == pytest.approx(0.20)
    assert "✗ c4: BUDGET_EXCEEDED" in tool_results(out.run_dir / "root.jsonl")[0]


def test_a_cards_reserve_is_what_its_launch_holds(proj: Project) -> None:
    """A card's `budget.reserveUsd` replaces the default $0.05: two $0.45 children do not fit in $0.90 with
    the root's own $0.05, so the second launch of one `tasks[]` call is refused."""
    proj.card("big", tools=["read"], budget={"reserveUsd": 0.45})
    kids = [{"name": n, "agent": "big", "task": "x", "model": proj.script(n, {"text": f"{n} done"})} for n in ("b1", "b2")]
    root = proj.script("root", launch(*kids), subagent("wait"), {"text": "root done"})
    out = proj.run("reserves", "--model", root, "--max-cost", "0.9")
    assert out.code == 0, out.explain()
    [refused] = refusals(proj, out.run_dir)
    assert refused["scope"] == "tree-cost" and refused["reserved"] == pytest.approx(0.5)
    assert len([n for n in node_rows(out.run_dir) if n.startswith("b")]) == 1


def _queue_project(proj: Project, *after_launch: dict[str, Any]) -> str:
    proj.settings({"inprocess": {"maxActive": 2}})
    q1 = proj.script("q1", {"text": "q1 result", "delay_ms": 300})
    q2 = proj.script("q2", {"text": "q2 result"})
    return proj.script("root", launch({"name": "q1", "agent": "worker", "task": "one", "model": q1},
                                      {"name": "q2", "agent": "worker", "task": "two", "model": q2}),
                       *after_launch, {"text": "root done"})


def _assert_queued_then_admitted(out: Outcome, freed_by: tuple[str, str]) -> None:
    """q2's launch reply says queued; the monitor stream has launch_queued, then what freed the slot, then
    launch_admitted (process-domain events: on the stream, not in the ledger). The pool admits before the root
    publishes `node_retired`, so the stream's order is checked against the settle, not the retire."""
    run = out.run_dir
    reply = tool_results(run / "root.jsonl")[0]
    assert "▶ q2" in reply and "queued" in reply.split("▶ q2")[1], reply
    types = [(e["type"], e.get("node")) for e in out.stream]
    assert ("launch_queued", "q2") in types and ("launch_admitted", "q2") in types, types
    assert types.index(("launch_queued", "q2")) < types.index(freed_by) < types.index(("launch_admitted", "q2"))
    assert "q2 result" in tool_results(run / "root.jsonl")[-1]


def test_a_launch_beyond_the_pool_is_queued_then_admitted(proj: Project) -> None:
    """inprocess.maxActive 2: the root and q1 fill the pool; q2 waits in the admission queue until the root
    retires q1 (a pool slot is held until its session is retired, docs/spec-conformance.md §7.5)."""
    root = _queue_project(proj, subagent("wait", names=["q1"]), subagent("retire", name="q1"),
                          subagent("wait", names=["q2"]))
    out = proj.run("queued", "--model", root, "--timeout", "30", "--json")
    assert out.code == 0, out.explain()
    _assert_queued_then_admitted(out, ("node_settled", "q1"))
    assert {n: r["status"] for n, r in node_rows(out.run_dir).items()} == {"root": "settled", "q1": "retired",
                                                                         "q2": "settled"}


def test_a_settled_child_frees_its_pool_slot(proj: Project) -> None:
    """maxActive counts hosted sessions, maxActiveNodes live ones: the stricter limit must not deadlock a parent
    that waits for all its children (q1 settles, q2 should then start)."""
    root = _queue_project(proj, subagent("wait"))
    out = proj.run("queued", "--model", root, "--timeout", "8", "--json")
    assert out.code == 0, out.explain()
    _assert_queued_then_admitted(out, ("node_settled", "q1"))


def test_a_launch_beyond_the_admission_queue_is_refused_and_creates_nothing(proj: Project) -> None:
    """Issue 21 item 5: inprocess.maxActive 2, maxQueuedLaunches 1: the root and c1 hold the slots, c2 takes the
    one queue place, c3 is refused QUEUE_FULL — like a budget refusal it leaves no node row, no transcript and no
    `node_failed` (docs/spec-conformance.md §2.5); retiring c1 then admits c2."""
    proj.settings({"inprocess": {"maxActive": 2, "maxQueuedLaunches": 1}})
    c1 = proj.script("c1", {"hang": True})
    c2 = proj.script("c2", {"text": "c2 result"})
    c3 = proj.script("c3", {"text": "c3 result"})
    root = proj.script("root", launch({"name": "c1", "agent": "worker", "task": "one", "model": c1}),
                       launch({"name": "c2", "agent": "worker", "task": "two", "model": c2}),
                       launch({"name": "c3", "agent": "worker", "task": "three", "model": c3}),
                       subagent("retire", name="c1"), subagent("wait", names=["c2"]), {"text": "root done"},
                       default={"text": "noted"})
    out = proj.run("queue overflow", "--model", root, "--timeout", "40")
    assert out.code == 0, out.explain()
    r = tool_results(out.run_dir / "root.jsonl")
    assert "▶ c2" in r[1] and "queued" in r[1], r[1]
    assert r[2].startswith("✗ c3: QUEUE_FULL") and "inprocess.maxQueuedLaunches 1" in r[2], r[2]
    assert "c2 result" in r[4], r[4]
    assert_nothing_created(out.run_dir, "c3")
    events = proj.events(out.run_dir)
    assert not [e for e in events if e["node"] == "c3"], events
    assert not [e for e in events if e["type"] == "node_failed"], events
    assert {n: row["status"] for n, row in node_rows(out.run_dir).items()} == {"root": "settled", "c1": "retired",
                                                                             "c2": "settled"}


def test_a_running_session_stops_at_the_tree_cost_budget(proj: Project) -> None:
    """Issue 8 §6: a running session whose next turn would exceed the budget ends its run (reason `budget`);
    overspend is bounded by the one turn in flight. Each root turn costs $0.10, the budget is $0.25."""
    def turn(i: int) -> dict[str, Any]:
        return {**tools(call("bash", {"command": f"echo turn {i}"})), "usage": {"input": 10, "output": 1, "cost": 0.1}}

    root = proj.script("root", turn(0), turn(1), turn(2),
                       {"text": "this turn is over the budget", "usage": {"input": 10, "output": 1, "cost": 0.1}})
    out = proj.run("spend", "--model", root, "--max-cost", "0.25", "--timeout", "30")
    assert "this turn is over the budget" not in final_text(out.run_dir / "root.jsonl"), out.explain()
    with proj.ledger(out.run_dir) as led:
        assert float(led.usage_totals()["cost_usd"]) <= 0.25 + 0.1 + 1e-9
