"""The closed event set (docs/spec-conformance.md §4.4, §6.7): `tree_finalized` when a run's tree is final (not on a
pause), and the `heldOverCap` health signal for a completion notice held over `maxPendingAgeMs` while its parent
runs — it is counted once and sends nothing: the notice still arrives at the parent's run boundary; the runtime orphan
scan's `orphan_detected` alarm."""

from __future__ import annotations

import pytest

from legion.orchestration.agent_tree import AgentNode
from tests.e2e.harness import (
    NOTICE_FIRST_LINE,
    call,
    launch,
    project,
    subagent,
    tool_results,
    tools,
    user_texts,
)
from tests.e2e.mail_harness import mail_run
from tests.support import until

pytestmark = pytest.mark.timeout(120)


@pytest.mark.slow
def test_a_held_notice_counts_over_the_cap_and_the_final_tree_is_recorded() -> None:
    with project() as proj:
        proj.settings({"legion": {"maxPendingAgeMs": 200}})
        n1 = proj.script("n1", {"text": "n1 RESULT"})
        log = ".legion/runs/held/legion.log"
        root = proj.script(
            "root",
            launch({"name": "n1", "agent": "worker", "task": "go", "model": n1}),
            # the root stays in its run until the Postman's sweep has counted n1's held notice
            tools(call("bash", {"command": f"until grep -q 'heldOverCap 1' {log}; do sleep 0.05; done; echo held"})),
            subagent("diagnose"),
            {"text": "root done"}, default={"text": "noted"})
        out = proj.run("held", "--model", root, "--timeout", "90", "--json", run_id="held")
        assert out.code == 0, out.explain()
        held = [(e["node"], e["child"], e["round"], e["heldOverCap"]) for e in out.stream
                if e["type"] == "notice_held_over_cap"]
        assert held == [("root", "n1", 1, 1)], held  # once per notice
        diagnosed = tool_results(out.run_dir / "root.jsonl", "subagent")[1]
        assert "heldOverCap 1: completion notices held over 0.2 s" in diagnosed, diagnosed
        texts = user_texts(out.run_dir / "root.jsonl")
        notices = [t for t in texts if t.startswith(NOTICE_FIRST_LINE)]
        assert len(notices) == 1 and "n1 RESULT" in notices[0], notices  # delivered once, at the run boundary
        # the notice came after the root's run (bash, diagnose) ended: the signal sent nothing early
        assert texts.index(notices[0]) == len(texts) - 1, texts

        finals = [e for e in proj.events(out.run_dir) if e["type"] == "tree_finalized"]
        assert [(e["node"], e["status"], e["statuses"]) for e in finals] == [
            ("root", "settled", {"settled": 2})], finals
        assert finals[0]["heldOverCap"] == 1
        assert [e["node"] for e in out.stream if e["type"] == "tree_finalized"] == ["root"]


GHOST_SCRIPTS = {"root.yaml": {"turns": [{"text": "root here"}], "default": {"text": "noted"}}}


async def test_the_runtime_orphan_scan_raises_the_alarm_once_then_converges() -> None:
    """A node live in the ledger that no worker hosts (its row left behind) gets `orphan_detected` at the scan that
    first finds it, once; after orphanStaleMs of silence it converges to failed + node_abandoned. (The row is put in
the ledger and the tree by hand: a row whose worker vanished without its supervisor's word.)"""
    async with mail_run(GHOST_SCRIPTS) as run:
        await run.orch.ctx.write(lambda led: led.insert_node(id="ghost", name="ghost", role="worker", depth=1,
                                                             parent_id="root", status="running", run_id="r1"))
        run.orch.tree.add(AgentNode(id="ghost", parent="root", depth=1, role="worker", backend="inprocess",
                                    model="scripted/x", model_origin="explicit", transcript=run.run_dir / "ghost.jsonl",
                                    spec={}, task="t", generations=1, status="running"))
        run.postman.orphan_stale_ms = 600_000
        await run.postman.sweep()
        await run.postman.sweep()
        types = [e.type for e in run.ledger.events_after(0, node_id="ghost")]
        assert types == ["orphan_detected"], types  # the alarm, once; not yet stale
        run.postman.orphan_stale_ms = 0
        await run.postman.sweep()
        await until(lambda: run.ledger.get_node("ghost")["status"] == "failed", 10.0, "ghost converged")
        events = run.ledger.events_after(0, node_id="ghost")
        assert [e.type for e in events] == ["orphan_detected", "node_abandoned", "node_failed"], events
        assert events[0].data["reason"] == "hosted_nowhere" and events[0].data["status"] == "running"
