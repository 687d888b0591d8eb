"""The `subagent` actions on live children, driven by a scripted root the way a model drives them: list, a
`wait` that times out with its decisions, steer, abort, stop, continue, extend, status, diagnose, legion_tree,
collect, and the refusals that follow the lifecycle (docs/spec-conformance.md §2.2, §2.1 outcome → status)."""

from __future__ import annotations

import pytest

from tests.e2e.harness import (
    call,
    launch,
    messages,
    node_rows,
    project,
    subagent,
    text_of,
    tool_results,
    tools,
)

pytestmark = pytest.mark.timeout(90)


@pytest.mark.slow
def test_the_actions_on_live_children() -> None:
    with project() as proj:
        gate = proj.dir / "gate"  # s1 stays in its first turn (a tool) until the root opens the gate after steering
        s1 = proj.script("s1", {"tool_calls": [{"name": "bash", "arguments": {
            "command": f"while [ ! -e {gate} ]; do sleep 0.02; done"}}]}, {"text": "s1 after steer"},
            default={"text": "s1 more"})
        s2 = proj.script("s2", {"hang": True}, {"text": "s2 continued"})
        s3 = proj.script("s3", {"hang": True}, default={"text": "s3 steered back"})
        root = proj.script(
            "root",
            launch({"name": "s1", "agent": "worker", "task": "one", "model": s1},
                   {"name": "s2", "agent": "worker", "task": "two", "model": s2},
                   {"name": "s3", "agent": "worker", "task": "three", "model": s3}),
            subagent("list"),                                            # 1
            subagent("wait", names=["s1"], timeoutMs=100),               # 2 s1 is in its gated turn
            subagent("steer", name="s1", message="STEER now"),           # 3
            tools(call("bash", {"command": f"touch {gate}"})),
            subagent("abort", name="s2"),                                # 4
            subagent("stop", name="s3"),                                 # 5
            subagent("continue", name="s2", message="go on"),            # 6
            subagent("extend", names=["s1", "s2"]),                      # 7
            subagent("status"),                                          # 8
            subagent("diagnose"),                                        # 9
            tools(call("legion_tree", {"scope": "tree"})),               # 10
            subagent("collect", name="s1"),                              # 11
            subagent("steer", name="s3", message="once more"),           # 12 stopped, not terminal: a new turn
            subagent("continue", name="s1", message="more"),             # 13
            subagent("wait", names=["s1"]),                              # 14
            {"text": "root done"}, default={"text": "noted"})
        out = proj.run("actions", "--model", root, "--timeout", "60")
        assert out.code == 0, out.explain()
        r = tool_results(out.run_dir / "root.jsonl", "subagent")
        tree = tool_results(out.run_dir / "root.jsonl", "legion_tree")
        assert len(r) == 14 and len(tree) == 1, r
        assert [line.split()[0] for line in r[1].splitlines()] == ["s1", "s2", "s3"] and "running" in r[1]
        assert "wait timed out after 100 ms" in r[2] and "extend | steer_again | stop | force_stop" in r[2]
        assert r[3] == "steer → s1: queued", r[3]
        assert r[4].startswith("abort → s2: interrupted"), r[4]
        assert r[5] == "stopped s3", r[5]
        assert r[6] == "continue → s2: accepted", r[6]
        assert "s1 after steer" in r[7] and "s2 continued" in r[7], r[7]  # the steer was taken after s1's turn
        for text in (r[8], tree[0]):
            assert "s3 [worker] retired" in text and "s1 [worker] settled" in text and "root [root] running" in text
        assert r[9].startswith(f"run {out.run_dir.name} at {out.run_dir}") and "host inprocess pid" in r[9]
        assert r[10].startswith("s1 (worker, scripted/scripts/s1.yaml): settled, outcome success")
        assert r[10].endswith(f"s1 after steer\nComplete conversation: {out.run_dir / 's1.jsonl'}"), r[10]
        assert r[11] == "steer → s3: accepted", r[11]
        assert r[12] == "continue → s1: accepted" and "s1 more" in r[13]

        s1_users = [text_of(m) for m in messages(out.run_dir / "s1.jsonl") if m["role"] == "user"]
        assert s1_users == ["one", "STEER now", "more"]
        rows = node_rows(out.run_dir)
        assert {n: r["status"] for n, r in rows.items()} == {"root": "settled", "s1": "settled", "s2": "settled",
                                                           "s3": "settled"}
        s3_users = [text_of(m) for m in messages(out.run_dir / "s3.jsonl") if m["role"] == "user"]
        assert s3_users == ["three", "once more"], s3_users  # the steer is its first input (no restart note)
        events = [(e["node"], e["type"], e.get("reason")) for e in proj.events(out.run_dir)]
        assert ("s2", "node_retired", "aborted") in events  # outcome aborted → retired (docs/spec-conformance.md §2.1) ...
        assert ("s2", "node_resumed", None) in events       # ... and still continuable
        assert ("s3", "node_retired", "stop") in events


def test_steer_of_an_idle_child_starts_a_turn() -> None:
    """Issue 21 item 4: a settled child is steerable — the steer starts a turn with the message and answers
    `accepted` (docs/spec-conformance.md §3.3), where it was refused SUBAGENT_NOT_STEERABLE."""
    with project() as proj:
        i1 = proj.script("i1", {"text": "i1 first answer"}, {"text": "i1 after the steer"})
        root = proj.script(
            "root",
            launch({"name": "i1", "agent": "worker", "task": "go", "model": i1}),
            subagent("wait", names=["i1"]),
            subagent("steer", name="i1", message="NEW DIRECTION"),
            subagent("wait", names=["i1"]),
            {"text": "root done"}, default={"text": "noted"})
        out = proj.run("steer idle", "--model", root, "--timeout", "60")
        assert out.code == 0, out.explain()
        r = tool_results(out.run_dir / "root.jsonl", "subagent")
        assert "i1 first answer" in r[1], r[1]
        assert r[2] == "steer → i1: accepted", r[2]
        assert "i1 after the steer" in r[3], r[3]
        assert [text_of(m) for m in messages(out.run_dir / "i1.jsonl") if m["role"] == "user"] == ["go",
                                                                                                   "NEW DIRECTION"]
        assert node_rows(out.run_dir)["i1"]["status"] == "settled"


def test_names_are_unique_while_live_and_reusable_after_retire() -> None:
    """NAME_TAKEN while the first `a1` lives; after it is stopped the name launches a fresh conversation
    (a new transcript, the same node row); duplicate names in one `tasks[]` are refused before anything starts."""
    with project() as proj:
        first = proj.script("a1", {"hang": True})
        second = proj.script("a1b", {"text": "second a1"})
        root = proj.script(
            "root",
            launch({"name": "a1", "agent": "worker", "task": "first", "model": first}),
            launch({"name": "a1", "agent": "worker", "task": "again", "model": second}),
            launch({"name": "d", "agent": "worker", "task": "x", "model": second},
                   {"name": "d", "agent": "worker", "task": "y", "model": second}),
            subagent("stop", name="a1"),
            launch({"name": "a1", "agent": "worker", "task": "second", "model": second}),
            subagent("wait"),
            {"text": "root done"})
        out = proj.run("names", "--model", root)
        assert out.code == 0, out.explain()
        r = tool_results(out.run_dir / "root.jsonl")
        assert "✗ a1: NAME_TAKEN" in r[1] and "taken by a running node" in r[1], r[1]
        assert r[2].startswith("INVALID_PARAMS") and "names must be unique" in r[2], r[2]
        assert r[3] == "stopped a1" and "▶ a1 (worker)" in r[4] and "second a1" in r[5]
        rows = node_rows(out.run_dir)
        assert sorted(rows) == ["a1", "root"] and rows["a1"]["status"] == "settled"
        assert rows["a1"]["session_file"] == str(out.run_dir / "a1.2.jsonl")
        assert [text_of(m) for m in messages(out.run_dir / "a1.jsonl") if m["role"] == "user"] == ["first"]
        assert [text_of(m) for m in messages(out.run_dir / "a1.2.jsonl") if m["role"] == "user"] == ["second"]


def test_extend_carries_out_its_decision_and_diagnose_its_section() -> None:
    """A wait timeout's decisions through `extend` (stop, force_stop, steer_again, a bad one), and `diagnose`'s
    sections (models, errors, an unknown one) — docs/spec-conformance.md §2.2."""
    with project() as proj:
        h1 = proj.script("h1", {"hang": True})
        h2 = proj.script("h2", {"hang": True})
        h3 = proj.script("h3", {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 1"}}]},
                         {"text": "h3 took the steer"}, default={"text": "h3 more"})
        root = proj.script(
            "root",
            launch({"name": "h1", "agent": "worker", "task": "one", "model": h1},
                   {"name": "h2", "agent": "worker", "task": "two", "model": h2},
                   {"name": "h3", "agent": "worker", "task": "three", "model": h3}),
            subagent("extend", name="h1", decision="stop"),                           # 1
            subagent("extend", names=["h2"], decision="force_stop"),                  # 2
            subagent("extend", name="h3", decision="steer_again", message="AGAIN"),   # 3
            subagent("extend", name="h3", decision="shrug"),                          # 4
            subagent("diagnose", section="models"),                                   # 5
            subagent("diagnose", section="errors"),                                   # 6
            subagent("diagnose", section="machine"),                                  # 7
            {"text": "root done"}, default={"text": "noted"})
        out = proj.run("decisions", "--model", root, "--timeout", "60")
        assert out.code == 0, out.explain()
        r = tool_results(out.run_dir / "root.jsonl", "subagent")
        assert r[1] == "stopped h1" and r[2] == "stopped h2 (forced)", r[1:3]
        assert r[3].startswith("steer → h3:") and "h3 took the steer" in r[3], r[3]
        assert "arguments.decision: must be one of 'extend', 'steer_again', 'stop', 'force_stop'" in r[4], r[4]
        assert "— models" in r[5] and "h3 [worker]: scripted/scripts/h3.yaml" in r[5], r[5]
        assert "— errors" in r[6], r[6]
        assert r[7].startswith("INVALID_PARAMS") and "legion doctor" in r[7], r[7]
        h3_users = [text_of(m) for m in messages(out.run_dir / "h3.jsonl") if m["role"] == "user"]
        assert h3_users == ["three", "AGAIN"], h3_users
        assert {n: row["status"] for n, row in node_rows(out.run_dir).items()} == {
            "root": "settled", "h1": "retired", "h2": "retired", "h3": "settled"}
