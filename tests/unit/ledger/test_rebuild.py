"""Rebuild from a run directory with the documented limits (docs/spec-conformance.md §4.6, regressions 6 and 15)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import pytest

from legion.ledger import Delivery, Ledger, LedgerError, write_run_json
from legion.ledger.rebuild import REBUILD_LIMITS
from legion.ledger.rebuild import rebuild_ledger as rebuild
from legion.ledger.schema import ALL_INDEXES

pytestmark = pytest.mark.timeout(30)


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "w1.jsonl").write_bytes(
        b'{"type":"session","version":3}\n'
        b'{"type":"message","message":{"role":"assistant","usage":{"input":10,"output":4,"cost":{"total":0.5}}}}\n'
        b"garbage line\n"
        b'{"type":"message","message":{"role":"assistant","usage":{"input":5,"output":1,"cost":{"total":0.25}}}}\n'
        b'{"type":"message","message":{"role":"assistant","usage":{"input":2,"output":3,"cacheRead":40,'
        b'"cacheWrite":7,"cost":{"total":0,"unknown":true}}}}\n'
    )
    write_run_json(run, {
        "run_id": "r1",
        "root": {"id": "root", "name": "root", "role": "root", "session_file": "root.jsonl", "status": "running"},
        "children": [
            {"id": "w1", "name": "w1", "role": "worker", "parent_id": "team", "depth": 2, "status": "settled",
             "session_file": "w1.jsonl", "model": "scripted/x"},
            {"id": "team", "name": "team", "role": "centurion", "depth": 1, "status": "running", "kind": "pi"},
            {"id": "w2", "name": "w2", "role": "worker", "parent_id": "team", "depth": 2, "status": "bogus",
             "session_file": "missing.jsonl"},
            {"id": "dup", "name": "w2", "role": "worker", "parent_id": "team", "depth": 2},
            {"id": "orphan", "name": "orphan", "parent_id": "nowhere"},
            {"name": "no-id"},
        ],
    })
    for rel, text in (("w1/r1.md", "one"), ("w1/r2.md", "two!"), ("w2/r1.md", "x"), ("ghost/r1.md", "x"), ("w1/notes.txt", "")):
        path = run / "artifacts" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return run


def test_rebuild_restores_what_it_can_and_reports_limits(tree: Ledger, tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    tree.update_node("team", phase="implementing", phase_since=5, rework_count=1, task_summary="t")
    for _ in range(3):
        tree.append_event("w1", "phase_change")
    mail = tree.send_mail("w1", "root", "s", "b").id
    tree.transition_delivery(mail, Delivery.ACCEPTED)
    old_art = tree.record_artifact(node_id="w1", name="w1", round=1, bytes=3)
    tree.mark_notified(old_art, "team")
    tree.update_node("root", session_file="/x/root.jsonl")

    report = rebuild(tree, run)

    assert report.limits == REBUILD_LIMITS and report.phase_recovered is False
    nodes = {n["id"]: n for n in tree.list_nodes()}
    assert sorted(nodes) == ["dup", "root", "team", "w1", "w2"]
    assert report.nodes == 5 and report.events == 5
    assert nodes["w1"]["parent_id"] == "team" and nodes["team"]["parent_id"] == "root"
    assert nodes["team"]["kind"] == "pi" and nodes["w1"]["model"] == "scripted/x"
    assert nodes["w2"]["status"] == "retired"  # unknown status -> retired
    # Phase state is not recoverable (docs/spec-conformance.md §4.6): never claimed.
    assert nodes["team"]["phase"] is None and nodes["team"]["rework_count"] == 0 and nodes["team"]["task_summary"] is None
    # Root's session file is not restored (regression 15): mail to root stays ACCEPTED.
    assert nodes["root"]["session_file"] is None
    assert tree.get_message(mail)["delivered"] == Delivery.ACCEPTED  # type: ignore[index]
    # One synthetic event per node.
    types = {e.node_id: e.type for e in tree.events_after(0)}
    assert types == {"root": "node_launched", "team": "node_launched", "w1": "node_settled",
                     "w2": "node_retired", "dup": "node_retired"}
    usage = tree.get_usage("w1")
    # As the sessions record it: cache reads and writes are tokens in; an unknown price is counted, not 0.
    assert usage is not None
    assert (usage["tokens_in"], usage["tokens_out"], usage["cost_usd"]) == (15 + 2 + 40 + 7, 5 + 3, 0.75)
    assert usage["unknown_cost_tokens"] == 2 + 3 + 40 + 7
    # Artifacts from disk; ambiguous (w2 twice) and unknown names skipped with warnings.
    arts = {(a["name"], a["round"]): a for a in tree.list_artifacts()}
    assert sorted(arts) == [("w1", 1), ("w1", 2)] and arts[("w1", 2)]["bytes"] == 4
    assert arts[("w1", 1)]["parent_id"] == "team"
    # consumptions are not rebuilt: the result is owed again (one extra notice, never a lost one).
    assert [a["name"] for a in tree.undelivered("team")] == ["w1", "w1"]
    text = " ".join(report.warnings)
    for needle in ("ambiguous name", "ghost", "nowhere", "no id", "missing.jsonl"):
        assert needle in text, needle


@pytest.mark.sqlite_only
def test_rebuild_can_drop_messages_and_keeps_indexes(tree: Ledger, tmp_path: Path, db_path: Path) -> None:
    run = _run_dir(tmp_path)
    tree.send_mail("w1", "root", "s", "b")
    report = rebuild(tree, run, preserve_messages=False)
    assert report.messages_preserved is False
    assert tree.mailbox_stats("root")["pending"] == 0
    con = sqlite3.connect(db_path)
    indexes = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='index' AND name LIKE 'idx_%'")}
    con.close()
    assert indexes == set(ALL_INDEXES)


def test_rebuild_without_run_json_changes_nothing(tree: Ledger, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(LedgerError, match="nothing was changed"):
        rebuild(tree, run)
    (run / "run.json").write_text("{broken")
    with pytest.raises(LedgerError, match="corrupt"):
        rebuild(tree, run)
    assert (run / "run.json.corrupt").exists()
    assert len(tree.list_nodes()) == 4


def test_rebuild_is_atomic_on_failure(tree: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run_dir(tmp_path)
    tree.append_event("w1", "phase_change")

    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("crash mid-rebuild")

    monkeypatch.setattr("legion.ledger.rebuild._rebuild_artifacts", boom)
    with pytest.raises(RuntimeError):
        rebuild(tree, run)
    assert sorted(n["id"] for n in tree.list_nodes()) == ["root", "team", "w1", "w2"]
    assert [e.type for e in tree.events_after(0)] == ["phase_change"]
    assert orjson.loads((run / "run.json").read_bytes())["run_id"] == "r1"


def test_rebuild_restores_worktree_paths_from_launch_records(tree: Ledger, tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    data = orjson.loads((run / "run.json").read_bytes())
    write_run_json(run, {**data, "cwd": "/project"})
    (run / "launches").mkdir()
    worktree = str(run / "worktrees" / "team")
    (run / "launches" / "team.json").write_bytes(orjson.dumps({"id": "team", "spec": {"cwd": worktree}}))
    (run / "launches" / "w1.json").write_bytes(orjson.dumps({"id": "w1", "spec": {"cwd": "/project"}}))
    (run / "launches" / "root.json").write_bytes(orjson.dumps({"id": "root", "spec": {"cwd": "/srv/external"}}))
    (run / "launches" / "w2.json").write_bytes(b"{torn")

    report = rebuild(tree, run)

    nodes = {n["id"]: n for n in tree.list_nodes()}
    assert nodes["team"]["worktree_path"] == worktree  # a team's session ran in its worktree
    assert nodes["w1"]["worktree_path"] is None  # its session ran in the project itself
    assert nodes["root"]["worktree_path"] is None  # an external directory it was admitted to is no worktree
    assert any("w2" in w and "launch record w2.json unreadable" in w for w in report.warnings), report.warnings
