"""legion/reports/live_tree.py: monitor events folded into rows; a tree that does not fit keeps its live nodes on screen."""

from __future__ import annotations

from legion.reports.live_tree import TreeModel


def _launch(model: TreeModel, name: str, parent: str | None) -> None:
    model.apply("node_status", {"node_id": name, "status": "starting", "parent_id": parent})
    model.apply("agent_launched", {"node_id": name, "parent_id": parent, "role": "worker", "model": "p/m"})
    model.apply("node_launched", {"node_id": name, "status": "running"})


def test_rows_carry_model_phase_usage_and_the_tree_order() -> None:
    m = TreeModel()
    m.apply("node_status", {"node_id": "pool", "status": "starting", "parent_id": "root"})
    m.apply("node_launched", {"node_id": "pool", "status": "running", "infra": True})
    _launch(m, "root", "pool")
    _launch(m, "w1", "root")
    m.apply("usage", {"node_id": "w1", "turns": 3, "input": 100, "output": 20, "costUsd": 0.25})
    m.apply("phase_change", {"node_id": "w1", "to": "implementing"})
    m.apply("node_settled", {"node_id": "root", "status": "settled"})
    lines = m.lines(200, 20)
    assert lines[0].startswith("legion · ") and "2 nodes, 1 live" in lines[0] and "120 tok" in lines[0]
    root, w1 = lines[2], lines[3]
    assert root.startswith("✔ root") and "settled" in root
    assert w1.startswith("  ▶ w1") and "implementing" in w1 and "p/m" in w1
    assert w1.split()[-4:-1] == ["3", "120", "$0.2500"]
    assert all(len(line) <= 40 for line in m.lines(40, 20))


def test_a_tree_taller_than_the_screen_keeps_the_live_nodes() -> None:
    m = TreeModel()
    _launch(m, "root", None)
    for i in range(100):
        _launch(m, f"n{i}", "root")
        if i != 42:
            m.apply("node_settled", {"node_id": f"n{i}", "status": "settled"})
    lines = m.lines(120, 12)
    assert len(lines) <= 12
    assert any(" n42 " in line for line in lines) and any(line.startswith("▶ root") for line in lines)
    assert lines[-1].startswith("… ") and "more" in lines[-1]
    assert "101 nodes, 2 live" in lines[0]
