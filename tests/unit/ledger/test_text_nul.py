"""U+0000 (NUL) in free text, one rule on both backends (ledger/sql.py): event data keeps it (JSON escapes it), mail
refuses it (MAIL_INVALID_TEXT), every other text column stores U+FFFD. No write fails for it, on PostgreSQL
(whose text cannot hold a NUL) as on SQLite, and both give back the same rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from legion.ledger import Ledger, LedgerWriter, MailInvalidTextError
from legion.ledger.sql import NUL_MARK

from .conftest import RUN

pytestmark = pytest.mark.timeout(60)
TEXT = "before\x00after"
MARKED = f"before{NUL_MARK}after"


def test_node_text_with_nul_is_stored_with_the_mark(tree: Ledger) -> None:
    tree.insert_node(id="w3", name="w3", role="work\x00er", depth=2, parent_id="team", model="m\x00",
                     team="t\x00", task_summary=TEXT, session_file="/s\x00", worktree_path="/w\x00",
                     phase="p\x00", run_id="r\x00")
    tree.update_node("w3", contract_path="CON\x00TRACT.md", task_summary=TEXT + "\x00")
    row = tree.get_node("w3")
    assert row is not None
    assert (row["role"], row["model"], row["team"], row["session_file"], row["worktree_path"], row["phase"],
            row["run_id"]) == (f"work{NUL_MARK}er", f"m{NUL_MARK}", f"t{NUL_MARK}", f"/s{NUL_MARK}",
                               f"/w{NUL_MARK}", f"p{NUL_MARK}", f"r{NUL_MARK}")
    assert row["task_summary"] == MARKED + NUL_MARK and row["contract_path"] == f"CON{NUL_MARK}TRACT.md"
    assert tree.list_nodes(statuses=("starting",))[-1]["task_summary"] == MARKED + NUL_MARK


def test_event_data_with_nul_round_trips_unchanged(tree: Ledger) -> None:
    data = {"reason": TEXT, "nested": {"k\x00ey": [TEXT, 1]}}
    event_id = tree.append_event("w1", "node_failed", data)
    [event] = [e for e in tree.events_after(0) if e.id == event_id]
    assert event.data == data


def test_mail_with_nul_is_refused_on_both_backends_and_nothing_is_stored(tree: Ledger) -> None:
    for subject, body in ((TEXT, "b"), ("s", TEXT)):
        with pytest.raises(MailInvalidTextError, match="U\\+0000"):
            tree.send_mail("w1", "w2", subject, body)
    assert tree.recent_mail(limit=10) == []


def test_an_artifact_path_with_nul_is_stored_with_the_mark(tree: Ledger) -> None:
    artifact_id = tree.record_artifact(node_id="w1", name="notes", round=1, bytes=3, path="artifacts/n\x00.md")
    artifact = tree.get_artifact(artifact_id)
    assert artifact is not None and artifact["path"] == f"artifacts/n{NUL_MARK}.md"


def test_a_writer_op_with_nul_lands(target: Path | str, tree: Ledger) -> None:
    writer = LedgerWriter(target, run_id=RUN)
    try:
        writer.submit(lambda led: led.insert_node(id="w4", name="w4", role="worker", depth=2, parent_id="team",
                                                  task_summary=TEXT), "launch w4").result(timeout=20)
        writer.submit(lambda led: led.update_node("w4", status="running", model="x\x00"), "w4 runs").result(timeout=20)
    finally:
        assert writer.close()
    row = tree.get_node("w4")
    assert row is not None and (row["task_summary"], row["model"], row["status"]) == (MARKED, f"x{NUL_MARK}",
                                                                                     "running")
