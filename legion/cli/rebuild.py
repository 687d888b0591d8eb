"""`legion rebuild RUN`: rebuild a finished run's ledger from its run directory (run.json, the launch records and
the transcripts), keeping a copy of the old one, and say what a rebuild cannot restore."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from legion.cli.common import EXIT_USAGE, print_json
from legion.runs import ledger_url, resolve_run


def add_parser(sub: Any) -> None:
    p = sub.add_parser("rebuild", help="rebuild a finished run's ledger from its run directory (honest limits)")
    p.add_argument("run", help="run directory or run id")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.set_defaults(func=cmd_rebuild)


def cmd_rebuild(args: argparse.Namespace) -> int:
    from legion.ledger import LedgerError, owner_alive, read_run_json
    from legion.reports.views import plural

    run_dir = resolve_run(Path(args.cwd).resolve(), args.run) if not Path(args.run).is_dir() else Path(args.run)
    url = ledger_url(run_dir)
    if url is not None:
        print(f"legion rebuild: run {run_dir.name} records into the PostgreSQL ledger at {url}; rebuild repairs a "
              "damaged SQLite legion.db file only (a database server is backed up and repaired with its own tools: "
              "pg_dump, pg_restore). Nothing was changed", file=sys.stderr)
        return EXIT_USAGE
    data = read_run_json(run_dir)
    recovered = None
    if data is None:
        data, recovered = _recover_run_json(run_dir)
        if data is None:
            print(f"legion rebuild: {recovered}; nothing was changed", file=sys.stderr)
            return EXIT_USAGE
    owner = data.get("owner")
    if isinstance(owner, dict) and owner_alive(owner):
        print(f"legion rebuild: run {run_dir.name} is live (root pid {owner.get('pid')}); stop it first",
              file=sys.stderr)
        return EXIT_USAGE
    backup = _backup(run_dir)
    try:
        report = _rebuild(run_dir, data)
    except LedgerError as exc:
        print(f"legion rebuild: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out = {"run": str(run_dir), "backup": str(backup) if backup else None, "nodes": report.nodes,
           "events": report.events, "usage": report.usage, "artifacts": report.artifacts,
           "messages_preserved": report.messages_preserved, "phase_recovered": report.phase_recovered,
           "warnings": report.warnings, "limits": list(report.limits)}
    if args.json:
        with contextlib.suppress(BrokenPipeError):
            print_json(out, default=str)
        return 0
    if recovered:
        print(recovered)
    print(f"rebuilt {run_dir}: {plural(report.nodes, 'node')}, {plural(report.usage, 'usage row')}, "
          f"{plural(report.artifacts, 'artifact')}"
          + (f"; the old ledger is {backup}" if backup else ""))
    for warning in report.warnings:
        print(f"  warning: {warning}")
    print("what a rebuild cannot restore:")
    for limit in report.limits:
        print(f"  - {limit}")
    return 0


def _recover_run_json(run_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """run.json is missing or torn (a torn one is now run.json.corrupt): write one from the root session's launch
    record, so the rebuilt run can be resumed. (None, why not) when that cannot be done."""
    from legion.ledger import write_run_json
    from legion.ledger.runfile import lock_held, recovered_run_json
    from legion.orchestration.run import load_launch_records

    where = f"{run_dir}/run.json is missing or corrupt (a corrupt one was moved to run.json.corrupt)"
    if lock_held(run_dir / "root.lock"):
        return None, f"{where}, and a root still holds the run (root.lock); stop it first"
    roots = [r for r in load_launch_records(run_dir).values() if not (r.get("spec") or {}).get("parentId")]
    if len(roots) != 1:
        return None, (f"{where}, and launches/ holds {len(roots)} root session records (need exactly one) to "
                      "write a new one from")
    data = recovered_run_json(run_dir, roots[0])
    write_run_json(run_dir, data)
    return data, (f"{where}; wrote a new run.json from launches/{roots[0]['id']}.json (runId, cwd, task, "
                  "sessionFile), so `legion resume` can continue the run")


def _backup(run_dir: Path) -> Path | None:
    """A copy of the old ledger (SQLite's backup API: consistent with its WAL), kept beside it: a rebuild
    loses nothing it replaces. A ledger SQLite cannot read is moved aside whole instead."""
    import sqlite3

    db = run_dir / "legion.db"
    if not db.exists():
        return None
    target = run_dir / f"legion.db.before-rebuild-{time.strftime('%Y%m%d-%H%M%S')}"
    try:
        src = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            src.execute("SELECT count(*) FROM sqlite_master").fetchone()
            dst = sqlite3.connect(target)
            with contextlib.closing(dst):
                src.backup(dst)
        finally:
            src.close()
    except sqlite3.DatabaseError:
        for suffix in ("", "-wal", "-shm"):
            if Path(f"{db}{suffix}").exists():
                os.replace(f"{db}{suffix}", f"{target}{suffix}")
    return target


def _rebuild(run_dir: Path, data: dict[str, Any]) -> Any:
    """Give run.json the root/children records the rebuild reads (from the launch records), then rebuild."""
    from legion.ledger import open_ledger, rebuild_ledger, write_run_json
    from legion.orchestration.run import load_launch_records
    from legion.workers.outcome import derive_outcome

    records = load_launch_records(run_dir)
    status_of = {"success": "settled", "failed": "failed", "truncated": "failed"}
    nodes = []
    for rec in records.values():
        spec = rec.get("spec") or {}
        nodes.append({"id": rec["id"], "name": rec["id"], "role": rec.get("role"), "parent_id": spec.get("parentId"),
                      "depth": spec.get("depth", 0), "kind": "pi" if spec.get("engine") == "pi" else "native",
                      "model": rec.get("model"), "team": spec.get("team"), "session_file": rec.get("transcript"),
                      "status": status_of.get(derive_outcome(rec["transcript"]), "retired"),
                      "run_id": data.get("runId")})
    root = next((n for n in nodes if n["parent_id"] is None), None)
    if root is not None:
        data = {**data, "run_id": data.get("runId"), "root": root, "children": [n for n in nodes if n is not root]}
        write_run_json(run_dir, data)
    ledger = open_ledger(run_dir / "legion.db")
    try:
        return rebuild_ledger(ledger, run_dir)
    finally:
        ledger.close()
