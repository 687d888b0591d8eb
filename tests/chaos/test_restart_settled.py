"""A lost process loses no finished work (issue 19, items 3 and 5): a settled session's process is a cache.

- in-process: the pool is SIGKILLed while the root session is settled (idle, waiting for its child's notice) and
  its child runs. The restarted pool relaunches the child; the child's notice revives the root from its
  transcript (it was not hosted any more) and the run ends with exit 0.
- rpc: the idle processes of four settled workers are SIGKILLed within seconds. No restart is counted (the
  tree-wide intensity is 3 in 60 s), every worker stays `settled`, the run ends with exit 0; new input for one of
  them (`subagent continue`) relaunches it from its transcript, with no restart note.
"""

from __future__ import annotations

import os
import signal
from collections import Counter

import psutil
import pytest

from legion.workers.session import RESTART_NOTE
from tests.e2e.harness import (
    call,
    final_text,
    kill_tree,
    launch,
    node_rows,
    project,
    subagent,
    tools,
)
from tests.support import wait_until

pytestmark = pytest.mark.timeout(120)


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _launch_pids(proj, run) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    pids: dict[str, list[int]] = {}
    for e in proj.events(run):
        if e["type"] == "node_launched":
            pids.setdefault(e["node"], []).append(e["pid"])
    return pids


def test_pool_sigkill_while_the_root_is_settled_and_a_child_runs() -> None:
    with project() as proj:
        go = proj.dir / "go"
        child = proj.script("c", tools(call("bash", {"command": f"until [ -f {go} ]; do sleep 0.05; done; echo go"})),
                            {"text": "c finished"})
        root = proj.script("root", launch({"name": "c", "agent": "worker", "task": "work", "model": child}),
                           {"text": "waiting for c"}, {"text": "root done"}, default={"text": "noted"})
        proc, run = proj.start("pool kill", "--model", root, "--timeout", "90")
        try:
            wait_until(lambda: node_rows(run).get("root", {}).get("status") == "settled"
                       and node_rows(run).get("c", {}).get("status") == "running", 40, "root settled, c running")
            pool_pid = _launch_pids(proj, run)["c"][-1]  # an in-pool session's pid is its pool's
            assert _launch_pids(proj, run)["root"][-1] == pool_pid
            os.kill(pool_pid, signal.SIGKILL)
            wait_until(lambda: len(_launch_pids(proj, run).get("c", [])) >= 2, 40, "c relaunched into the new pool")
            go.write_text("")
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            kill_tree(proc)
        assert proc.returncode == 0, f"exit {proc.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}"
        rows = node_rows(run)
        assert {n: rows[n]["status"] for n in ("root", "c")} == {"root": "settled", "c": "settled"}
        assert final_text(run / "root.jsonl") == "root done"
        # the root was revived from its transcript for the notice: nothing of it was cut, so no restart note
        assert RESTART_NOTE not in (run / "root.jsonl").read_text()


def test_rpc_sigkill_of_settled_workers_counts_no_restart_and_changes_nothing() -> None:
    names = ["w1", "w2", "w3", "w4"]
    with project() as proj:
        proj.settings({"supervision": {"forceRpc": True}})
        go = proj.dir / "go"
        kids = [{"name": n, "agent": "worker", "task": f"task {n}",
                 "model": proj.script(n, {"text": f"{n} ok"}, default={"text": f"{n} again"})} for n in names]
        root = proj.script(
            "root", launch(*kids),
            tools(call("bash", {"command": f"until [ -f {go} ]; do sleep 0.05; done; echo go"})),
            subagent("wait", timeoutMs=30000),
            subagent("continue", name="w1", task="once more"),
            subagent("wait", names=["w1"], timeoutMs=30000),
            {"text": "root done"}, default={"text": "noted"})
        proc, run = proj.start("rpc settled kill", "--model", root, "--timeout", "90")
        try:
            wait_until(lambda: all(node_rows(run).get(n, {}).get("status") == "settled" for n in names), 40,
                       "every worker settled")
            pids = _launch_pids(proj, run)
            for n in names:  # four kills within seconds: more than the tree-wide intensity of 3 in 60 s
                os.kill(pids[n][0], signal.SIGKILL)
            for n in names:
                wait_until(lambda n=n: _dead(pids[n][0]), 20, f"{n}'s process gone")
            rows = node_rows(run)
            assert {n: rows[n]["status"] for n in names} == {n: "settled" for n in names}
            go.write_text("")
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            kill_tree(proc)
        assert proc.returncode == 0, f"exit {proc.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}"
        rows = node_rows(run)
        assert {n: rows[n]["status"] for n in ["root", *names]} == {n: "settled" for n in ["root", *names]}
        events = proj.events(run)
        assert not [e for e in events if e["type"] == "node_failed"]
        launched = Counter(e["node"] for e in events if e["type"] == "node_launched")
        resumed = Counter(e["node"] for e in events if e["type"] == "node_resumed")
        # only w1 came back, and only because new input arrived for it (a revive is a resume: node_resumed, no
        # second node_launched — docs/spec-conformance.md §2.2); none of the kills was a restart
        assert launched == Counter({"root": 1, "w1": 1, "w2": 1, "w3": 1, "w4": 1}), launched
        assert resumed["w1"] == 1 and not resumed.keys() - {"root", "w1"}, resumed
        assert not [e for e in events if e["type"] == "node_launched" and e.get("restart")]
        assert final_text(run / "w1.jsonl") == "w1 again"
        assert RESTART_NOTE not in (run / "w1.jsonl").read_text()
        assert final_text(run / "root.jsonl") == "root done"
