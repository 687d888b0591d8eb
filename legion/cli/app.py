"""The `legion` command line."""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from legion import __version__
from legion.cli import doctor
from legion.runs import RunNotFound, resolve_run

DOCTOR_SECTIONS = ("summary", "machine", "models", "spawn", "memory", "tools", "storage", "runtime",
                   "errors", "next")

EXIT_USAGE = 2
EXIT_LEDGER = 3  # the run's ledger cannot be read
EXIT_ROOT_DIED = 1  # `legion status`: the run's root (or its detached daemon) died mid-run


class LedgerUnreadable(Exception):
    """The run's legion.db could not be read; the message says what to do."""


def _ledger_unreadable(run_dir: Path, exc: BaseException) -> LedgerUnreadable:
    path = run_dir / "legion.db"
    reason = (str(exc).splitlines() or [type(exc).__name__])[0]
    return LedgerUnreadable(
        f"cannot read the ledger {path} ({reason}). It may be damaged or not a legion ledger: check it with "
        f"`sqlite3 {path} 'PRAGMA integrity_check'` and save what it holds with "
        f"`sqlite3 {path} .recover > recovered.sql`")


def _read_ledger(run_dir: Path, read: Callable[[Path], Any]) -> Any:
    """``read(run_dir)``, with a damaged or foreign ledger turned into one clear error."""
    try:
        return read(run_dir)
    except Exception as exc:
        # imported only on failure: SQLAlchemy costs a report most of its 300 ms budget (legion/fastread.py)
        from sqlalchemy.exc import SQLAlchemyError

        from legion.ledger import LedgerError

        if isinstance(exc, LedgerError | SQLAlchemyError | sqlite3.DatabaseError):
            raise _ledger_unreadable(run_dir, exc) from exc
        raise


def _print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=_json_default).decode() + "\n")


def _json_default(value: Any) -> Any:
    """A ledger value JSON has no type for (a BLOB in a damaged row): its repr, so --json never raises."""
    if isinstance(value, bytes | bytearray | memoryview):
        return repr(bytes(value))
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def _cmd_doctor(args: argparse.Namespace) -> int:
    from legion.cli.doctor_sections import section as doctor_section

    commands = command_names(build_parser())
    checks = doctor_section(args.section or "machine", Path(args.cwd).resolve(), commands)
    if args.json:
        _print_json(doctor.as_dicts(checks))
    else:
        print(doctor.render(checks))
    return doctor.exit_code(checks)


def command_names(parser: argparse.ArgumentParser) -> list[str]:
    """Every subcommand (doctor's tools section lists them from the parser itself: they cannot drift)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return sorted(action.choices)
    return []


def _cmd_agents(args: argparse.Namespace) -> int:
    from legion.agents import AgentDefinitionError, format_rows, list_agents

    try:
        rows = list_agents(Path(args.cwd), args.scope, include_disabled=args.all)
    except AgentDefinitionError as exc:
        print(f"legion agents: {exc}", file=sys.stderr)
        return 1
    if args.json:
        _print_json([row.__dict__ for row in rows])
    else:
        print("\n".join(format_rows(rows)))
    broken = sum(row.source == "error" for row in rows)
    if broken:
        print(f"legion agents: {broken} card file(s) failed to load (the 'error' rows); fix them or move "
              "them away", file=sys.stderr)
        return 1
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    from legion.reports import views

    run_dir = resolve_run(Path(args.cwd), args.run)
    rows = _read_ledger(run_dir, views.read_nodes)
    from legion.cli.server import run_condition

    state, died = run_condition(run_dir)
    code = EXIT_ROOT_DIED if died else 0
    if args.json:
        _print_json({"run": str(run_dir), "nodes": rows, "state": state, "rootDied": died})
        return code
    print(f"run {run_dir}")
    if state:
        print(state)
    print("\n".join(views.status_lines(rows)) or "(no nodes)")
    return code


def _cmd_tree(args: argparse.Namespace) -> int:
    from legion.reports import views

    run_dir = resolve_run(Path(args.cwd), args.run)
    Console().print(views.node_tree(_read_ledger(run_dir, views.read_nodes), f"run {run_dir.name}"))
    return 0


def _cmd_events(args: argparse.Namespace) -> int:
    from legion.reports import views

    run_dir = resolve_run(Path(args.cwd), args.run)
    if args.follow:
        from legion.cli.project import follow_events

        return follow_events(run_dir, args.after, args.json, idle=args.idle)
    events = _read_ledger(run_dir, lambda d: views.read_events(d, after=args.after, limit=args.limit))
    for ev in events:
        if args.json:
            _print_json({"id": ev.id, "node_id": ev.node_id, "type": ev.type, "data": ev.data, "ts": ev.ts})
        else:
            print(f"{ev.id:>6} {ev.ts} {views.printable(ev.type):<16} {views.printable(ev.node_id or '-'):<20} "
                  f"{orjson.dumps(ev.data).decode()}")
    return 0


def _cmd_monitor(args: argparse.Namespace) -> int:
    from legion.bus.monitor import MonitorError, MonitorStream, Snapshot
    from legion.cli.server import client_config, monitor_endpoints
    from legion.run_errors import RunConfigError

    target = args.target
    snapshot = None
    try:
        curve = client_config(args.key, args.server_key)
        if target.startswith("tcp://"):
            target, snapshot = monitor_endpoints(target)
            snapshot = args.snapshot or snapshot
            if curve is None:
                raise RunConfigError("a tcp:// monitor is CurveZMQ only: pass --key CLIENT.key_secret and "
                                     "--server-key SERVER.key")
        elif "://" not in target:
            target = str(resolve_run(Path(args.cwd), target))
        else:
            snapshot = args.snapshot
    except RunConfigError as exc:
        print(f"legion monitor: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        stream = MonitorStream(target, snapshot_endpoint=snapshot, curve=curve, idle_timeout=args.idle)
    except MonitorError as exc:
        print(f"legion monitor: {exc} — is the run still live? (`legion status` reads a finished run)",
              file=sys.stderr)
        return 1
    seen = 0
    with stream:
        for item in stream:
            if isinstance(item, Snapshot):
                record: dict[str, Any] = {"snapshot": item.seq, "state": item.state}
            else:
                record = {"seq": item.seq, "type": item.type, "body": item.body}
                seen += 1
            if args.json:
                _print_json(record)
            else:
                print(orjson.dumps(record).decode())
            sys.stdout.flush()  # a stream: each record reaches a pipe (`| jq`) as it happens, not in blocks
            if args.count and seen >= args.count:
                break
    return 0


def _add_run_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", nargs="?", help="run directory or run id (default: the newest run)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="legion",
        description="Run trees of LLM agent sessions as an OTP-style supervision tree.",
    )
    parser.add_argument("--version", action="version", version=f"legion {__version__}")
    parser.add_argument("-C", "--cwd", default=".", help="project directory (default: the current one)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    from legion.cli import demo, gc, mail, operate, project, run, server, status

    run.add_parser(sub)
    operate.add_parsers(sub)
    mail.add_parser(sub)
    status.add_parsers(sub)
    project.add_parsers(sub)
    server.add_parsers(sub)
    gc.add_parser(sub)  # teams: `legion gc`
    demo.add_parser(sub)

    p = sub.add_parser("doctor", help="check that this machine and project can host a run")
    p.add_argument("section", nargs="?", choices=list(DOCTOR_SECTIONS),
                   help="one section (default: machine): summary, machine, models = configured providers, key "
                        "presence and each card's model, spawn, memory, tools, storage, runtime = a live run's "
                        "workers, heartbeats and cgroup, errors = the newest run's failures, next = what to fix")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(func=_cmd_doctor)

    p = sub.add_parser("agents", help="list role cards with their layer, effective model and origin")
    p.add_argument("scope", nargs="?", default="both", choices=["user", "project", "both"])
    p.add_argument("--all", action="store_true", help="include disabled cards")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_agents)

    p = sub.add_parser("status", help="the nodes of a run: status, phase, model, last update")
    _add_run_arg(p)
    p.set_defaults(func=_cmd_status)

    p = sub.add_parser("tree", help="the run's supervision tree")
    p.add_argument("run", nargs="?", help="run directory or run id (default: the newest run)")
    p.set_defaults(func=_cmd_tree)

    p = sub.add_parser("events", help="the run's ledger events after a cursor")
    _add_run_arg(p)
    p.add_argument("--after", type=int, default=0, help="event id cursor (default 0)")
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--follow", "-f", action="store_true", help="keep printing events as they land (Ctrl-C stops)")
    p.add_argument("--idle", type=float, default=None, help="with --follow: stop after S seconds without events")
    p.set_defaults(func=_cmd_events)

    p = sub.add_parser("monitor", help="attach to a live run's event stream (snapshot, then live events)")
    p.add_argument("target", help="run directory, run id, or a tcp:// / ipc:// monitor endpoint")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--count", type=int, default=0, help="stop after N live events (default: never)")
    p.add_argument("--idle", type=float, default=None, help="stop after S seconds without events")
    p.add_argument("--key", metavar="CLIENT.key_secret", help="tcp://: this client's CurveZMQ secret key")
    p.add_argument("--server-key", metavar="SERVER.key", help="tcp://: the run's public key")
    p.add_argument("--snapshot", metavar="ENDPOINT", help="the snapshot endpoint (default: tcp PORT+1)")
    p.set_defaults(func=_cmd_monitor)
    _accept_cwd_after_the_command(parser)
    return parser


def _accept_cwd_after_the_command(parser: argparse.ArgumentParser) -> None:
    """`-C DIR` before or after the command (`legion -C DIR run …` and `legion run … -C DIR`). SUPPRESS: a
    command without it keeps the one given before the command (argparse copies only what was parsed)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if not any("-C" in a.option_strings for a in sub._actions):
                    sub.add_argument("-C", "--cwd", default=argparse.SUPPRESS, metavar="DIR",
                                     help="project directory (default: the current one)")  # fmt: skip
                _accept_cwd_after_the_command(sub)


def _tolerant_output() -> None:
    """A terminal or pipe that cannot encode a character (PYTHONIOENCODING=ascii, a C locale) gets an escape
    for it instead of a crash in the middle of a summary."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None and (getattr(stream, "encoding", "") or "").lower().replace("-", "") != "utf8":
            reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    _tolerant_output()
    from legion.procs import raise_nofile

    raise_nofile()  # every legion process (procs/rlimit.py); `legion run` hosts the root
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except RunNotFound as exc:
        print(f"legion {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LedgerUnreadable as exc:
        print(f"legion {args.command}: {exc}", file=sys.stderr)
        return EXIT_LEDGER
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`legion events | head`): stop quietly, and keep Python's
        # shutdown flush from raising again on the dead pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:
        from legion.ledger import LedgerError

        if not isinstance(exc, LedgerError | sqlite3.DatabaseError):
            raise
        # a newer ledger schema, a corrupt database (summary, timing, …): say what and where, no traceback
        print(f"legion {args.command}: {exc}", file=sys.stderr)
        return EXIT_LEDGER


if __name__ == "__main__":
    sys.exit(main())
