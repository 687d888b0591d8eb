"""Node API: insert/update/heartbeat, slug rule, six statuses, subtree by recursive CTE with a cap."""

from __future__ import annotations

import pytest

from legion.ledger import NODE_STATUSES, InvalidNodeError, Ledger, NodeNotFoundError

from .conftest import FakeClock

pytestmark = pytest.mark.timeout(30)


def test_six_statuses() -> None:
    assert NODE_STATUSES == ("starting", "running", "blocked", "settled", "failed", "retired")


def test_insert_defaults(tree: Ledger, clock: FakeClock) -> None:
    node = tree.get_node("w1")
    assert node is not None
    assert node["kind"] == "native" and node["status"] == "starting" and node["rework_count"] == 0
    assert node["created_at"] == node["updated_at"] == clock.now
    assert node["phase"] is None and node["phase_since"] is None
    assert tree.get_node("nope") is None


def test_phase_sets_phase_since(ledger: Ledger, clock: FakeClock) -> None:
    ledger.insert_node(id="t", name="t", role="centurion", depth=0, phase="planning")
    node = ledger.get_node("t")
    assert node is not None and node["phase"] == "planning" and node["phase_since"] == clock.now


@pytest.mark.parametrize("name", ["a", "a" * 32, "w-1_x", "z9"])
def test_slug_accepts(ledger: Ledger, name: str) -> None:
    ledger.insert_node(id=f"id-{name}", name=name, role="worker", depth=0)


@pytest.mark.parametrize("name", ["", "A", "1a", "-a", "a" * 33, "a b", "a.b", "é", "a\x00"])
def test_slug_refuses(ledger: Ledger, name: str) -> None:
    with pytest.raises(InvalidNodeError, match="does not match"):
        ledger.insert_node(id="x", name=name, role="worker", depth=0)


def test_insert_validation(ledger: Ledger) -> None:
    with pytest.raises(InvalidNodeError, match="status"):
        ledger.insert_node(id="x", name="x", role="w", depth=0, status="zombie")
    with pytest.raises(InvalidNodeError, match="kind"):
        ledger.insert_node(id="x", name="x", role="w", depth=0, kind="terminal")
    with pytest.raises(InvalidNodeError, match="depth"):
        ledger.insert_node(id="x", name="x", role="w", depth=-1)
    with pytest.raises(InvalidNodeError, match="node id"):
        ledger.insert_node(id="", name="x", role="w", depth=0)
    with pytest.raises(NodeNotFoundError):
        ledger.insert_node(id="x", name="x", role="w", depth=1, parent_id="ghost")
    ledger.insert_node(id="x", name="x", role="w", depth=0)
    with pytest.raises(InvalidNodeError, match="already exists"):
        ledger.insert_node(id="x", name="x", role="w", depth=0)


def test_update_and_status(tree: Ledger, clock: FakeClock) -> None:
    clock.advance(10)
    tree.update_node("w1", model="openai/gpt", phase="implementing", phase_since=5, rework_count=1)
    tree.set_status("w1", "running")
    node = tree.get_node("w1")
    assert node is not None
    assert (node["model"], node["phase"], node["phase_since"], node["rework_count"], node["status"]) == (
        "openai/gpt", "implementing", 5, 1, "running",
    )
    assert node["updated_at"] == node["created_at"] + 10
    for status in NODE_STATUSES:
        tree.set_status("w2", status)
    with pytest.raises(InvalidNodeError, match="status"):
        tree.set_status("w1", "done")
    with pytest.raises(InvalidNodeError, match="unknown or read-only"):
        tree.update_node("w1", id="other")
    with pytest.raises(InvalidNodeError, match="unknown or read-only"):
        tree.update_node("w1", colour="red")
    with pytest.raises(NodeNotFoundError):
        tree.update_node("ghost", model="m")


def test_heartbeat(tree: Ledger, clock: FakeClock) -> None:
    clock.advance(1234)
    tree.heartbeat("w2")
    node = tree.get_node("w2")
    assert node is not None and node["updated_at"] == clock.now
    with pytest.raises(NodeNotFoundError):
        tree.heartbeat("ghost")


def test_subtree(tree: Ledger) -> None:
    rows = tree.subtree("root")
    assert [(r["id"], r["level"]) for r in rows] == [("root", 0), ("team", 1), ("w1", 2), ("w2", 2)]
    assert [r["id"] for r in tree.subtree("team")] == ["team", "w1", "w2"]
    assert [r["id"] for r in tree.subtree("root", max_depth=1)] == ["root", "team"]
    assert tree.subtree("ghost") == []


def test_subtree_depth_cap_bounds_a_cycle_and_a_deep_chain(ledger: Ledger) -> None:
    ledger.insert_node(id="n0", name="n", role="w", depth=0)
    for i in range(1, 100):
        ledger.insert_node(id=f"n{i}", name="n", role="w", depth=i, parent_id=f"n{i - 1}")
    assert len(ledger.subtree("n0")) == 65  # levels 0..64
    ledger.update_node("n0", parent_id="n99")  # a cycle: the cap still terminates the CTE
    rows = ledger.subtree("n50", max_depth=64)
    assert len(rows) == 65 and rows[-1]["level"] == 64
    with pytest.raises(InvalidNodeError):
        ledger.subtree("n0", max_depth=-1)


def test_transaction_groups_writes_and_rolls_back(tree: Ledger) -> None:
    with pytest.raises(RuntimeError), tree.transaction():
        tree.heartbeat("w1")
        tree.append_event("w1", "node_launched")
        raise RuntimeError("abort")
    assert tree.events_after(0) == []
    with tree.transaction():
        tree.set_status("w1", "running")
        tree.append_event("w1", "node_launched")
        assert tree.get_node("w1")["status"] == "running"  # type: ignore[index]
    assert len(tree.events_after(0)) == 1


@pytest.mark.sqlite_only
def test_live_counts_come_from_the_indexes(ledger: Ledger) -> None:
    ledger.insert_node(id="root", name="root", role="root", depth=0, status="running")
    for i, status in enumerate(["starting", "running", "blocked", "settled", "failed", "retired"]):
        ledger.insert_node(id=f"a{i}", name=f"a{i}", role="w", depth=1, parent_id="root", status=status)
    ledger.insert_node(id="b0", name="b0", role="w", depth=2, parent_id="a1", status="running")
    assert ledger.live_counts("root") == (5, 3)  # root, a0-a2, b0 live; root's live children a0-a2
    assert ledger.live_counts("a1") == (5, 1)
    assert ledger.live_counts() == (5, 0)
    ledger.set_status("a0", "settled")
    assert ledger.live_counts("root") == (4, 2)
    from legion.ledger.nodes import _COUNT_LIVE_CHILDREN_SQL, _COUNT_LIVE_SQL

    raw = ledger._db.raw
    total = " ".join(row[-1] for row in raw.execute("EXPLAIN QUERY PLAN " + _COUNT_LIVE_SQL))
    children = " ".join(row[-1] for row in raw.execute("EXPLAIN QUERY PLAN " + _COUNT_LIVE_CHILDREN_SQL, ("root",)))
    assert "COVERING INDEX idx_nodes_status" in total and "SCAN" not in total  # no row is read
    assert "idx_nodes_parent" in children or "idx_nodes_status" in children
    assert "SCAN" not in children
