"""Operator commands over whole runs: `legion resume`, `summary`, `timing` (more are added in their own modules)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import orjson

from legion.run_errors import EXIT_USAGE, RunConfigError
from legion.runs import RunNotFound, resolve_run


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("resume", help="resume a paused (or killed) run: the same run directory and ledger")
    p.add_argument("run", help="run directory, run id, or the root session's transcript (run.json's sessionFile)")
    p.add_argument("names", nargs="*", help="paused nodes to resume with the root session (default: none)")
    p.add_argument("--all", action="store_true", help="resume every paused node")
    p.add_argument("--timeout", type=float, help="stop the resumed run after SECONDS (exit 1)")
    p.add_argument("--json", action="store_true", help="JSON lines: one per event, then a final summary")
    p.add_argument("--monitor", metavar="tcp://HOST:PORT", help="publish the monitor on tcp too (as `legion run`)")
    p.add_argument("--monitor-key", metavar="SERVER.key_secret")
    p.add_argument("--monitor-allow", metavar="FILE")
    p.set_defaults(func=cmd_resume)

    for name, help_ in (("summary", "per node: role, model, status, phase, turns, tools, tokens, cost, wall time, "
                                    "final output, branch"),
                        ("timing", "per node: wall, generation, tool and waiting time")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("run", nargs="?", help="run directory or run id (default: the newest run)")
        p.add_argument("name", nargs="?", help="one node and its subtree (default: every node)")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.set_defaults(func=cmd_report, report=name)


def resolve_target(cwd: Path, target: str) -> Path:
    """A run directory, a run id, or a root session's transcript (run reuse by run.json's sessionFile)."""
    from legion.resume import find_run_by_session

    path = Path(target)
    if target.endswith(".jsonl") and (path if path.is_absolute() else cwd / path).is_file():
        found = find_run_by_session(cwd, str(path if path.is_absolute() else cwd / path))
        if found is None:
            raise RunNotFound(f"no run under {cwd / '.legion/runs'} has {target} as its root session (sessionFile)")
        return found
    return resolve_run(cwd, target)


def cmd_resume(args: argparse.Namespace) -> int:
    from legion.cli.run import JsonView, LineView, LiveView, View, _quiet_logs, view_tap
    from legion.resume import prepare_resume, resume

    cwd = Path(args.cwd).resolve()
    _quiet_logs()
    try:
        from legion.cli.server import server_config

        monitor_tcp, curve = server_config(args.monitor, args.monitor_key, args.monitor_allow)
        plan = prepare_resume(resolve_target(cwd, args.run), list(args.names), args.all, timeout=args.timeout)
        plan.prepared.options.monitor_tcp, plan.prepared.options.curve = monitor_tcp, curve
    except RunConfigError as exc:
        print(f"legion resume: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out = sys.stderr if args.json else sys.stdout
    printed = plan.report_lines()
    for line in printed:
        out.write(f"{line}\n")
    out.write(f"paused nodes of run {plan.prepared.run_id}:\n")
    for paused in plan.paused:
        mark = " ← resuming" if paused.id in plan.revive or paused.id == plan.root_id else ""
        out.write(f"  {paused.line()}{mark}\n")
    out.flush()
    view: View = JsonView(sys.stdout) if args.json else (LiveView() if sys.stderr.isatty() else LineView(sys.stderr))
    _quiet_logs(view)  # under the live view, above its frame
    try:
        result = asyncio.run(resume(plan, on_root=view_tap(view)))
    except RunConfigError as exc:
        print(f"legion resume: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        view.close()
    view.summary(result)
    late = {k: v for k, v in plan.unrevivable.items() if f"cannot revive {k}: {v}" not in printed}
    for node, why in late.items():
        print(f"legion resume: cannot revive {node}: {why}", file=sys.stderr)
    return result.exit_code


def print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=str).decode() + "\n")


def cmd_report(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from legion.reports.run_report import run_report, summary_lines, timing_lines

    run_dir = resolve_run(Path(args.cwd).resolve(), args.run)
    reports = run_report(run_dir, args.name)
    if args.name is not None and not reports:
        from legion.supervision.orchestrator import did_you_mean

        known = [r.name for r in run_report(run_dir)]
        print(f"legion {args.report}: no node '{args.name}' in run {run_dir.name}{did_you_mean(args.name, known)}",
              file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print_json({"run": str(run_dir), "nodes": [asdict(r) for r in reports]})
        return 0
    print(f"run {run_dir.name}")
    print("\n".join(summary_lines(reports) if args.report == "summary" else timing_lines(reports)))
    return 0
