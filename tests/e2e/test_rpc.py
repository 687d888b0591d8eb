"""`supervision.forceRpc`: every session in its own worker process (crash isolation). A SIGKILLed child worker is
restarted and its session resumed while its siblings and the root go on; the run ends like an inprocess run."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator

import pytest

from tests.e2e.harness import (
    Project,
    kill_tree,
    launch,
    launched_pids,
    node_rows,
    project,
    subagent,
    tool_results,
)
from tests.support import wait_until

pytestmark = pytest.mark.timeout(90)
NAMES = ["r1", "r2", "r3"]


@pytest.fixture
def proj() -> Iterator[Project]:
    with project() as p:
        p.settings({"supervision": {"forceRpc": True}})
        yield p


def three_rpc_workers(proj: Project, delay_ms: int = 0) -> str:
    kids = [{"name": n, "agent": "worker", "task": f"task {n}",
             "model": proj.script(n, {"text": f"{n} ok", "delay_ms": delay_ms})} for n in NAMES]
    return proj.script("root", launch(*kids), subagent("wait"), {"text": "root done"}, default={"text": "noted"})


@pytest.mark.slow
def test_a_killed_rpc_child_is_restarted_and_resumed(proj: Project) -> None:
    # (r2 must still be running when it is killed: a settled child's process is a cache, its loss no restart)
    proc, run = proj.start("rpc tree", "--model", three_rpc_workers(proj, delay_ms=6000), "--timeout", "60")
    try:
        wait_until(lambda: all(node_rows(run).get(n, {}).get("status") == "running" for n in ["root", *NAMES]), 30,
                   "every session running")
        pids = launched_pids(run)
        assert len(set(pids.values())) == 4, pids  # one process per session
        os.kill(pids["r2"], signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, f"{stdout}\n{stderr}"
    events = proj.events(run)
    launched = [(e["node"], e["attempt"]) for e in events if e["type"] == "node_launched"]
    assert Counter(n for n, _ in launched) == Counter({"root": 1, "r1": 1, "r2": 2, "r3": 1}), launched
    assert ("r2", 2) in launched
    assert "▶ r1 (worker) on rpc" in tool_results(run / "root.jsonl")[0]
    wait_reply = tool_results(run / "root.jsonl")[1]
    assert all(f"{n} ok" in wait_reply for n in NAMES), wait_reply
    assert (run / "artifacts" / "r2" / "r1.md").read_text().strip() == "r2 ok"


def test_an_rpc_run_ends_with_its_nodes_settled(proj: Project) -> None:
    """Issue 8's acceptance for the three-worker run (`legion status` shows them all settled) holds on rpc too."""
    out = proj.run("rpc tree", "--model", three_rpc_workers(proj))
    assert out.code == 0, out.explain()
    rows = proj.cli_json("status", out.run_dir.name, "--json")["nodes"]
    assert {r["id"]: r["status"] for r in rows} == {n: "settled" for n in ["root", *NAMES]}


def test_an_rpc_session_s_settle_carries_its_usage_to_the_ledger(proj: Project) -> None:
    """A worker that answers in one go never opens the ledger (`legion.workers.held_writer`): its usage travels
    in its `agent_settled` and the root records it with the round's artifact. Every worker's row holds its
    scripted usage, and the round's artifact is there beside it."""
    kids = [{"name": n, "agent": "worker", "task": f"task {n}",
             "model": proj.script(n, {"text": f"{n} ok", "usage": {"input": 100 * (i + 1), "output": 7, "cost": 0.25}})}
            for i, n in enumerate(NAMES)]
    out = proj.run("usage", "--model", proj.script("root", launch(*kids), subagent("wait"), {"text": "root done"},
                                                   default={"text": "noted"}))
    assert out.code == 0, out.explain()
    from legion.ledger import open_ledger

    led = open_ledger(out.run_dir / "legion.db")
    try:
        for i, n in enumerate(NAMES):
            row = led.get_usage(n)
            assert row is not None, n
            assert (row["tokens_in"], row["tokens_out"], row["cost_usd"]) == (100 * (i + 1), 7, 0.25), row
            assert [a["round"] for a in led.list_artifacts(node_id=n)] == [1]
    finally:
        led.close()


def test_instant_rpc_children_are_seen_settled(proj: Project) -> None:
    """Sixteen rpc children that answer at once (two `tasks[]` rounds of 8): every one is seen settled, so each
    `wait` returns their results instead of timing out. Strict is off because the race shows in ~1 run of 5."""
    turns = []
    for rnd in range(2):
        kids = [{"name": f"i{rnd}-{j}", "agent": "worker", "task": "answer now",
                 "model": proj.script(f"i{rnd}-{j}", {"text": f"i{rnd}-{j} ok"})} for j in range(8)]
        turns += [launch(*kids), subagent("wait", timeoutMs=6000)]
    out = proj.run("instant", "--model", proj.script("root", *turns, {"text": "root done"}), "--timeout", "12")
    order: list[str] = []  # node ids whose first node_settled came before their node_launched
    launched: set[str] = set()
    for e in proj.events(out.run_dir):
        if e["type"] == "node_settled" and e["node"] not in launched:
            order.append(e["node"])
        if e["type"] == "node_launched":
            launched.add(e["node"])
    assert len(launched) == 17 and not order, f"settled before launched: {order}"
    assert out.code == 0, out.explain()
    replies = tool_results(out.run_dir / "root.jsonl")
    assert all("timed out" not in replies[i] for i in (1, 3)), replies
