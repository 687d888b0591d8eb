"""Usage upsert; artifacts (immutable, bytes, node) and consumptions with undelivered(consumer)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from legion.ledger import ArtifactError, Ledger, LedgerError, NodeNotFoundError
from legion.ledger.sql import Sql

pytestmark = pytest.mark.timeout(30)


def test_usage_upsert(tree: Ledger) -> None:
    assert tree.get_usage("w1") is None
    tree.upsert_usage("w1", 10, 5, 0.01)
    tree.upsert_usage("w1", 30, 7, 0.03)
    tree.upsert_usage("w2", 1, 1, 0)
    row = tree.get_usage("w1")
    assert row is not None and (row["tokens_in"], row["tokens_out"], row["cost_usd"]) == (30, 7, 0.03)
    totals = tree.usage_totals()
    assert (totals["tokens_in"], totals["tokens_out"]) == (31, 8)
    assert tree.usage_totals(["w2"])["tokens_in"] == 1
    with pytest.raises(LedgerError):
        tree.upsert_usage("w1", -1, 0, 0)
    with pytest.raises(LedgerError):
        tree.upsert_usage("w1", 0, 0, float("nan"))
    with pytest.raises(NodeNotFoundError):
        tree.upsert_usage("ghost", 1, 1, 1)


def test_usage_counts_the_tokens_whose_price_is_unknown(tree: Ledger) -> None:
    tree.upsert_usage("w1", 100, 20, 0.5)
    assert tree.get_usage("w1")["unknown_cost_tokens"] == 0  # type: ignore[index]
    tree.upsert_usage("w2", 300, 40, 0.0, 340)
    tree.upsert_usage("w1", 150, 30, 0.5, 25)  # the last snapshot wins, unknown tokens included
    totals = tree.usage_totals()
    assert (totals["cost_usd"], totals["unknown_cost_tokens"]) == (0.5, 365)
    assert tree.usage_totals(["w1"])["unknown_cost_tokens"] == 25
    for bad in (-1, 1.5, True, None):
        with pytest.raises(LedgerError, match="unknown_cost_tokens"):
            tree.upsert_usage("w1", 1, 1, 0.0, bad)  # type: ignore[arg-type]


def test_artifact_record_immutable(tree: Ledger) -> None:
    aid = tree.record_artifact(node_id="w1", name="w1", round=1, bytes=100)
    art = tree.get_artifact(aid)
    assert art is not None
    assert (art["node_id"], art["parent_id"], art["path"], art["bytes"]) == ("w1", "team", "artifacts/w1/r1.md", 100)
    assert tree.record_artifact(node_id="w1", name="w1", round=1, bytes=100) == aid  # same facts: no-op
    with pytest.raises(ArtifactError, match="immutable"):
        tree.record_artifact(node_id="w1", name="w1", round=1, bytes=101)
    with pytest.raises(Exception, match="immutable"), tree.transaction():
        tree._db.raw.execute(Sql("UPDATE artifacts SET bytes = 1 WHERE id = ?",
                                 "UPDATE artifacts SET bytes = 1 WHERE id = %s"), (aid,))
    assert tree.get_artifact(aid)["bytes"] == 100  # type: ignore[index]
    with pytest.raises(ArtifactError, match="round"):
        tree.record_artifact(node_id="w1", name="w1", round=0, bytes=1)
    with pytest.raises(NodeNotFoundError):
        tree.record_artifact(node_id="ghost", name="g", round=1, bytes=1)


def test_write_artifact_file(tree: Ledger, tmp_path: Path) -> None:
    aid = tree.write_artifact(tmp_path, node_id="w1", name="w1", round=1, text="héllo")
    path = tmp_path / "artifacts" / "w1" / "r1.md"
    assert path.read_text(encoding="utf-8") == "héllo"
    assert tree.get_artifact(aid)["bytes"] == 6  # type: ignore[index]
    with pytest.raises(ArtifactError, match="immutable"):
        tree.write_artifact(tmp_path, node_id="w1", name="w1", round=1, text="other")
    assert path.read_text(encoding="utf-8") == "héllo"
    tree.write_artifact(tmp_path, node_id="w1", name="w1", round=2, text="v2")
    assert [a["round"] for a in tree.list_artifacts(node_id="w1")] == [1, 2]


def test_undelivered_projection(tree: Ledger) -> None:
    a1 = tree.record_artifact(node_id="w1", name="w1", round=1, bytes=100)
    a2 = tree.record_artifact(node_id="w2", name="w2", round=1, bytes=50)
    a3 = tree.record_artifact(node_id="w2", name="w2", round=2, bytes=0)
    assert [a["id"] for a in tree.undelivered("team")] == [a1, a2, a3]
    assert tree.undelivered("root") == []
    assert tree.owed_consumers() == ["team"]
    tree.record_consumption(a1, "team", 99)  # partial paged read does not suppress the notice
    assert a1 in [a["id"] for a in tree.undelivered("team")]
    tree.record_consumption(a1, "team", 100)  # read to EOF
    tree.record_consumption(a1, "team", 10)  # never shrinks
    tree.mark_notified(a2, "team")  # notice sent
    tree.record_consumption(a3, "root", 0)  # someone else's read does not count
    assert [a["id"] for a in tree.undelivered("team")] == [a3]
    assert tree.owed_consumers() == ["team"]
    tree.record_consumption(a3, "team", 0)  # zero-byte artifact read to EOF
    assert tree.undelivered("team") == [] and tree.owed_consumers() == []
    with pytest.raises(ArtifactError, match="no artifact"):
        tree.mark_notified(999, "team")


def test_failed_artifact_write_leaves_no_torn_round(tree: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A write that dies half-way must not leave an immutable, truncated r1.md that blocks the retry.
    real_write = os.write

    def short_then_fail(fd: int, data: Any) -> int:
        if len(data) > 4:
            return real_write(fd, bytes(data[:4]))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", short_then_fail)
    with pytest.raises(ArtifactError, match="retry"):
        tree.write_artifact(tmp_path, node_id="w1", name="w1", round=1, text="0123456789")
    monkeypatch.undo()
    target = tmp_path / "artifacts" / "w1" / "r1.md"
    assert not target.exists() and list(target.parent.iterdir()) == []
    assert tree.list_artifacts(node_id="w1") == []
    aid = tree.write_artifact(tmp_path, node_id="w1", name="w1", round=1, text="0123456789")
    assert target.read_bytes() == b"0123456789" and tree.get_artifact(aid)["bytes"] == 10  # type: ignore[index]


def test_short_writes_are_completed(tree: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, bytes(data[:3])))
    aid = tree.write_artifact(tmp_path, node_id="w1", name="w1", round=1, text="a longer body")
    monkeypatch.undo()
    assert (tmp_path / "artifacts" / "w1" / "r1.md").read_bytes() == b"a longer body"
    assert tree.get_artifact(aid)["bytes"] == 13  # type: ignore[index]


@pytest.mark.sqlite_only
def test_undelivered_is_served_by_indexes(tree: Ledger) -> None:
    # The projection runs every boundary: artifacts by idx_artifacts_parent, consumptions by their key; no scan.
    from sqlalchemy.dialects import sqlite

    from legion.ledger.artifacts import _undelivered
    from legion.ledger.schema import SQLITE_TABLES

    sql = str(_undelivered(SQLITE_TABLES).compile(dialect=sqlite.dialect()))
    plan = " ".join(row[-1] for row in tree._db.raw.execute("EXPLAIN QUERY PLAN " + sql, ("team", "team")))
    assert "idx_artifacts_parent" in plan and "SEARCH consumptions USING PRIMARY KEY" in plan
    assert "SCAN" not in plan


def test_an_unrecorded_file_of_the_round_is_adopted_or_replaced(tree: Ledger, tmp_path: Path) -> None:
    # the ledger is the truth: a file its write left without a row (a crash or power loss before the COMMIT)
    # is no artifact; the round written again records it (same text) or replaces it (a torn file)
    target = tmp_path / "artifacts" / "w1" / "r1.md"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"the same")
    aid = tree.write_artifact(tmp_path, node_id="w1", name="w1", round=1, text="the same")
    assert tree.get_artifact(aid)["bytes"] == 8  # type: ignore[index]
    torn = tmp_path / "artifacts" / "w1" / "r2.md"
    torn.write_bytes(b"\0\0\0")
    aid2 = tree.write_artifact(tmp_path, node_id="w1", name="w1", round=2, text="whole result")
    assert torn.read_text() == "whole result" and tree.get_artifact(aid2)["bytes"] == 12  # type: ignore[index]
    assert sorted(p.name for p in target.parent.iterdir()) == ["r1.md", "r2.md"]  # no temp file left
    with pytest.raises(ArtifactError, match="immutable"):  # a recorded round stays as it is
        tree.write_artifact(tmp_path, node_id="w1", name="w1", round=2, text="another text")
    assert torn.read_text() == "whole result"


def test_a_direct_write_syncs_the_file_and_its_folder(tree: Ledger, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from legion.procs import durable

    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(durable.os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    tree.write_artifact(tmp_path, node_id="w1", name="w1", round=1, text="x")
    assert len(synced) == 2  # outside a writer's batch: the file and its folder, before the row, as ever
    synced.clear()
    with tree.deferring_sync() as named:
        tree.write_artifact(tmp_path, node_id="w1", name="w1", round=2, text="y")
    assert synced == [] and named == [str(tmp_path / "artifacts" / "w1" / "r2.md")]  # left to the batch


def test_a_snapshot_taken_at_a_time_never_replaces_a_newer_row(tree: Ledger) -> None:
    """`taken_at`: the root records an rpc session's settle-time usage, which may land after the worker itself
    wrote a newer snapshot; an older snapshot is dropped, a newer (or first) one is stored with its own time."""
    tree.upsert_usage("w1", 5, 1, 0.0, taken_at=1_000)
    assert tree.get_usage("w1")["updated_at"] == 1_000
    now = tree.get_usage("w1")
    tree.upsert_usage("w1", 50, 9, 0.5)  # the worker's own write: stamped with the ledger's clock (later)
    newer = tree.get_usage("w1")
    assert newer["tokens_in"] == 50 and newer["updated_at"] > now["updated_at"]
    tree.upsert_usage("w1", 20, 3, 0.2, taken_at=newer["updated_at"] - 1)  # older than the row: dropped
    assert tree.get_usage("w1")["tokens_in"] == 50
    tree.upsert_usage("w1", 70, 11, 0.7, taken_at=newer["updated_at"] + 1)
    assert tree.get_usage("w1")["tokens_in"] == 70
    for bad in (0, -5, True, 1.5):
        with pytest.raises(LedgerError, match="taken_at"):
            tree.upsert_usage("w1", 1, 1, 0.0, taken_at=bad)  # type: ignore[arg-type]
