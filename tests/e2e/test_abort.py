"""`abort` is safely repeatable (docs/spec-conformance.md §2.2, §3.3): a child with no turn in progress —
aborted already, settled and parked, stopped — answers `no-turn`, never an error; each reply states the child's
real status; a `continue` after an abort records only `node_resumed` (no relaunch pair); the process events
`node_aborted` and `node_steered` reach the monitor stream."""

from __future__ import annotations

import pytest

from tests.e2e.harness import launch, messages, node_rows, project, subagent, text_of, tool_results

pytestmark = pytest.mark.timeout(120)


@pytest.mark.slow
def test_abort_is_repeatable_and_says_the_real_state() -> None:
    with project() as proj:
        c1 = proj.script("c1", {"hang": True}, {"text": "c1 continued"})
        c2 = proj.script("c2", {"text": "c2 done"}, default={"text": "c2 steered"})
        c3 = proj.script("c3", {"hang": True})
        root = proj.script(
            "root",
            launch({"name": "c1", "agent": "worker", "task": "one", "model": c1},
                   {"name": "c2", "agent": "worker", "task": "two", "model": c2},
                   {"name": "c3", "agent": "worker", "task": "three", "model": c3}),
            subagent("abort", name="c1"),                        # 1 a turn in progress
            subagent("abort", name="c1"),                        # 2 aborted already
            subagent("wait", names=["c2"]),                      # 3
            subagent("abort", name="c2"),                        # 4 settled (parked)
            subagent("stop", name="c3"),                         # 5
            subagent("abort", name="c3"),                        # 6 stopped
            subagent("continue", name="c1", message="go on"),    # 7
            subagent("wait", names=["c1"]),                      # 8
            subagent("abort", name="c1"),                        # 9 settled after its continue
            subagent("steer", name="c2", message="again"),       # 10
            subagent("wait", names=["c2"]),                      # 11
            {"text": "root done"}, default={"text": "noted"})
        out = proj.run("abort", "--model", root, "--timeout", "90", "--json")
        assert out.code == 0, out.explain()
        r = tool_results(out.run_dir / "root.jsonl", "subagent")
        assert len(r) == 12, r
        assert r[1].startswith("abort → c1: interrupted; its turn was cut; it is retired, outcome aborted, its "
                               "conversation kept"), r[1]
        for i, name, now in ((2, "c1", "retired, outcome aborted"), (4, "c2", "settled, outcome success"),
                             (6, "c3", "retired, outcome aborted"), (9, "c1", "settled, outcome success")):
            assert r[i].startswith(f"abort → {name}: no-turn; no turn was in progress, nothing was done; it is {now}"), r[i]
        assert r[7] == "continue → c1: accepted" and "c1 continued" in r[8], r[7:9]
        assert r[10] == "steer → c2: accepted" and "c2 steered" in r[11], r[10:12]
        assert [text_of(m) for m in messages(out.run_dir / "c1.jsonl") if m["role"] == "user"] == ["one", "go on"]

        c1_events = [(e["type"], e.get("reason")) for e in proj.events(out.run_dir) if e["node"] == "c1"]
        # no relaunch pair (node_launched + node_retired{aborted}) before the continue's node_resumed
        assert c1_events == [("node_launched", None), ("node_retired", "aborted"), ("node_resumed", None),
                             ("node_settled", "normal")], c1_events
        assert {n: row["status"] for n, row in node_rows(out.run_dir).items()} == {
            "root": "settled", "c1": "settled", "c2": "settled", "c3": "retired"}
        # the run a stop cut is no round (docs/spec-conformance.md §2.9): c3 has no artifact; c1's abort is one
        assert not (out.run_dir / "artifacts" / "c3").exists()
        assert sorted(p.name for p in (out.run_dir / "artifacts" / "c1").iterdir()) == ["r1.md", "r2.md"]

        aborted = [(e["node"], e["name"], e["outcome"], e["by"]) for e in out.stream if e["type"] == "node_aborted"]
        assert aborted == [("c1", "c1", "interrupted", "root")], aborted  # a no-turn abort did nothing: no event
        steered = [(e["node"], e["disposition"]) for e in out.stream if e["type"] == "node_steered"]
        assert steered == [("c2", "accepted")], steered
