"""`legion resume`'s exit status covers the whole tree (orchestration/resume.py `tree_status`): a member that failed,
or that the run's stop left live (`starting`, `running`), makes a settled root's resume exit 1 and is named."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from legion.orchestration.resume import tree_status
from legion.orchestration.run import EXIT_FAILED, EXIT_OK, RunResult


def _result(tmp_path: Path, *rows: dict[str, Any]) -> RunResult:
    nodes = [{"id": "root", "status": "settled", "phase": None},
             *({"phase": None, "session_file": str(tmp_path / f"{r['id']}.jsonl"), **r} for r in rows)]
    return RunResult(EXIT_OK, "settled", tmp_path, "r1", "done", nodes)


def _status(tmp_path: Path, result: RunResult) -> RunResult:
    plan: Any = SimpleNamespace(prepared=SimpleNamespace(run_dir=tmp_path), root_id="root")
    return tree_status(plan, result)


def test_a_tree_whose_members_settled_or_were_left_paused_exits_0(tmp_path: Path) -> None:
    out = _status(tmp_path, _result(tmp_path, {"id": "w1", "status": "settled"}, {"id": "w2", "status": "retired"},
                                    {"id": "w3", "status": "failed", "phase": "failed"}))
    assert (out.exit_code, out.detail) == (EXIT_OK, "")


def test_a_member_left_starting_by_the_stop_fails_the_resume_and_is_named(tmp_path: Path) -> None:
    out = _status(tmp_path, _result(tmp_path, {"id": "w1", "status": "settled"}, {"id": "w2", "status": "starting"},
                                    {"id": "w3", "status": "running"}))
    assert out.exit_code == EXIT_FAILED
    assert "2 member(s) were left live when the run stopped: w2 (starting), w3 (running)" in out.detail


def test_failed_and_stuck_members_are_both_named(tmp_path: Path) -> None:
    out = _status(tmp_path, _result(tmp_path, {"id": "w1", "status": "failed"}, {"id": "w2", "status": "starting"}))
    assert out.exit_code == EXIT_FAILED
    assert "1 member(s) of the tree failed: w1" in out.detail and "w2 (starting)" in out.detail
