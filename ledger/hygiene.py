"""Startup hygiene (docs/spec-conformance.md §4.5): best effort, never raises, never touches a live owner's rows or files.

Steps, each checking both age and process ownership (pid + create time, see owner.py):
1. remove `rpc-child-*` temp dirs in run dirs whose owner is dead and that are older than orphan_stale_ms;
2. mark `starting/running/blocked` nodes as `failed` + `orphan_detected` (the alarm) + `node_abandoned` when their owner is dead and
   their updated_at is older than orphan_stale_ms (the owner is the child's `owner` in run.json, else
   the run's `owner`; a node whose owner cannot be found is left alone, since it cannot be proven dead);
3. delete idle run dirs older than retention_days, except the current run, dirs containing
   `worktrees/`, and runs with any live owner (the run's, a child's in run.json, an rpc-child-* dir's);
   a run that recorded into a PostgreSQL ledger (run.json names its URL) has its rows there deleted first, in
   one transaction (`forget_run`), unless `keep_shared_rows`; when they cannot be deleted (the server cannot be
   reached, or the run wrote there within retention_days: it may be running on another host) the dir is kept;
4. trim events by age (event_retention_days) and count (event_max_rows), when those are set;
5. kill and remove the cgroups of dead runs (`legion-<pid>.<start ticks>.<n>` under our own cgroup, or
   `cgroup_parent`, whose owner process is gone: `legion.procs.remove_dead_runs`).
No retention policy for `messages` (a deliberate product decision in the seeds).
"""

from __future__ import annotations

import contextlib
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from loguru import logger

from legion.ledger.constants import (
    LIVE_STATUSES,
    NODE_ABANDONED,
    ORPHAN_DETECTED,
    ORPHAN_STALE_MS,
    RETENTION_DAYS,
)
from legion.ledger.errors import LedgerError
from legion.ledger.ledger import Ledger, open_ledger
from legion.ledger.location import RUN_JSON_KEY
from legion.ledger.owner import owner_alive, read_owner_file
from legion.ledger.runfile import read_run_json
from legion.ledger.sql import RUN, Sql
from legion.procs import remove_dead_runs

_DAY_MS = 86_400_000


@dataclass
class HygieneReport:
    """What one hygiene pass did (and what it could not do)."""

    temp_dirs_removed: list[str] = field(default_factory=list)
    nodes_abandoned: list[str] = field(default_factory=list)
    run_dirs_removed: list[str] = field(default_factory=list)
    rows_deleted: dict[str, int] = field(default_factory=dict)  # run id -> its rows deleted from a shared ledger
    events_trimmed: int = 0
    cgroups_removed: list[str] = field(default_factory=list)
    skipped_live: list[str] = field(default_factory=list)
    skipped_unknown_owner: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _newest_mtime_ms(path: Path) -> int:
    newest = path.stat().st_mtime
    for child in path.iterdir():
        try:
            newest = max(newest, child.stat().st_mtime)
        except OSError:
            continue
    return int(newest * 1000)


def _remove(path: Path, report: HygieneReport) -> bool:
    try:
        shutil.rmtree(path)
    except OSError as exc:
        report.errors.append(f"remove {path}: {exc}")
        return False
    return True


def _run_dirs(runs_root: Path) -> list[Path]:
    if not runs_root.is_dir():
        return []
    return sorted(p for p in runs_root.iterdir() if p.is_dir() and not p.is_symlink())


def _sweep_temp_dirs(runs_root: Path, now: int, stale_ms: int, report: HygieneReport) -> None:
    for run_dir in _run_dirs(runs_root):
        for temp in sorted(run_dir.glob("rpc-child-*")):
            if not temp.is_dir() or temp.is_symlink():
                continue
            if owner_alive(read_owner_file(temp)):
                report.skipped_live.append(str(temp))
                continue
            if now - _newest_mtime_ms(temp) < stale_ms:
                continue
            if _remove(temp, report):
                report.temp_dirs_removed.append(str(temp))


def _owners(runs_root: Path, run_id: str | None) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(run owner, child owners by node id) from the run's run.json."""
    if not run_id or "/" in run_id or run_id in (".", ".."):
        return None, {}
    data = read_run_json(runs_root / run_id) or {}
    children = data.get("children")
    by_id = {
        c["id"]: c["owner"]
        for c in (children if isinstance(children, list) else [])
        if isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("owner"), dict)
    }
    owner = data.get("owner")
    return (owner if isinstance(owner, dict) else None), by_id


def _abandon_orphans(ledger: Ledger, runs_root: Path, now: int, stale_ms: int, report: HygieneReport) -> None:
    owners: dict[str | None, tuple[dict[str, Any] | None, dict[str, Any]]] = {}
    for node in ledger.list_nodes(statuses=LIVE_STATUSES):
        if now - node["updated_at"] < stale_ms:
            continue
        run_id = node["run_id"]
        if run_id not in owners:
            owners[run_id] = _owners(runs_root, run_id)
        run_owner, child_owners = owners[run_id]
        child_owner = child_owners.get(node["id"])
        if child_owner is None and run_owner is None:
            report.skipped_unknown_owner.append(node["id"])  # cannot prove it dead: never touch
            continue
        if owner_alive(child_owner) or owner_alive(run_owner):
            report.skipped_live.append(node["id"])
            continue
        with ledger.transaction() as tx:
            # Re-check inside the write lock: a heartbeat may have landed since we listed.
            fresh = tx.get_node(node["id"])
            if fresh is None or fresh["status"] not in LIVE_STATUSES or now - fresh["updated_at"] < stale_ms:
                continue
            tx.update_node(node["id"], status="failed")
            owner = child_owner or run_owner
            tx.append_event(node["id"], ORPHAN_DETECTED, {"reason": "owner_dead", "status": fresh["status"],
                                                          "owner": owner.get("pid") if owner else None})
            tx.append_event(node["id"], NODE_ABANDONED, {"reason": "owner_dead", "stale_ms": now - fresh["updated_at"]})
        report.nodes_abandoned.append(node["id"])


def _remove_old_runs(runs_root: Path, current: Path | None, now: int, retention_days: float, report: HygieneReport,
                     keep_shared_rows: bool) -> None:
    for run_dir in _run_dirs(runs_root):
        if current is not None and run_dir.resolve() == current.resolve():
            continue
        if (run_dir / "worktrees").exists():
            continue
        if now - _newest_mtime_ms(run_dir) < retention_days * _DAY_MS:
            continue
        if any(owner_alive(owner) for owner in _run_dir_owners(run_dir)):
            report.skipped_live.append(str(run_dir))
            continue
        quiet_since = now - int(retention_days * _DAY_MS)
        if not keep_shared_rows and not _forget_shared_rows(run_dir, quiet_since, report):
            continue
        if _remove(run_dir, report):
            report.run_dirs_removed.append(str(run_dir))


def _forget_shared_rows(run_dir: Path, quiet_since: int, report: HygieneReport) -> bool:
    """True when the run dir may go: its run keeps no rows in a PostgreSQL ledger (a run on its own legion.db), or
    they were deleted now; False (said in the report) when they could not be."""
    data = _peek_run_json(run_dir)
    url = data.get(RUN_JSON_KEY) if isinstance(data, dict) else None
    if not isinstance(url, str) or not url:
        return True
    run_id = str(data.get("runId") or run_dir.name) if isinstance(data, dict) else run_dir.name
    try:
        with contextlib.closing(open_ledger(url, run_id=run_id)) as ledger:
            deleted = forget_run(ledger, quiet_since=quiet_since)
    except (LedgerError, OSError) as exc:
        report.errors.append(f"kept {run_dir}: its rows in {url} were not deleted: {exc}")
        logger.warning("hygiene kept {}: its rows in {} were not deleted: {}", run_dir, url, exc)
        return False
    if deleted is None:
        report.skipped_live.append(f"{run_dir} (run {run_id} wrote to {url} within the retention window)")
        return False
    report.rows_deleted[run_id] = sum(deleted.values())
    logger.info("hygiene deleted run {}'s {} row(s) from {}", run_id, sum(deleted.values()), url)
    return True


_FORGET_TABLES = ("consumptions", "artifacts", "events", "usage", "messages", "nodes", "runs")  # children first
_FORGET_SQL = {table: Sql(f"DELETE FROM {table}", f"DELETE FROM {table} WHERE run = {RUN}") for table in _FORGET_TABLES}
_NEWEST_WRITE_SQL = Sql(
    "SELECT max(t) FROM (SELECT max(updated_at) AS t FROM nodes UNION ALL SELECT max(ts) FROM events)",
    f"SELECT max(t) FROM (SELECT max(updated_at) AS t FROM nodes WHERE run = {RUN} UNION ALL "
    f"SELECT max(ts) FROM events WHERE run = {RUN} UNION ALL SELECT max(updated_at) FROM runs WHERE run = {RUN}) "
    "AS newest",
)


def forget_run(ledger: Ledger, *, quiet_since: int) -> dict[str, int] | None:
    """Delete every row of the ledger's run from a shared PostgreSQL ledger in one transaction (holding the run's
    write lock): the rows deleted per table, or None, deleting nothing, when the run wrote at or after
    `quiet_since` (epoch ms; a heartbeat, an event, its `runs` row): it may be running, here or on another host.
    A SQLite ledger is the run's own file: remove the run directory instead."""
    if ledger.backend != "postgresql":
        raise LedgerError(f"forget_run: {ledger.path} is a run's own SQLite file; remove its run directory instead")
    with ledger.transaction():
        raw = ledger._db.raw
        newest = raw.execute(_NEWEST_WRITE_SQL).fetchone()[0]
        if newest is not None and int(newest) >= quiet_since:
            return None
        return {table: int(raw.execute(_FORGET_SQL[table]).rowcount) for table in _FORGET_TABLES}


def _run_dir_owners(run_dir: Path) -> list[Any]:
    """Every process that may own files in a run dir: the run's owner, each child's, each rpc-child temp dir's."""
    data = _peek_run_json(run_dir)
    data = data if isinstance(data, dict) else {}
    children = data.get("children")
    owners: list[Any] = [data.get("owner")]
    owners += [c.get("owner") for c in (children if isinstance(children, list) else []) if isinstance(c, dict)]
    owners += [read_owner_file(temp) for temp in run_dir.glob("rpc-child-*") if temp.is_dir()]
    return owners


def _peek_run_json(run_dir: Path) -> Any:
    """run.json without quarantining (a dir about to be deleted needs no repair)."""
    try:
        return orjson.loads((run_dir / "run.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None


_TRIM_OLD_SQL = Sql("DELETE FROM events WHERE ts < ?", f"DELETE FROM events WHERE run = {RUN} AND ts < %s")
_TRIM_BEYOND_SQL = Sql(
    "DELETE FROM events WHERE id <= (SELECT id FROM events ORDER BY id DESC LIMIT 1 OFFSET ?)",
    f"DELETE FROM events WHERE run = {RUN} AND id <= "
    f"(SELECT id FROM events WHERE run = {RUN} ORDER BY id DESC LIMIT 1 OFFSET %s)",
)


def _trim_events(ledger: Ledger, now: int, retention_days: float | None, max_rows: int | None) -> int:
    trimmed = 0
    with ledger.transaction():
        raw = ledger._db.raw
        if retention_days is not None:
            trimmed += raw.execute(_TRIM_OLD_SQL, (now - int(retention_days * _DAY_MS),)).rowcount
        if max_rows is not None:
            trimmed += raw.execute(_TRIM_BEYOND_SQL, (max(0, max_rows),)).rowcount
    return trimmed


def run_hygiene(
    ledger: Ledger | None,
    runs_root: str | Path,
    *,
    current_run: str | Path | None = None,
    now_ms: int | None = None,
    orphan_stale_ms: int = ORPHAN_STALE_MS,
    retention_days: float = RETENTION_DAYS,
    event_retention_days: float | None = None,
    event_max_rows: int | None = None,
    cgroup_parent: str | Path | None = None,
    keep_shared_rows: bool = False,
) -> HygieneReport:
    """One best-effort hygiene pass; every failure is logged and reported, never raised."""
    report = HygieneReport()
    root = Path(runs_root)
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    current = Path(current_run) if current_run is not None else None
    steps: list[tuple[str, Any]] = [("temp dirs", lambda: _sweep_temp_dirs(root, now, orphan_stale_ms, report))]
    if ledger is not None:
        steps.append(("orphan nodes", lambda: _abandon_orphans(ledger, root, now, orphan_stale_ms, report)))
    steps.append(("old runs", lambda: _remove_old_runs(root, current, now, retention_days, report, keep_shared_rows)))
    if ledger is not None and (event_retention_days is not None or event_max_rows is not None):
        def trim() -> None:
            report.events_trimmed = _trim_events(ledger, now, event_retention_days, event_max_rows)

        steps.append(("event trim", trim))

    def cgroups() -> None:
        report.cgroups_removed = remove_dead_runs(Path(cgroup_parent) if cgroup_parent is not None else None)

    steps.append(("dead run cgroups", cgroups))
    for name, step in steps:
        try:
            step()
        except Exception as exc:  # best effort by contract: report, never raise
            logger.warning("hygiene step {!r} failed: {}", name, exc)
            report.errors.append(f"{name}: {type(exc).__name__}: {exc}")
    return report
