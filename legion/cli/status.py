"""Views of one run, from its ledger (a live or a finished run alike): `legion status`, `tree`, `events`
(`--follow` keeps printing them as they land), `summary` and `timing`. `status`, `events` and `summary` with
`--ledger` show every run of a ledger database instead (the fleet view: legion/cli/fleet.py)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from legion.cli import fleet
from legion.cli.common import EXIT_ROOT_DIED, EXIT_USAGE, print_json, read_ledger
from legion.reports.events import ledger_event
from legion.runs import resolve_run

FOLLOW_WAIT_S = 1.0  # --follow --idle: how often the idle deadline is checked while no event lands


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("status", help="the nodes of a run: status, phase, model, last update (--ledger: every run "
                                      "of a ledger database)")
    _add_run_arg(p)
    fleet.add_fleet_args(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("tree", help="the run's supervision tree")
    p.add_argument("run", nargs="?", help="run directory or run id (default: the newest run)")
    p.set_defaults(func=cmd_tree)

    p = sub.add_parser("events", help="the run's ledger events after a cursor (--json: docs/events.md's shape; "
                                      "--ledger: every run's)")
    _add_run_arg(p)
    fleet.add_fleet_args(p)
    p.add_argument("--after", type=int, default=0, help="event id cursor (default 0)")
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--follow", "-f", action="store_true", help="keep printing events as they land (Ctrl-C stops)")
    p.add_argument("--idle", type=float, default=None, help="with --follow: stop after S seconds without events")
    p.set_defaults(func=cmd_events)


def add_report_parsers(sub: Any) -> None:
    for name, help_ in (("summary", "per node: role, model, status, phase, turns, tools, tokens, cost, wall time, "
                                    "final output, branch"),
                        ("timing", "per node: wall, generation, tool and waiting time")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("run", nargs="?", help="run directory or run id (default: the newest run)")
        p.add_argument("name", nargs="?", help="one node and its subtree (default: every node)")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if name == "summary":
            fleet.add_fleet_args(p)
        p.set_defaults(func=cmd_report, report=name)


def _add_run_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="?", help="run directory or run id (default: the newest run)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def cmd_status(args: argparse.Namespace) -> int:
    from legion.reports import views

    if fleet.wants_fleet(args):
        return fleet.run_fleet(args, fleet.show_status)
    run_dir = resolve_run(Path(args.cwd), args.run)
    rows = read_ledger(run_dir, views.read_nodes)
    from legion.reports.liveness import run_condition

    state, died = run_condition(run_dir)
    code = EXIT_ROOT_DIED if died else 0
    if args.json:
        print_json({"run": str(run_dir), "nodes": rows, "state": state, "rootDied": died})
        return code
    print(f"run {run_dir}")
    if state:
        print(state)
    print("\n".join(views.status_lines(rows)) or "(no nodes)")
    return code


def cmd_tree(args: argparse.Namespace) -> int:
    from legion.reports import views

    run_dir = resolve_run(Path(args.cwd), args.run)
    Console().print(views.node_tree(read_ledger(run_dir, views.read_nodes), f"run {run_dir.name}"))
    return 0


def cmd_events(args: argparse.Namespace) -> int:
    from legion.reports import views

    if fleet.wants_fleet(args):
        return fleet.run_fleet(args, fleet.show_events)
    run_dir = resolve_run(Path(args.cwd), args.run)
    if args.follow:
        return follow_events(run_dir, args.after, args.json, idle=args.idle)
    events = read_ledger(run_dir, lambda d: views.read_events(d, after=args.after, limit=args.limit))
    for ev in events:
        if args.json:
            print_json(ledger_event({"id": ev.id, "node_id": ev.node_id, "type": ev.type, "data": ev.data, "ts": ev.ts},
                                    run=run_dir.name))
        else:
            print(f"{ev.id:>6} {views.iso_time(ev.ts)} {views.printable(ev.type):<16} {views.printable(ev.node_id or '-'):<20} "
                  f"{orjson.dumps(ev.data).decode()}")
    return 0


def _events_after(run_dir: Path, cursor: int) -> list[dict[str, Any]]:
    """The next events as fastread's rows: from the SQLite file directly, else through the ledger (PostgreSQL,
    or a file of another schema version)."""
    from dataclasses import asdict

    from legion.reports import fastread
    from legion.runs import open_run_ledger

    with fastread.connect_run(run_dir) as conn:
        if conn is not None:
            return fastread.events_after(conn, cursor, 1000)
    with contextlib.closing(open_run_ledger(run_dir)) as ledger:
        return [asdict(ev) for ev in ledger.events_after(cursor, limit=1000)]


def follow_events(run_dir: Path, after: int, as_json: bool, *, idle: float | None = None) -> int:
    """Print the ledger's events as they land (a cursor over the events table), until Ctrl-C or `idle` seconds
    without one (a finished run included: a resume can add to it). Between reads it waits on the ledger
    (ledger/event_wait.py): LISTEN on PostgreSQL, data_version on SQLite."""
    from legion.ledger.event_wait import event_waiter
    from legion.ledger.location import LEDGER_FILE
    from legion.runs import ledger_url

    url = ledger_url(run_dir)
    waiter = read_ledger(run_dir, lambda d: event_waiter(url or d / LEDGER_FILE, [_run_id(d)] if url else None))
    try:
        return _follow(run_dir, after, as_json, waiter, idle)
    finally:
        waiter.close()


def _run_id(run_dir: Path) -> str:
    from legion.ledger import read_run_json

    return str((read_run_json(run_dir) or {}).get("runId") or run_dir.name)


def _follow(run_dir: Path, after: int, as_json: bool, waiter: Any, idle: float | None) -> int:
    from legion.reports.views import iso_time, printable

    last_new = time.monotonic()
    cursor = after
    while True:
        batch = _events_after(run_dir, cursor)
        for ev in batch:
            cursor = ev["id"]
            if as_json:
                with contextlib.suppress(BrokenPipeError):
                    print_json(ledger_event(ev, run=run_dir.name), default=str)
            else:
                print(f"{ev['id']:>6} {iso_time(ev['ts'])} {printable(ev['type']):<16} {printable(ev['node_id'] or '-'):<20} "
                      f"{orjson.dumps(ev['data']).decode()}")
        sys.stdout.flush()
        if batch:
            last_new = time.monotonic()
            continue
        if idle is not None and time.monotonic() - last_new > idle:
            return 0
        waiter.wait(None if idle is None else FOLLOW_WAIT_S)


def cmd_report(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from legion.reports.run_report import run_report, summary_lines, timing_lines

    if args.report == "summary" and fleet.wants_fleet(args):
        if args.name is not None:
            print("legion summary: with --ledger, name a run with --run ID (a node NAME is for one run's summary)",
                  file=sys.stderr)
            return EXIT_USAGE
        return fleet.run_fleet(args, fleet.show_summary)
    run_dir = resolve_run(Path(args.cwd).resolve(), args.run)
    reports = run_report(run_dir, args.name)
    if args.name is not None and not reports:
        from legion.orchestration.orchestrator import did_you_mean

        known = [r.name for r in run_report(run_dir)]
        print(f"legion {args.report}: no node '{args.name}' in run {run_dir.name}{did_you_mean(args.name, known)}",
              file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print_json({"run": str(run_dir), "nodes": [asdict(r) for r in reports]}, default=str)
        return 0
    print(f"run {run_dir.name}")
    print("\n".join(summary_lines(reports) if args.report == "summary" else timing_lines(reports)))
    return 0
