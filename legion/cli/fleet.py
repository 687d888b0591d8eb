"""The fleet view: `legion status|summary|events|monitor --ledger [URL]` show every run a ledger database holds
(docs/servers.md, "A fleet"), filtered by `--run`, `--host`, `--state` and `--project`.

Only `--ledger` switches a command to the fleet view; `--ledger` without a URL reads LEGION_LEDGER_URL. The
variable alone never does: with it set (for `legion run`), `legion status` still shows this project's newest run."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from legion.cli.common import EXIT_LEDGER, EXIT_USAGE, print_json
from legion.reports.fleet import Filters, FleetError

if TYPE_CHECKING:
    from legion.ledger import Ledger
    from legion.ledger.fleet_runs import RunRow

T = TypeVar("T")
FILTERS = ("run", "host", "state", "project")
FOLLOW_READ_S = 30.0  # --follow: the longest wait between two reads of the runs list (new runs, state filters)


def add_fleet_args(p: argparse.ArgumentParser, *, filters: bool = True) -> None:
    """--ledger [URL] and the filters."""
    p.add_argument("--ledger", nargs="?", const="", default=None, metavar="URL",
                   help="the fleet view: every run in this ledger (a postgresql:// URL, or a run's legion.db); "
                        "--ledger alone reads LEGION_LEDGER_URL")
    if filters:
        p.add_argument("--run", dest="fleet_run", metavar="ID", help="with --ledger: only this run")
    p.add_argument("--host", help="with --ledger: only runs on this host")
    p.add_argument("--state", action="append", metavar="STATE",
                   help="with --ledger: only runs in this state (starting, running, paused, settled, failed, lost, "
                        "…; repeat it or separate with commas)")
    p.add_argument("--project", help="with --ledger: only runs of this project (legion.project)")


def wants_fleet(args: argparse.Namespace) -> bool:
    """The command shows the fleet (--ledger given); filters without it are refused."""
    if args.ledger is not None:
        return True
    given = [f"--{name}" for name in FILTERS if _filter_value(args, name) is not None]
    if given:
        raise FleetError(f"{', '.join(given)} filter the fleet view: add --ledger URL (or --ledger alone for "
                         "LEGION_LEDGER_URL)")
    return False


def _filter_value(args: argparse.Namespace, name: str) -> Any:
    return getattr(args, "fleet_run" if name == "run" else name, None)


def filters(args: argparse.Namespace) -> Filters:
    states = None
    if args.state:
        states = tuple(s.strip() for given in args.state for s in given.split(",") if s.strip())
    return Filters(run=getattr(args, "fleet_run", None), host=args.host, states=states, project=args.project)


def target(args: argparse.Namespace) -> str:
    from legion.ledger.location import URL_ENV

    given = args.ledger or os.environ.get(URL_ENV, "").strip()
    if not given:
        raise FleetError(f"--ledger without a URL reads {URL_ENV}, which is not set: pass --ledger "
                         "postgresql://USER@HOST:PORT/DATABASE")
    return str(given)


def run_fleet(args: argparse.Namespace, show: Callable[[Ledger, argparse.Namespace], T]) -> T | int:
    """Open the fleet reader, `show`, and turn what goes wrong into one line and an exit status."""
    from legion.ledger import LedgerError
    from legion.ledger.errors import LedgerUrlError
    from legion.reports.fleet import open_fleet

    name = f"legion {args.command}"
    if getattr(args, "run", None) is not None:
        print(f"{name}: with --ledger, name a run with --run {args.run} (the positional RUN is a run directory)",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        with contextlib.closing(open_fleet(target(args))) as fleet:
            return show(fleet, args)
    except FleetError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LedgerUrlError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LedgerError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return EXIT_LEDGER


# ----- status ------------------------------------------------------------------------------------------------------
def show_status(fleet: Ledger, args: argparse.Namespace) -> int:
    from legion.reports.fleet import run_rows, select_runs
    from legion.reports.views import iso_time, printable

    rows = run_rows(fleet, select_runs(fleet, filters(args)))
    if args.json:
        print_json({"ledger": fleet.path, "runs": rows})
        return 0
    print(f"ledger {fleet.path}")
    if not rows:
        print("(no runs)")
        return 0
    table = [("RUN", "PROJECT", "HOST", "STATE", "NODES", "COST", "STARTED", "HEARTBEAT")]
    for r in rows:
        table.append((printable(r["run"]), printable(r["project"] or "-"), printable(r["host"] or "-"), r["shown"],
                      f"{r['live']}/{r['nodes']}", f"${r['cost_usd']:.4f}", iso_time(r["started_at"])[:19],
                      f"{r['heartbeat_age_s']:g}s ago" if r["ended_at"] is None else "ended"))
    print("\n".join(_columns(table)))
    return 0


def _columns(table: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table]


# ----- summary -----------------------------------------------------------------------------------------------------
def show_summary(fleet: Ledger, args: argparse.Namespace) -> int:
    from legion.reports.fleet import run_rows, select_runs, totals
    from legion.reports.views import printable

    rows = run_rows(fleet, select_runs(fleet, filters(args)))
    total = totals(rows)
    if args.json:
        print_json({"ledger": fleet.path, "runs": rows, "totals": total})
        return 0
    print(f"ledger {fleet.path}")
    table = [("RUN", "HOST", "STATE", "NODES", "FAILED", "TOKENS IN", "TOKENS OUT", "COST", "WALL")]
    for r in rows:
        wall = ((r["ended_at"] or r["updated_at"]) - r["started_at"]) / 1000
        table.append((printable(r["run"]), printable(r["host"] or "-"), r["shown"], str(r["nodes"]), str(r["failed"]),
                      str(r["tokens_in"]), str(r["tokens_out"]), f"${r['cost_usd']:.4f}", f"{wall:.1f}s"))
    table.append(("total", "", ", ".join(f"{n} {s}" for s, n in sorted(total["states"].items())) or "-",
                  str(total["nodes"]), str(total["failed"]), str(total["tokens_in"]), str(total["tokens_out"]),
                  f"${total['cost_usd']:.4f}", ""))
    print("\n".join(_columns(table)))
    return 0


# ----- events ------------------------------------------------------------------------------------------------------
def show_events(fleet: Ledger, args: argparse.Namespace) -> int:
    """The events of the matching runs after --after (each run's own cursor), oldest first; --follow keeps
    printing them, waking on the ledger's notice (PostgreSQL LISTEN) or its data_version (SQLite)."""
    from legion.reports.fleet import select_runs

    chosen = filters(args)
    cursors = {r.run: args.after for r in select_runs(fleet, chosen)}
    if not args.follow:
        _print_events(fleet.fleet_events_after(cursors, limit=args.limit), args.json)
        return 0
    return _follow(fleet, args, chosen, cursors)


def _follow(fleet: Ledger, args: argparse.Namespace, chosen: Filters, cursors: dict[str, int]) -> int:
    from legion.ledger.event_wait import event_waiter
    from legion.reports.fleet import select_runs

    waiter = event_waiter(target(args), None if chosen.run is None else [chosen.run])
    try:
        last_new = last_list = time.monotonic()
        while True:
            batch = fleet.fleet_events_after(cursors)
            for run, ev in batch:
                cursors[run] = max(cursors[run], ev.id)
            _print_events(batch, args.json)
            woke = False
            if batch:
                last_new = time.monotonic()
            elif args.idle is not None and time.monotonic() - last_new > args.idle:
                return 0
            else:
                woke = waiter.wait(FOLLOW_READ_S if args.idle is None else min(FOLLOW_READ_S, args.idle))
            if woke or time.monotonic() - last_list >= FOLLOW_READ_S:  # a new run, a state filter's change
                last_list = time.monotonic()
                for row in select_runs(fleet, chosen):
                    cursors.setdefault(row.run, args.after)
    finally:
        waiter.close()


def _print_events(batch: list[tuple[str, Any]], as_json: bool) -> None:
    from legion.reports.events import ledger_event
    from legion.reports.views import iso_time, printable

    for run, ev in sorted(batch, key=lambda pair: (pair[1].ts, pair[0], pair[1].id)):
        if as_json:
            print_json(ledger_event({"id": ev.id, "node_id": ev.node_id, "type": ev.type, "data": ev.data,
                                     "ts": ev.ts}, run=run), default=str)
        else:
            print(f"{ev.id:>6} {iso_time(ev.ts)} {printable(run):<14} {printable(ev.type):<16} "
                  f"{printable(ev.node_id or '-'):<20} {orjson.dumps(ev.data).decode()}")
    sys.stdout.flush()


# ----- monitor -----------------------------------------------------------------------------------------------------
def monitor_row(fleet: Ledger, args: argparse.Namespace) -> RunRow | None:
    """With --run: that run's row, which must have a tcp monitor; without: print the runs that have one, None."""
    from legion.reports.fleet import select_runs
    from legion.reports.views import printable

    rows = select_runs(fleet, filters(args))
    if args.fleet_run is None:
        watched = [r for r in rows if r.monitor_endpoint]
        if args.json:
            print_json({"ledger": fleet.path, "runs": [{"run": r.run, "host": r.host, "state": r.shown,
                                                        "monitor_endpoint": r.monitor_endpoint,
                                                        "server_key": r.server_key} for r in watched]})
            return None
        print(f"ledger {fleet.path}")
        for r in watched:
            print(f"{printable(r.run)}  {printable(r.host or '-')}  {r.shown}  {printable(r.monitor_endpoint)}")
        if not watched:
            print(f"(no run has a tcp monitor: {len(rows)} run(s) match; start one with legion run --monitor "
                  "tcp://HOST:PORT)")
        else:
            print("attach with: legion monitor --ledger URL --run ID --key CLIENT.key_secret")
        return None
    (row,) = rows if rows else (None,)
    if row is None:  # the run exists, but the other filters leave it out
        raise FleetError(f"run '{args.fleet_run}' does not match --host/--state/--project")
    if not row.monitor_endpoint or not row.server_key:
        raise FleetError(f"run '{row.run}' has no tcp monitor (it was started without --monitor tcp://HOST:PORT); "
                         f"on its host {row.host or '?'}: legion monitor {row.run}")
    return row


def reachable(endpoint: str, host: str | None) -> str:
    """A monitor bound to every address (0.0.0.0, [::]) is reached at its run's host name."""
    for wildcard in ("tcp://0.0.0.0:", "tcp://*:", "tcp://[::]:"):
        if endpoint.startswith(wildcard) and host:
            return f"tcp://{host}:{endpoint[len(wildcard):]}"
    return endpoint
