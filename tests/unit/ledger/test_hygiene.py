"""Hygiene: best effort, never raises, never touches a live owner's rows or files (docs/spec-conformance.md §4.5)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from legion.ledger import Ledger, write_run_json
from legion.ledger.hygiene import run_hygiene
from legion.ledger.owner import owner_alive, owner_record, read_owner_file, write_owner_file

from .conftest import FakeClock

pytestmark = pytest.mark.timeout(60)
DAY = 86_400_000


@pytest.fixture(scope="module")
def dead_owner() -> dict[str, Any]:
    proc = subprocess.Popen(["sleep", "30"])  # only its pid and start time are needed
    try:
        record = owner_record(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    return record


def _age(path: Path, ms: int) -> None:
    then = time.time() - ms / 1000
    for p in [path, *path.rglob("*")]:
        os.utime(p, (then, then), follow_symlinks=False)


def test_owner_liveness(dead_owner: dict[str, Any]) -> None:
    assert owner_alive(owner_record())
    assert not owner_alive(dead_owner)
    reused = {**owner_record(), "create_time": owner_record()["create_time"] - 100}  # pid reuse
    assert not owner_alive(reused)
    assert not owner_alive(None) and not owner_alive({"pid": "x"}) and not owner_alive({"pid": -1, "create_time": 1})


def test_temp_dirs_swept_only_when_dead_and_old(tmp_path: Path, dead_owner: dict[str, Any]) -> None:
    run = tmp_path / "run1"
    dead_old, dead_new, live_old, ownerless_old = (run / f"rpc-child-{n}" for n in ("a", "b", "c", "d"))
    for d in (dead_old, dead_new, live_old, ownerless_old):
        d.mkdir(parents=True)
        (d / "scratch").write_text("x")
    for d in (dead_old, dead_new):
        (d / ".owner.json").write_bytes(__import__("orjson").dumps(dead_owner))
    write_owner_file(live_old)
    assert read_owner_file(live_old) == owner_record()
    for d in (dead_old, live_old, ownerless_old):
        _age(d, 10 * 60_000)
    report = run_hygiene(None, tmp_path)
    assert sorted(report.temp_dirs_removed) == sorted([str(dead_old), str(ownerless_old)])
    assert dead_new.exists() and live_old.exists() and not dead_old.exists()
    assert str(live_old) in report.skipped_live and report.errors == []


def _node(led: Ledger, node_id: str, run_id: str, status: str = "running") -> None:
    led.insert_node(id=node_id, name=node_id, role="worker", depth=0, run_id=run_id, status=status)


def test_orphan_nodes_abandoned_only_when_owner_dead_and_stale(
    tmp_path: Path, ledger: Ledger, clock: FakeClock, dead_owner: dict[str, Any]
) -> None:
    runs = tmp_path / "runs"
    (runs / "dead").mkdir(parents=True)
    (runs / "live").mkdir(parents=True)
    write_run_json(runs / "dead", {"run_id": "dead", "owner": dead_owner})
    write_run_json(runs / "live", {"run_id": "live", "owner": owner_record()})
    _node(ledger, "d-stale", "dead")
    _node(ledger, "d-fresh", "dead")
    _node(ledger, "d-settled", "dead", status="settled")
    _node(ledger, "l-stale", "live")
    _node(ledger, "nobody", "missing-run")
    clock.advance(90_000)
    ledger.heartbeat("d-fresh")
    report = run_hygiene(ledger, runs, now_ms=clock.now)
    assert report.nodes_abandoned == ["d-stale"]
    assert "l-stale" in report.skipped_live
    assert report.skipped_unknown_owner == ["nobody"]  # no run.json: cannot be proven dead
    statuses = {n["id"]: n["status"] for n in ledger.list_nodes()}
    assert statuses == {"d-stale": "failed", "d-fresh": "running", "d-settled": "settled", "l-stale": "running", "nobody": "running"}
    abandoned = [e for e in ledger.events_after(0) if e.type == "node_abandoned"]
    assert [e.node_id for e in abandoned] == ["d-stale"]
    assert abandoned[0].data["reason"] == "owner_dead"
    # Second pass: nothing left to do.
    assert run_hygiene(ledger, runs, now_ms=clock.now).nodes_abandoned == []


def test_child_owner_alive_protects_node(tmp_path: Path, ledger: Ledger, clock: FakeClock, dead_owner: dict[str, Any]) -> None:
    runs = tmp_path / "runs"
    (runs / "r").mkdir(parents=True)
    write_run_json(runs / "r", {"owner": dead_owner, "children": [{"id": "kid", "owner": owner_record()}]})
    _node(ledger, "kid", "r")
    clock.advance(10 * 60_000)
    assert run_hygiene(ledger, runs, now_ms=clock.now).nodes_abandoned == []


def test_old_run_dirs_removed_except_worktrees_live_and_current(tmp_path: Path, dead_owner: dict[str, Any]) -> None:
    runs = tmp_path / "runs"
    names = ("old", "old-worktree", "old-live", "current", "recent")
    for name in names:
        (runs / name).mkdir(parents=True)
    write_run_json(runs / "old", {"owner": dead_owner})
    (runs / "old-worktree" / "worktrees" / "a").mkdir(parents=True)
    write_run_json(runs / "old-live", {"owner": owner_record()})
    for name in names[:-1]:
        _age(runs / name, 15 * DAY)
    _age(runs / "recent", 13 * DAY)
    report = run_hygiene(None, runs, current_run=runs / "current")
    assert report.run_dirs_removed == [str(runs / "old")]
    assert sorted(p.name for p in runs.iterdir()) == sorted(names[1:])


def test_event_trim(ledger: Ledger, clock: FakeClock, tmp_path: Path) -> None:
    _node(ledger, "n", "r", status="settled")
    for _ in range(5):
        ledger.append_event("n", "node_launched")
    clock.advance(2 * DAY)
    ids = [ledger.append_event("n", "node_settled") for _ in range(5)]
    report = run_hygiene(ledger, tmp_path / "none", now_ms=clock.now, event_retention_days=1)
    assert report.events_trimmed == 5
    report = run_hygiene(ledger, tmp_path / "none", now_ms=clock.now, event_max_rows=2)
    assert report.events_trimmed == 3
    assert [e.id for e in ledger.events_after(0)] == ids[-2:]


def test_never_raises(tmp_path: Path, ledger: Ledger, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = tmp_path / "runs"
    (runs / "r" / "rpc-child-x").mkdir(parents=True)
    _age(runs / "r", 20 * DAY)

    def broken(*_a: object, **_k: object) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr("legion.ledger.hygiene.shutil.rmtree", broken)
    monkeypatch.setattr(Ledger, "list_nodes", broken)
    report = run_hygiene(ledger, runs, now_ms=clock.now)
    assert any("disk on fire" in e for e in report.errors)
    assert any(e.startswith("orphan nodes") for e in report.errors)
    assert (runs / "r").exists()
    monkeypatch.undo()
    assert run_hygiene(ledger, tmp_path / "does-not-exist").errors == []
    (tmp_path / "file-not-dir").write_text("x")
    assert run_hygiene(None, tmp_path / "file-not-dir").errors == []


@pytest.mark.parametrize("live_in", ["child", "temp_dir"])
def test_old_run_dir_with_a_live_child_owner_is_kept(tmp_path: Path, dead_owner: dict[str, Any], live_in: str) -> None:
    # The run's owner died, but a child (run.json) or an rpc-child temp dir still belongs to a live process.
    runs = tmp_path / "runs"
    run = runs / "old"
    run.mkdir(parents=True)
    children = [{"id": "kid", "owner": owner_record() if live_in == "child" else dead_owner}]
    write_run_json(run, {"owner": dead_owner, "children": children})
    if live_in == "temp_dir":
        (run / "rpc-child-1").mkdir()
        write_owner_file(run / "rpc-child-1")
    _age(run, 15 * DAY)
    report = run_hygiene(None, runs)
    assert run.exists() and report.run_dirs_removed == []
    assert str(run) in report.skipped_live


