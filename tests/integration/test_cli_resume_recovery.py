"""`legion resume` after a root SIGKILL with rpc children (issue 19 items 6 and 9): an answer a worker finished
before the root died is recorded as settled on resume and reaches its lead; a worker cut mid-call is revived; a
transcript whose header (first line) was damaged is repaired from the ledger, and one that cannot be read does
not keep its siblings down; the exit status reflects the whole tree."""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from legion.workers.transcript import Transcript, read_transcript
from tests.e2e.harness import Project, kill_tree, launch, node_rows, project, subagent
from tests.support import wait_until

pytestmark = pytest.mark.timeout(120)
WORKERS = ["w1", "w2", "w3"]


@pytest.fixture
def proj() -> Iterator[Project]:
    with project() as p:
        p.settings({"supervision": {"forceRpc": True}})
        yield p


def _killed_mid_work(proj: Project) -> Path:
    """Root → w1, w2, w3 (rpc), each in a `sleep 30` bash call when the root is SIGKILLed; every worker died
    with it (parent death = child death). Returns the run directory."""
    kids = [{"name": n, "agent": "worker", "task": f"task {n}",
             "model": proj.script(n, {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 30"}}]},
                                  default={"text": f"{n} RESULT ok"})} for n in WORKERS]
    root = proj.script("root", launch(*kids), subagent("wait"), {"text": "root done"}, default={"text": "noted"})
    proc, run = proj.start("three rpc workers", "--model", root)
    try:
        def all_in_bash() -> bool:
            return all('"sleep 30"' in _text(run / f"{n}.jsonl") for n in WORKERS)
        wait_until(all_in_bash, 60, "every worker in its bash call")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: not _pids_alive(proj, run), 15, "the workers to die with their root")
    finally:
        kill_tree(proc)
    for n in WORKERS:  # a revived worker's bash must not sleep again
        script = proj.dir / "scripts" / f"{n}.yaml"
        script.write_text(script.read_text().replace("sleep 30", "true"))
    return run


def _pids_alive(proj: Project, run: Path) -> list[int]:
    pids = [e["pid"] for e in proj.events(run) if e["type"] == "node_launched" and e.get("pid")]
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    return alive


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _finish(run: Path, name: str, answer: str) -> None:
    """What the worker wrote just before the root died: its bash call's result, then its final answer."""
    data = read_transcript(run / f"{name}.jsonl")
    call = next(b for e in reversed(data.entries) if e.get("type") == "message"
                for b in e["message"].get("content", []) if isinstance(b, dict) and b.get("type") == "toolCall")
    t = Transcript.open(run / f"{name}.jsonl", cwd=str(run.parent.parent.parent))
    try:
        t.append_message({"role": "toolResult", "toolCallId": call["id"], "toolName": "bash",
                          "content": [{"type": "text", "text": "(done)"}], "isError": False, "timestamp": 0})
        t.append_message({"role": "assistant", "content": [{"type": "text", "text": answer}], "api": "scripted",
                          "provider": "scripted", "model": "x", "stopReason": "stop", "timestamp": 0,
                          "usage": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 0,
                                    "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}}})
    finally:
        t.close()


def _launches(proj: Project, run: Path) -> Counter[str]:
    """Starts of each node: a launch, or a revive (recorded as a resume: docs/spec-conformance.md §2.2)."""
    return Counter(e["node"] for e in proj.events(run) if e["type"] in ("node_launched", "node_resumed"))


def test_a_finished_answer_is_settled_on_resume_and_reaches_its_lead(proj: Project) -> None:
    run = _killed_mid_work(proj)
    _finish(run, "w1", "w1 FINISHED before the kill")
    before = _launches(proj, run)  # (a launch fact may have died with the root: compare, not count)
    resumed = proj.cli("resume", run.name, "--all", timeout=90)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows = node_rows(run)
    assert {n: rows[n]["status"] for n in ["root", *WORKERS]} == {n: "settled" for n in ["root", *WORKERS]}, (
        resumed.stdout, [(e["node"], e["type"], e) for e in proj.events(run)])
    launches = _launches(proj, run) - before
    starts = [(e["node"], e["type"], e) for e in proj.events(run) if e["type"] in ("node_launched", "node_resumed")]
    assert launches["w1"] == 0, (launches, starts)  # recorded from its transcript, not relaunched
    assert launches["w2"] == 1 and launches["w3"] == 1, (launches, starts)  # cut mid tool call: revived
    assert (run / "artifacts" / "w1" / "r1.md").read_text() == "w1 FINISHED before the kill"
    assert "w1 FINISHED before the kill" in _text(run / "root.jsonl")  # it reached its lead
    assert "w2 RESULT ok" in _text(run / "root.jsonl") and "w3 RESULT ok" in _text(run / "root.jsonl")
    with proj.ledger(run) as led:
        assert not led.undelivered("root")
        settled = [e.data for e in led.events_after(0, node_id="w1", limit=1000) if e.type == "node_settled"]
    assert settled and settled[-1].get("reason") == "recovered"
    assert "w1" in resumed.stdout and "recovered" in resumed.stdout


def test_a_damaged_header_is_repaired_and_an_unrecoverable_transcript_keeps_no_sibling_down(proj: Project) -> None:
    run = _killed_mid_work(proj)
    w2 = run / "w2.jsonl"
    raw = w2.read_bytes()
    _, rest = raw.split(b"\n", 1)
    w2.write_bytes(b'{"type":"sess\x00\xff garbage' + b"\n" + rest)  # the header line is torn
    w3 = run / "w3.jsonl"
    w3.write_bytes(b"\x00" * 200 + b"\nnot json either\n")  # nothing of its conversation survives
    resumed = proj.cli("resume", run.name, "--all", timeout=90)
    out = resumed.stdout + resumed.stderr
    assert "Traceback" not in out, out
    assert resumed.returncode == 1, out  # w3 could not be revived: the tree did not finish
    rows = node_rows(run)
    assert {n: rows[n]["status"] for n in ["root", "w1", "w2", "w3"]} == {
        "root": "settled", "w1": "settled", "w2": "settled", "w3": "failed"}, out
    repaired = read_transcript(w2)
    assert repaired.header is not None and repaired.header["cwd"] == str(proj.dir)
    assert list(run.glob("w2.jsonl.damaged-*")), "the damaged original is kept"
    assert "w2 RESULT ok" in _text(run / "root.jsonl")
    assert f"cannot revive w3: {w3}" in out and "no readable entry" in out, out
    assert "w3" in out.split("exit")[-1] or "failed: w3" in out, out
