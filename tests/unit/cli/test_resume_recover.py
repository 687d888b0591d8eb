"""`legion resume`'s recovery of finished answers (orchestration/resume.py `_recover_answers`) on a real ledger file: an
answer only in its transcript is recorded once, whatever the dead root had already written of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from legion.ledger import open_ledger
from legion.orchestration.resume import _recover_answers
from legion.workers.transcript import Transcript


def _run(tmp_path: Path, answered: bool = True) -> tuple[Path, Any, dict[str, dict[str, Any]]]:
    led = open_ledger(tmp_path / "legion.db")
    led.insert_node(id="root", name="root", role="root", depth=0, status="failed")
    t = Transcript.open(tmp_path / "w1.jsonl", cwd=str(tmp_path))
    t.append_message({"role": "user", "content": "work", "timestamp": 1})
    if answered:
        t.append_message({"role": "assistant", "content": [{"type": "text", "text": "W1 ANSWER"}],
                          "stopReason": "stop", "timestamp": 2})
    t.close()
    led.insert_node(id="w1", name="w1", role="worker", depth=1, parent_id="root", status="failed",
                    session_file=str(tmp_path / "w1.jsonl"))
    return tmp_path, led, {"root": {"id": "root"}, "w1": {"id": "w1"}}


def test_an_unrecorded_answer_is_settled_once(tmp_path: Path) -> None:
    run_dir, led, records = _run(tmp_path)
    try:
        assert _recover_answers(led, run_dir, records) == ["w1"]
        assert led.get_node("w1")["status"] == "settled"
        assert [(a["round"], a["parent_id"]) for a in led.list_artifacts(node_id="w1")] == [(1, "root")]
        assert (run_dir / "artifacts" / "w1" / "r1.md").read_text() == "W1 ANSWER"
        assert [a["node_id"] for a in led.undelivered("root")] == ["w1"]  # a notice is owed to its lead
        assert _recover_answers(led, run_dir, records) == []  # recorded: a second resume changes nothing
        assert len(led.list_artifacts(node_id="w1")) == 1
    finally:
        led.close()


def test_the_file_a_dead_root_wrote_without_its_row_is_recorded_not_duplicated(tmp_path: Path) -> None:
    run_dir, led, records = _run(tmp_path)
    try:
        (run_dir / "artifacts" / "w1").mkdir(parents=True)
        (run_dir / "artifacts" / "w1" / "r1.md").write_text("W1 ANSWER")
        assert _recover_answers(led, run_dir, records) == ["w1"]
        assert [a["round"] for a in led.list_artifacts(node_id="w1")] == [1]
        assert sorted(p.name for p in (run_dir / "artifacts" / "w1").iterdir()) == ["r1.md"]
    finally:
        led.close()


def test_a_cut_run_and_a_recorded_answer_are_left_alone(tmp_path: Path) -> None:
    run_dir, led, records = _run(tmp_path, answered=False)
    try:
        assert _recover_answers(led, run_dir, records) == []  # cut mid model call: revived instead
        assert led.get_node("w1")["status"] == "failed"
    finally:
        led.close()
    other = tmp_path / "b"
    other.mkdir()
    run_dir, led, records = _run(other)
    try:
        led.write_artifact(run_dir, node_id="w1", name="w1", round=1, text="W1 ANSWER")  # the root recorded it
        led.update_node("w1", status="retired")  # and the operator retired it afterwards
        assert _recover_answers(led, run_dir, records) == []
        assert led.get_node("w1")["status"] == "retired"
    finally:
        led.close()
