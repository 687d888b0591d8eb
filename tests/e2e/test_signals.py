"""A run under signals: SIGINT or SIGTERM pauses the whole tree (exit 130); SIGKILL of the pool worker mid-tree is a
crash the supervisor restarts from, with every session resumed from its transcript and no child launched twice."""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from legion.workers.transcript import text_of
from tests.e2e.harness import (
    NOTICE_FIRST_LINE,
    Project,
    call,
    kill_tree,
    launch,
    launched_pids,
    messages,
    node_rows,
    project,
    subagent,
    tool_results,
    tools,
    until_recorded,
    user_texts,
)
from tests.support import wait_until

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def proj() -> Iterator[Project]:
    with project() as p:
        yield p


def all_running(run: Path, names: list[str]) -> bool:
    rows = node_rows(run)
    return all(rows.get(n, {}).get("status") == "running" for n in names)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_pauses_every_node(proj: Project, sig: signal.Signals) -> None:
    kids = [{"name": n, "agent": "worker", "task": "work forever", "model": proj.script(n, {"hang": True})}
            for n in ("h1", "h2")]
    root = proj.script("root", launch(*kids), subagent("wait"), {"text": "unreachable"})
    proc, run = proj.start("hang", "--model", root)
    try:
        wait_until(lambda: all_running(run, ["root", "h1", "h2"]), 30, "the root and both children running")
        phases_before = {n: r["phase"] for n, r in node_rows(run).items()}
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        kill_tree(proc)
    assert proc.returncode == 130, f"{stdout}\n{stderr}"
    assert f"legion run {run.name}: paused (exit 130)" in stdout
    rows = node_rows(run)
    assert {n: r["status"] for n, r in rows.items()} == {"root": "retired", "h1": "retired", "h2": "retired"}
    assert {n: r["phase"] for n, r in rows.items()} == phases_before  # phases untouched (NULL: no machine)
    retired = [e for e in proj.events(run) if e["type"] == "node_retired"]
    assert sorted(e["node"] for e in retired) == ["h1", "h2", "root"]
    assert all(e["reason"] == "session-shutdown" for e in retired), retired


@pytest.mark.slow
def test_sigkill_of_the_pool_worker_mid_tree(proj: Project) -> None:
    names = ["k1", "k2", "k3"]
    kids = [{"name": n, "agent": "worker", "task": f"slow {n}",
             "model": proj.script(n, {"text": f"{n} ok", "delay_ms": 2000})} for n in names]
    # the root answers every later prompt (the completion notices of children that settle after it did)
    root = proj.script("root", launch(*kids), subagent("wait"), {"text": "root done"}, default={"text": "noted"})
    proc, run = proj.start("crash me", "--model", root)
    try:
        # the kill comes after the root's launch call was answered and recorded: the children are running and
        # the reply naming them is in the root's transcript (else the root rightly sees its call cut)
        wait_until(lambda: all_running(run, ["root", *names]) and _recorded(run / "root.jsonl", "▶ k3"), 30,
                   "the root and its children running, and the launch reply in the root's transcript")
        launched = launched_pids(run)
        pool_pid = set(launched.values())
        assert len(pool_pid) == 1, launched  # every session is hosted by the one pool worker
        os.kill(pool_pid.pop(), signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        raise
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, f"{stdout}\n{stderr}"
    rows = node_rows(run)
    assert sorted(rows) == sorted(["root", *names])
    assert all(r["status"] == "settled" for r in rows.values()), rows
    events = proj.events(run)
    firsts = Counter(e["node"] for e in events if e["type"] == "node_launched" and e["attempt"] == 1)
    assert firsts == Counter({"root": 1, **{n: 1 for n in names}}), events
    restarts = [e for e in events if e["type"] == "node_launched" and e.get("restart")]
    assert sorted(e["node"] for e in restarts) == sorted(["root", *names])
    assert all("SIGKILL" in e["after"] for e in restarts)
    settles = [i for i, e in enumerate(events) if e["type"] == "node_settled" and e["node"] in names]
    assert min(settles) > max(events.index(e) for e in restarts)  # the crash came while they were working
    # resumed, not relaunched: one launch call in the root, each child's task given once, each finished once
    assert sum(r.count("▶ k") for r in tool_results(run / "root.jsonl")) == 3
    for n in names:
        assert user_texts(run / f"{n}.jsonl").count(f"slow {n}") == 1
        assert (run / "artifacts" / n / "r1.md").read_text().strip() == f"{n} ok"
        assert not (run / "artifacts" / n / "r2.md").exists()


@pytest.mark.slow
def test_results_of_a_wait_cut_by_a_crash_still_reach_the_parent(proj: Project) -> None:
    """The root's `wait` is in flight when the pool dies; its restarted session is told the result is unknown
    and goes on working (a bash that lasts until the ledger records the children's results), so the children settle while
    it runs. Their results are owed to it: the ledger's `undelivered` projection must still hold them at its
    run boundary, and each arrives in a completion notice exactly once."""
    names = ["k1", "k2", "k3"]
    kids = [{"name": n, "agent": "worker", "task": f"slow {n}",
             "model": proj.script(n, {"text": f"{n} ok", "delay_ms": 2000})} for n in names]
    run_id = "cut-wait"
    root = proj.script("root", launch(*kids), subagent("wait"),
                       tools(call("bash", {"command": until_recorded(run_id, names)})),
                       {"text": "root done"}, default={"text": "noted"})
    proc, run = proj.start("crash me", "--model", root, "--timeout", "40", run_id=run_id)
    try:
        wait_until(lambda: all_running(run, ["root", *names]), 30, "the root and its children running")
        wait_until(lambda: any(t == "subagent" for t in _tool_calls(run / "root.jsonl")[1:]), 30, "the root's wait")
        os.kill(launched_pids(run)["root"], signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        kill_tree(proc)
    assert proc.returncode == 0, f"{stdout}\n{stderr}"
    notices = [t for t in user_texts(run / "root.jsonl") if t.startswith(NOTICE_FIRST_LINE)]
    story = "\n".join(f"{m['role']}: {text_of(m)[:200]}" for m in messages(run / "root.jsonl"))
    assert all(sum(t.count(f"{n} ok") for t in notices) == 1 for n in names), story


def _tool_calls(transcript: Path) -> list[str]:
    """The names of the tool calls in a transcript's assistant messages, in order."""
    out = []
    for m in messages(transcript):
        if m.get("role") == "assistant":
            out += [c.get("name") for c in m.get("content", []) if c.get("type") == "toolCall"]
    return out


def _recorded(transcript: Path, text: str) -> bool:
    try:
        return text.encode() in transcript.read_bytes()
    except OSError:
        return False
