"""`legion team [NAME]`, `legion init`, `legion rebuild RUN` and `legion events --follow`."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from legion.paths import ensure_ignored, project_dir
from legion.run_errors import EXIT_USAGE
from legion.runs import resolve_run

FOLLOW_POLL_S = 0.25

SAMPLE_CARD = """\
---
# A project role card: legion launches it as `subagent launch agent=reviewer-strict` (or in a team roster).
# Every key is optional but name/description; `legion agents` lists the effective model of each card.
name: reviewer-strict
description: Strict reviewer for this project; checks tests and the change against its contract.
kind: native                 # native (legion's own session) | pi (the pi CLI)
# model: anthropic/claude-sonnet-4-5:medium   # provider/model-id[:thinking]; default: the parent's model
tools: [bash, read, ls, find, grep]           # the tools it may use (no write/edit: it reviews)
maxSubagentDepth: 1          # 1 = a leaf: it launches no agents
restart: transient           # permanent | transient | temporary
---
You review one change in this repository. Read the contract and the diff, run the tests, and end with
a short verdict: what is wrong (file:line, why, the fix) or that it is ready.
"""


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("team", help="the teams (rosters) of the settings; with NAME one team's members and models")
    p.add_argument("name", nargs="?")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_team)

    p = sub.add_parser("init", help="write .legion/settings.json, a settings reference and a sample project card "
                                    "(never overwrites)")
    p.set_defaults(func=cmd_init)

    p = sub.add_parser("rebuild", help="rebuild a finished run's ledger from its run directory (honest limits)")
    p.add_argument("run", help="run directory or run id")
    p.add_argument("--json", action="store_true", help="the report as JSON")
    p.set_defaults(func=cmd_rebuild)


# ----- team -----------------------------------------------------------------------------------------
def cmd_team(args: argparse.Namespace) -> int:
    from legion.agents import AgentDefinitionError, load_catalog, load_settings
    from legion.agents.listing import list_agents
    from legion.agents.teams import active_team

    cwd = Path(args.cwd).resolve()
    try:
        settings = load_settings(cwd)
        rows = {r.name: r for r in list_agents(cwd, settings=settings)}
        load_catalog(cwd, settings=settings)
    except AgentDefinitionError as exc:
        print(f"legion team: {exc}", file=sys.stderr)
        return EXIT_USAGE
    active = active_team(settings, os.environ)
    teams = dict(settings.teams)
    if args.name is None:
        listing: list[dict[str, Any]] = [{"name": "default", "members": sorted(rows), "description": "every enabled card",
                    "active": active.name == "default"}]
        listing += [{"name": t.name, "members": [m.name or m.role for m in t.members], "description": t.description,
                     "active": active.name == t.name} for t in teams.values()]
        if args.json:
            _print_json({"active": active.name, "source": active.source, "teams": listing})
            return 0
        for team in listing:
            mark = "*" if team["active"] else " "
            print(f"{mark} {team['name']:<16} {', '.join(team['members'])}"
                  + (f" — {team['description']}" if team["description"] else ""))
        print(f"(* active: {active.name}, from {active.source}; LEGION_TEAM or the `team` setting selects one)")
        return 0
    if args.name != "default" and args.name not in teams:
        from legion.supervision.orchestrator import did_you_mean

        print(f"legion team: no team '{args.name}'{did_you_mean(args.name, ['default', *teams])}; teams: "
              f"{', '.join(['default', *teams])}", file=sys.stderr)
        return EXIT_USAGE
    members = ([{"role": n, "name": n, "model": rows[n].model, "origin": rows[n].origin} for n in sorted(rows)]
               if args.name == "default" else
               [{"role": m.role, "name": m.name or m.role,
                 "model": m.model or (rows[m.role].model if m.role in rows else "?"),
                 "origin": "team roster" if m.model else (rows[m.role].origin if m.role in rows else "no such card"),
                 "preset": m.preset} for m in teams[args.name].members])
    if args.json:
        _print_json({"team": args.name, "members": members})
        return 0
    for m in members:
        print(f"{m['name']:<16} {m['role']:<12} {m['model']}  ({m['origin']})")
    return 0


# ----- init -----------------------------------------------------------------------------------------
def cmd_init(args: argparse.Namespace) -> int:
    from legion.agents.settings_schema import settings_reference

    folder = project_dir(Path(args.cwd).resolve())
    files = {
        folder / "settings.json": orjson.dumps({"legion": {"maxDepth": 4, "maxChildrenPerNode": 8,
                                                          "budget": {"maxCostUsd": 5.0}},
                                               "retentionDays": 14}, option=orjson.OPT_INDENT_2) + b"\n",
        folder / "settings.reference.md": _reference(settings_reference()).encode(),
        folder / "agents" / "reviewer-strict.md": SAMPLE_CARD.encode(),
    }
    existing = [p for p in files if p.exists()]
    if existing:
        print(f"legion init: {', '.join(str(p) for p in existing)} exist(s) already; nothing was written "
              "(move them away to start over)", file=sys.stderr)
        return EXIT_USAGE
    for path, content in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "xb") as fh:  # x: never overwrite, even in a race
            fh.write(content)
        print(f"wrote {path}")
    ignore = folder / ".gitignore"
    if not ignore.exists():
        ensure_ignored(folder.parent)
        print(f"wrote {ignore} (git ignores .legion/; `git add -f` shares a file of it)")
    print("next: `legion doctor`, `legion agents`, `legion demo`, then `legion run \"your task\"`")
    return 0


def _reference(rows: list[tuple[str, str, Any]]) -> str:
    """settings.json takes no comments: its keys are documented beside it."""
    lines = ["# .legion/settings.json — every key", "",
             "Project settings deep-merge over `~/.config/legion/settings.json`. Unknown keys are errors.", "",
             "| key | type | default |", "|---|---|---|"]
    for path, kind, default in rows:
        if isinstance(default, dict):
            default = "" if default else "{}"
        lines.append(f"| `{path}` | {kind} | {'' if default is None else f'`{default}`'} |")
    return "\n".join(lines) + "\n"


# ----- rebuild --------------------------------------------------------------------------------------
def cmd_rebuild(args: argparse.Namespace) -> int:
    from legion.ledger import LedgerError, owner_alive, read_run_json

    run_dir = resolve_run(Path(args.cwd).resolve(), args.run) if not Path(args.run).is_dir() else Path(args.run)
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
        _print_json(out)
        return 0
    if recovered:
        print(recovered)
    print(f"rebuilt {run_dir}: {report.nodes} nodes, {report.usage} usage rows, {report.artifacts} artifacts"
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
    from legion.run import load_launch_records

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
    from legion.run import load_launch_records
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


# ----- events --follow ------------------------------------------------------------------------------
def follow_events(run_dir: Path, after: int, as_json: bool, *, idle: float | None = None) -> int:
    """Print the ledger's events as they land (a cursor over the events table), until Ctrl-C or `idle` seconds
    without one, or the run ended and nothing is left."""
    from legion.reports import fastread
    from legion.reports.views import printable

    last_new = time.monotonic()
    cursor = after
    while True:
        with fastread.connect(run_dir / "legion.db") as conn:
            batch = fastread.events_after(conn, cursor, 1000) if conn is not None else []
        for ev in batch:
            cursor = ev["id"]
            if as_json:
                _print_json(ev)
            else:
                print(f"{ev['id']:>6} {ev['ts']} {printable(ev['type']):<16} {printable(ev['node_id'] or '-'):<20} "
                      f"{orjson.dumps(ev['data']).decode()}")
        sys.stdout.flush()
        if batch:
            last_new = time.monotonic()
            continue
        if idle is not None and time.monotonic() - last_new > idle:
            return 0
        time.sleep(FOLLOW_POLL_S)


def _print_json(value: Any) -> None:
    with contextlib.suppress(BrokenPipeError):
        sys.stdout.write(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=str).decode() + "\n")
