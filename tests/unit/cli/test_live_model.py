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


def test_40_live_nodes_on_24_rows_say_how_many_more_and_keep_the_figures_at_80_columns() -> None:
    m = TreeModel()
    _launch(m, "root", None)
    for i in range(40):
        _launch(m, f"n{i}", "root")
        m.apply("usage", {"node_id": f"n{i}", "turns": 2, "input": 1000, "output": 5, "costUsd": 0.01})
    lines = m.lines(80, 23)  # the live view leaves the terminal's last line free
    assert len(lines) == 23 and all(len(line) <= 80 for line in lines)
    rows = lines[2:-1]
    assert lines[-1].startswith("… 21 more: 21 live") and len(rows) == 20
    assert all(row.split()[-4:] == ["2", "1005", "$0.0100", "0:00"] for row in rows[1:]), rows


def test_long_values_are_cut_on_the_right_and_the_figures_never() -> None:
    m = TreeModel()
    _launch(m, "root", None)
    m.apply("agent_launched", {"node_id": "root", "role": "root", "model": "openrouter/anthropic/claude-opus-4-1-20250805:thinking-extended"})
    m.apply("usage", {"node_id": "root", "turns": 12, "input": 1234567, "output": 1, "costUsd": 12.5})
    for width in (60, 80):
        row = m.lines(width, 10)[2]
        assert "openrouter/anth" in row and "…" in row and "claude-opus-4-1-20250805:thinking-extended" not in row, row
        assert row.split()[-4:] == ["12", "1234568", "$12.5000", "0:00"] and len(row) <= width, row
    assert "openrouter/anthropic/claude-opus-4-1-20250805:thinking-extended" in m.lines(200, 10)[2]


def test_a_snapshot_carries_model_phase_and_figures() -> None:
    m = TreeModel()
    m.snapshot({"root": "root", "nodes": {
        "pool": {"status": "running", "parent_id": "root", "role": "pool", "infra": True},
        "root": {"status": "running", "parent_id": "pool", "role": "root", "model": "p/big", "phase": None,
                 "turns": 4, "tokens_in": 100, "tokens_out": 20, "cost_usd": 0.5, "unknown_cost_tokens": 0},
        "w1": {"status": "settled", "parent_id": "root", "role": "worker", "model": "p/small", "phase": "review",
               "turns": 1, "tokens_in": 10, "tokens_out": 1, "cost_usd": 0.0, "unknown_cost_tokens": 3}}})
    lines = m.lines(200, 10)
    assert "2 nodes, 1 live" in lines[0] and "131 tok" in lines[0]
    assert lines[2].split()[:2] == ["▶", "root"] and "p/big" in lines[2] and lines[2].split()[-4:-1] == ["4", "120",
                                                                                                          "$0.5000"]
    assert "review" in lines[3] and "p/small" in lines[3] and "$0.0000+?" in lines[3]


def test_the_live_view_renders_at_80x24_and_200x50() -> None:
    import io

    from rich.console import Console

    from legion.cli.progress import LiveView

    for width, height, visible in ((80, 24, 20), (200, 50, 41)):
        console = Console(file=io.StringIO(), force_terminal=True, width=width, height=height, color_system=None)
        view = LiveView(console)
        try:
            for i in range(41):
                name = "root" if i == 0 else f"w{i}"
                view.event("node_status", {"node_id": name, "status": "starting", "parent_id": None if i == 0 else "root"})
                view.event("agent_launched", {"node_id": name, "role": "worker", "model": "anthropic/claude-sonnet-4-5"})
                view.event("node_launched", {"node_id": name, "status": "running"})
            frame = view._renderable().plain.splitlines()
        finally:
            view.close()
        assert len(frame) <= height - 1 and all(len(line) <= width for line in frame)
        rows = [line for line in frame[2:] if not line.startswith("… ")]
        assert len(rows) == visible and all("anthropic/claude-sonnet-4-5" in row for row in rows)
        assert (frame[-1] == "… 21 more: 21 live (`legion status` lists every node)") == (visible < 41)
