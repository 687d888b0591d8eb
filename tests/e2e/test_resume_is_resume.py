"""A resume is a resume (issue 21, item 2; docs/spec-conformance.md §2.2): `continue` of a child a `stop` cut
mid-turn gives it the caller's message as its first model input — no unprompted, costed turn on the "worker
restarted" note first, and no note in its transcript."""

from __future__ import annotations

import pytest

from legion.workers.session import NOTE_TYPE_RESTART
from tests.e2e.harness import messages, project, subagent, text_of, tool_results

pytestmark = pytest.mark.timeout(90)


def test_continue_after_stop_goes_straight_to_the_callers_message() -> None:
    with project() as proj:
        # a turn answers the latest message: the note would get "UNPROMPTED", the caller's message "TOOK IT"
        child = proj.script("c1", {"hang": True}, default={"text": "EXTRA TURN"}, rules=[
            {"match": "worker hosting this session restarted", "reply": {"text": "UNPROMPTED"}},
            {"match": "PLEASE GO ON", "on": "user", "reply": {"text": "TOOK IT"}}])
        root = proj.script(
            "root",
            subagent("launch", tasks=[{"name": "c1", "agent": "worker", "task": "work", "model": child}]),
            subagent("stop", name="c1"),                                  # cut in its hanging first turn
            subagent("continue", name="c1", message="PLEASE GO ON"),
            subagent("wait", names=["c1"]),
            {"text": "root done"}, default={"text": "noted"})
        out = proj.run("resume", "--model", root, "--timeout", "60")
        assert out.code == 0, out.explain()
        r = tool_results(out.run_dir / "root.jsonl")
        assert r[1] == "stopped c1" and r[2] == "continue → c1: accepted", r
        assert "TOOK IT" in r[3] and "UNPROMPTED" not in r[3] and "EXTRA TURN" not in r[3], r[3]
        history = messages(out.run_dir / "c1.jsonl")
        assistant = [m for m in history if m["role"] == "assistant"]
        # the cut first turn, then exactly one turn: the answer to the caller's message
        assert [m["stopReason"] for m in assistant] == ["aborted", "stop"], assistant
        assert text_of(assistant[1]) == "TOOK IT"
        after_cut = history[history.index(assistant[0]) + 1:]
        assert text_of(after_cut[0]) == "PLEASE GO ON" and after_cut[0]["role"] == "user", after_cut
        assert not any(m.get("customType") == NOTE_TYPE_RESTART for m in history), history
        after_stop = [e["type"] for e in proj.events(out.run_dir) if e["node"] == "c1"]
        after_stop = after_stop[after_stop.index("node_retired") + 1:]
        # the caller's message starts its run as a resume: the relaunch writes no node_launched (nor, idle at once,
        # a settle of its own) — only the message's run, `node_resumed` (docs/spec-conformance.md §2.2)
        assert after_stop == ["node_resumed", "node_settled"], after_stop
