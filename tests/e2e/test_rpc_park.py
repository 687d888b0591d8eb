"""A settled rpc child gives its process back (`supervision.rpcIdleGraceMs`), through `legion run` with real rpc
worker processes: after the grace its process is gone, its status and the run's restart count untouched (the tree
allows no restart at all here: `maxRestarts: 0`), and new input brings it back from its transcript with its
conversation intact — `subagent continue` from its parent, and a child's completion notice to a parked lead."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import psutil
import pytest

from legion.workers.session import RESTART_NOTE
from legion.workers.transcript import text_of
from tests.e2e.harness import (
    NOTICE_FIRST_LINE,
    Project,
    call,
    final_text,
    kill_tree,
    launch,
    launched_pids,
    messages,
    node_rows,
    project,
    subagent,
    tools,
)
from tests.support import wait_until

pytestmark = pytest.mark.timeout(120)
GRACE_MS = 300


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _settings(proj: Project) -> None:
    proj.settings({"supervision": {"forceRpc": True, "rpcIdleGraceMs": GRACE_MS, "maxRestarts": 0}})


def _wait_for(go: Path) -> dict[str, object]:
    return tools(call("bash", {"command": f"until [ -f {go} ]; do sleep 0.05; done; echo go"}))


def _texts(transcript: Path) -> list[str]:
    """The conversation as the model sees it: each user and assistant message's text, in order."""
    return [text for m in messages(transcript) if m.get("role") in ("user", "assistant") and (text := text_of(m))]


def _no_restart_nor_failure(events: list[dict[str, object]]) -> None:
    assert not [e for e in events if e["type"] in ("node_failed", "node_retired")], events
    assert not [e for e in events if e["type"] == "node_launched" and e.get("restart")]


def test_settled_rpc_children_give_their_process_back_and_continue_brings_one_back() -> None:
    names = ["w1", "w2"]
    with project() as proj:
        _settings(proj)
        go = proj.dir / "go"
        kids = [{"name": n, "agent": "worker", "task": f"task {n}",
                 "model": proj.script(n, {"text": f"{n} ok"}, default={"text": f"{n} again"})} for n in names]
        root = proj.script("root", launch(*kids), _wait_for(go), subagent("wait", timeoutMs=30000),
                           subagent("continue", name="w1", task="once more"),
                           subagent("wait", names=["w1"], timeoutMs=30000), {"text": "root done"},
                           default={"text": "noted"})
        proc, run = proj.start("rpc park", "--model", root, "--timeout", "90")
        try:
            wait_until(lambda: all(node_rows(run).get(n, {}).get("status") == "settled" for n in names), 60,
                       "every worker settled")
            first = launched_pids(run)
            wait_until(lambda: all(_gone(first[n]) for n in names), 30, "the settled workers' processes gone")
            rows = node_rows(run)
            assert {n: rows[n]["status"] for n in names} == {n: "settled" for n in names}
            assert not _gone(first["root"])  # the root's session is busy (its bash tool): its process stays
            go.write_text("")
            stdout, stderr = proc.communicate(timeout=90)
        finally:
            kill_tree(proc)
        assert proc.returncode == 0, f"exit {proc.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}"
        rows = node_rows(run)
        assert {n: rows[n]["status"] for n in ["root", *names]} == {n: "settled" for n in ["root", *names]}
        events = proj.events(run)
        _no_restart_nor_failure(events)
        launched = Counter(e["node"] for e in events if e["type"] == "node_launched")
        assert launched == Counter({"root": 1, "w1": 1, "w2": 1}), launched
        resumed = [e["node"] for e in events if e["type"] == "node_resumed" and e["node"] != "root"]
        assert resumed == ["w1"], resumed  # (the root may be woken by a late notice too)
        # w1 came back in a new process, with the conversation it had: its first exchange, then the new input
        texts = _texts(run / "w1.jsonl")
        assert len(texts) == 4 and "task w1" in texts[0] and "once more" in texts[2], texts
        assert (texts[1], texts[3]) == ("w1 ok", "w1 again"), texts
        assert RESTART_NOTE not in (run / "w1.jsonl").read_text()
        assert [e["type"] for e in events if e["node"] == "w2"] == ["node_launched", "node_settled"]
        assert final_text(run / "root.jsonl") == "root done"


def test_a_parked_lead_is_brought_back_by_its_childs_completion_notice() -> None:
    with project() as proj:
        _settings(proj)
        proj.card("lead", tools=["read", "subagent"], allowNestedSubagents=True, maxSubagentDepth=2)
        go = proj.dir / "go"
        child = proj.script("c", _wait_for(go), {"text": "c done"})
        lead = proj.script("lead", launch({"name": "c", "agent": "worker", "task": "work", "model": child}),
                           {"text": "lead waiting"}, default={"text": "lead got the notice"})
        root = proj.script("root", launch({"name": "lead", "agent": "lead", "task": "lead it", "model": lead}),
                           {"text": "root waiting"}, default={"text": "root noted"})
        proc, run = proj.start("rpc park notice", "--model", root, "--timeout", "90")
        try:
            wait_until(lambda: node_rows(run).get("lead", {}).get("status") == "settled"
                       and node_rows(run).get("c", {}).get("status") == "running", 60, "lead settled, c running")
            first = launched_pids(run)
            wait_until(lambda: _gone(first["lead"]), 30, "the settled lead's process gone")
            assert node_rows(run)["lead"]["status"] == "settled"
            go.write_text("")
            stdout, stderr = proc.communicate(timeout=90)
        finally:
            kill_tree(proc)
        assert proc.returncode == 0, f"exit {proc.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}"
        rows = node_rows(run)
        assert {n: rows[n]["status"] for n in ("root", "lead", "c")} == {"root": "settled", "lead": "settled",
                                                                          "c": "settled"}
        events = proj.events(run)
        _no_restart_nor_failure(events)
        launched = Counter(e["node"] for e in events if e["type"] == "node_launched")
        assert launched == Counter({"root": 1, "lead": 1, "c": 1}), launched
        # the notice revived the lead from its transcript: its own exchange first, then the notice, then its answer
        texts = _texts(run / "lead.jsonl")
        assert len(texts) == 4 and "lead it" in texts[0], texts
        assert (texts[1], texts[3]) == ("lead waiting", "lead got the notice"), texts
        assert texts[2].startswith(NOTICE_FIRST_LINE) and "c done" in texts[2], texts
        assert RESTART_NOTE not in (run / "lead.jsonl").read_text()
        assert final_text(run / "root.jsonl") == "root noted"
