"""`legion status | tree | events | monitor` read a real run: its ledger file and its monitor stream."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from legion.cli import main
from legion.ledger import open_ledger
from legion.runs import RunNotFound, resolve_run


def _make_run(cwd: Path, run_id: str = "run-1") -> Path:
    run_dir = cwd / ".legion" / "runs" / run_id
    run_dir.mkdir(parents=True)
    run_dir.chmod(0o700)  # as a real run directory: the bus refuses ipc sockets in an open folder
    ledger = open_ledger(run_dir / "legion.db")
    try:
        ledger.insert_node(id="root", name="root", role="root", depth=0, status="running")
        ledger.insert_node(id="lead", name="lead", role="centurion", depth=1, parent_id="root",
                           status="running", phase="planning", model="scripted/lead")
        ledger.insert_node(id="w1", name="w1", role="worker", depth=2, parent_id="lead", status="settled")
        ledger.append_event("lead", "node_launched", {"role": "centurion"})
        ledger.append_event("w1", "node_settled", None)
    finally:
        ledger.close()
    return run_dir


def test_resolve_run_picks_newest_and_explains_misses(tmp_path: Path) -> None:
    with pytest.raises(RunNotFound, match="no runs under"):
        resolve_run(tmp_path, None)
    first = _make_run(tmp_path, "a")
    second = _make_run(tmp_path, "b")
    os.utime(first / "legion.db", (1, 1))
    assert resolve_run(tmp_path, None) == second.resolve()
    assert resolve_run(tmp_path, "a") == first.resolve()
    assert resolve_run(tmp_path, str(first)) == first.resolve()
    with pytest.raises(RunNotFound, match="no run 'zzz'"):
        resolve_run(tmp_path, "zzz")


def test_status_json_lists_nodes_in_tree_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _make_run(tmp_path)
    assert main(["-C", str(tmp_path), "status", "--json"]) == 0
    payload = orjson.loads(capsys.readouterr().out)
    assert [n["id"] for n in payload["nodes"]] == ["root", "lead", "w1"]
    assert payload["nodes"][1]["phase"] == "planning"


def test_status_text_tree_and_events(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _make_run(tmp_path)
    assert main(["-C", str(tmp_path), "status"]) == 0
    out = capsys.readouterr().out
    assert "  lead" in out and "planning" in out and "    w1" in out and "settled" in out
    assert main(["-C", str(tmp_path), "tree"]) == 0
    out = capsys.readouterr().out
    assert "lead" in out and "w1" in out and "centurion" in out
    assert main(["-C", str(tmp_path), "events", "--json"]) == 0
    lines = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(e["type"], e["node"], e["run"]) for e in lines] == [("node_launched", "lead", "run-1"),
                                                                  ("node_settled", "w1", "run-1")]
    assert lines[0]["role"] == "centurion" and lines[0]["seq"] < lines[1]["seq"]  # the data at the top level
    assert main(["-C", str(tmp_path), "events", "--after", str(lines[0]["seq"])]) == 0
    assert "node_launched" not in capsys.readouterr().out


def test_missing_run_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-C", str(tmp_path), "status"]) == 2
    assert "no runs under" in capsys.readouterr().err


