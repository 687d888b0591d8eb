"""One record per agent node: what the orchestrator and the Postman have in flight for a node lives on its
`AgentNode`, and belongs to the node's name, so a node launched again under its name keeps it."""

from __future__ import annotations

from pathlib import Path

from legion.orchestration.agent_tree import AgentNode, AgentTree, Hold, StallTrack


def _node(name: str, parent: str | None = "lead") -> AgentNode:
    return AgentNode(id=name, parent=parent, depth=1, role="worker", backend="inprocess", model="scripted/echo",
                     model_origin="card", transcript=Path(f"/nonexistent/{name}.jsonl"), spec={}, task="t",
                     generations=1)


def test_a_node_launched_again_under_its_name_shares_its_work_and_mail_with_the_old_incarnation() -> None:
    tree = AgentTree()
    old = _node("w")
    tree.add(old)
    old.work.settling = True  # the old incarnation's settle is still being recorded
    old.work.holds = 1
    old.mail.hold = Hold("w")
    old.mail.track = StallTrack(run_started_ms=1, last_event_ms=2, tools={"c1": ("bash", 2)})
    new = _node("w")
    tree.add(new)
    assert tree.get("w") is new
    assert new.work is old.work and new.mail is old.mail  # the lock of the name too: one start at a time
    old.work.settling = False  # the settle task, holding the old node, finishes: the new one sees it
    assert not new.work.settling and new.work.holds == 1 and new.mail.track is not None


def test_each_name_has_its_own_record_and_adding_a_node_again_keeps_it() -> None:
    tree = AgentTree()
    a, b = _node("a"), _node("b")
    tree.add(a)
    tree.add(b)
    assert a.work is not b.work and a.mail is not b.mail and a.work.lock is not b.work.lock
    work = a.work
    tree.add(a)
    assert a.work is work


def test_children_come_from_the_parent_index_in_launch_order_through_replacements_and_moves() -> None:
    tree = AgentTree()
    for name, parent in (("root", None), ("lead", "root"), ("a", "lead"), ("b", "lead"), ("c", "root"),
                         ("d", "lead")):
        tree.add(_node(name, parent))
    assert [n.id for n in tree.children("lead")] == ["a", "b", "d"]
    assert [n.id for n in tree.children("root")] == ["lead", "c"] and tree.children("nobody") == []
    again = _node("b", "lead")
    again.tool_call = "call-7"
    tree.add(again)  # a relaunch under its name keeps its place among its siblings
    assert [n.id for n in tree.children("lead")] == ["a", "b", "d"] and tree.children("lead")[1] is again
    assert tree.by_tool_call("lead", "call-7") == [again] and tree.by_tool_call("root", "call-7") == []
    tree.add(_node("a", "root"))  # the name reused under another parent: it moves, in the tree's order
    assert [n.id for n in tree.children("lead")] == ["b", "d"]
    assert [n.id for n in tree.children("root")] == ["lead", "a", "c"]
    tree.remove("d")
    assert [n.id for n in tree.children("lead")] == ["b"] and [n.id for n in tree.subtree("root")] == ["lead", "a",
                                                                                                       "c", "b"]
