"""`legion run` (in the foreground, or as a daemon with `--detach`) and `legion resume`: a run hosted by this
process, its progress shown by `legion.cli.progress`, then the summary.

`legion run --detach …` re-runs the same command as a daemon (its own session, stdin from /dev/null, output to
`<run>/daemon.log`, pid in `<run>/daemon.pid`); it prints the run id and exits 0. `legion resume --detach …` does
the same once the resume was checked here (its refusals come in the foreground). `legion status` tells a daemon
that died mid-run (`legion.reports.liveness`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from legion.cli.common import EXIT_USAGE
from legion.cli.progress import (
    OUTPUT_FORMATS,
    PROGRESS_EVERY_S,
    make_view,
    output_format,
    progress_seconds,
    quiet_logs,
    run_started_event,
    view_tap,
)
from legion.procs.interpreter import python_command
from legion.run_errors import RunConfigError
from legion.runs import DAEMON_LOG, DAEMON_PID, DAEMON_TASK, RunNotFound, resolve_run

if TYPE_CHECKING:  # the run machinery is imported when a run starts: other commands start fast
    from legion.cli.progress import View
    from legion.orchestration.run import RunResult
    from legion.prepare import Prepared
    from legion.supervision.spawn import EarlyForkServer


def _progress_argument(p: Any) -> None:
    """`--progress-every` of `run` and `resume`."""
    p.add_argument("--progress-every", type=progress_seconds, default=PROGRESS_EVERY_S, metavar="SECONDS",
                   help=f"without a terminal or --json: a progress line on stderr every SECONDS while a node is live "
                        f"(default {PROGRESS_EVERY_S:g}; 0 turns it off)")


def output_arguments(p: Any) -> None:
    """`--json` and `--output-format` of `run`, `resume` and `demo` (docs/events.md)."""
    p.add_argument("--json", action="store_true", help="JSON lines on stdout: one event per line, `run_started` first "
                   "and `result` last (docs/events.md); the same as --output-format stream-json")
    p.add_argument("--output-format", choices=OUTPUT_FORMATS, default=None, metavar="FORMAT",
                   help="text (default: the live tree or plain lines), stream-json (as --json) or json (one "
                        "`result` object on stdout at the end; plain lines on stderr)")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run a task with a tree of agents (headless)")
    p.add_argument("task", help="the task text, '-' to read it from stdin, or @FILE")
    p.add_argument("--agent", default="root", help="the root session's card (default: root)")
    p.add_argument("--model", help="the root session's model, provider/model-id[:thinking]")
    p.add_argument("--team", help="the team (roster) for the run")
    p.add_argument("--preset", help="a preset for the root session's model")
    p.add_argument("--run-id", help="the run id (default: time + random suffix)")
    p.add_argument("--or-resume", action="store_true",
                   help="with --run-id: when that run exists, resume it (every paused node; `legion resume ID --all`) "
                        "instead of refusing, and when it finished, say so and exit 0: one command line a Job or a "
                        "service can run again after a pause")
    p.add_argument("--timeout", type=float, help="stop the run after SECONDS (exit 1)")
    p.add_argument("--max-cost", type=float, help="tree-wide cost budget in USD (legion.budget.maxCostUsd)")
    p.add_argument("--ledger", metavar="postgresql://USER@HOST:PORT/DB",
                   help="record the run in this PostgreSQL database (else LEGION_LEDGER_URL, the setting "
                        "legion.ledger.url, or the run directory's own SQLite legion.db)")
    output_arguments(p)
    p.add_argument("--detach", action="store_true", help="run as a daemon (own session; pid file and log in the run "
                   "directory); prints the run id and exits")
    _progress_argument(p)
    p.add_argument("--monitor", metavar="tcp://HOST:PORT", help="also publish the monitor stream on HOST:PORT "
                   "(snapshot on PORT+1), CurveZMQ only")
    p.add_argument("--monitor-key", metavar="SERVER.key_secret", help="the run's CurveZMQ secret key (`legion keys`)")
    p.add_argument("--monitor-allow", metavar="FILE", help="allow-list: client public keys (Z85 or .key paths)")
    p.set_defaults(func=cmd_run)


def add_resume_parser(sub: Any) -> None:
    p = sub.add_parser("resume", help="resume a paused (or killed) run: the same run directory and ledger")
    p.add_argument("run", help="run directory, run id, or the root session's transcript (run.json's sessionFile)")
    p.add_argument("names", nargs="*", help="paused nodes to resume with the root session (default: none)")
    p.add_argument("--all", action="store_true", help="resume every paused node")
    p.add_argument("--timeout", type=float, help="stop the resumed run after SECONDS (exit 1)")
    output_arguments(p)
    _progress_argument(p)
    p.add_argument("--detach", action="store_true", help="resume as a daemon (as `legion run --detach`: pid file and "
                   "log in the run directory); prints the run id and exits")
    p.add_argument("--monitor", metavar="tcp://HOST:PORT", help="publish the monitor on tcp too (as `legion run`)")
    p.add_argument("--monitor-key", metavar="SERVER.key_secret")
    p.add_argument("--monitor-allow", metavar="FILE")
    p.set_defaults(func=cmd_resume)


def read_task(arg: str, cwd: Path) -> str:
    if arg == "-":
        return sys.stdin.read()
    if arg.startswith("@"):
        path = (cwd / arg[1:]).expanduser()
        try:
            return path.read_text(encoding="utf-8")
        except OSError as exc:
            raise RunConfigError(f"cannot read the task file {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise RunConfigError(f"the task file {path} is not UTF-8 text") from None
    return arg


def cmd_run(args: argparse.Namespace) -> int:
    cwd = Path(args.cwd).resolve()
    if args.or_resume:
        again = _run_again(args, cwd)
        if again is not None:
            return again
    try:
        task = read_task(args.task, cwd)
        # legion.prepare, not legion.orchestration.run: a refusal comes before the run machinery's imports
        from legion.cli.server import server_config
        from legion.prepare import RunOptions, prepare_run

        monitor_tcp, curve = server_config(args.monitor, args.monitor_key, args.monitor_allow)
        prepared = prepare_run(RunOptions(task=task, cwd=cwd, agent=args.agent, model=args.model, team=args.team,
                                          preset=args.preset, run_id=args.run_id, timeout=args.timeout,
                                          max_cost=args.max_cost, monitor_tcp=monitor_tcp, curve=curve,
                                          ledger=args.ledger))
    except RunConfigError as exc:
        print(f"legion run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"legion run · {prepared.model_note}", file=sys.stderr, flush=True)
    if args.detach:
        return _detach(args, task, cwd, prepared)
    fork_server = start_fork_server_early(prepared)
    view = make_view(output_format(args), args.progress_every, run_started_event(prepared))
    quiet_logs(view)
    try:
        result = asyncio.run(_run(prepared, view, fork_server))
    except RunConfigError as exc:
        print(f"legion run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        view.close()
    view.summary(result)
    return result.exit_code


def _run_again(args: argparse.Namespace, cwd: Path) -> int | None:
    """`--or-resume`: the existing run of `--run-id` resumed (or its end reported); None when it does not exist."""
    from legion.ledger import read_run_json
    from legion.paths import runs_dir

    if not args.run_id:
        print("legion run: --or-resume needs --run-id (the run to find again when the command runs a second time)",
              file=sys.stderr)
        return EXIT_USAGE
    run_dir = runs_dir(cwd) / args.run_id
    data = read_run_json(run_dir) if (run_dir / "run.json").is_file() else None
    if data is None:
        return None
    if data.get("status") == "settled":
        print(f"legion run: run {args.run_id} finished already (settled); `legion summary {args.run_id}` shows it",
              file=sys.stderr)
        return 0
    print(f"legion run: run {args.run_id} exists ({data.get('status', 'unknown')}): resuming it", file=sys.stderr)
    args.run, args.names, args.all = str(run_dir), [], True
    return cmd_resume(args)


def _detach(args: argparse.Namespace, task: str, cwd: Path, prepared: Prepared) -> int:
    """The same run as a daemon: the task travels in a file (a daemon has no stdin)."""
    from legion.bus.security import ensure_private_dir

    run_dir, run_id = prepared.run_dir, prepared.run_id
    ensure_private_dir(run_dir)
    (run_dir / DAEMON_TASK).write_text(task, encoding="utf-8")
    argv = [f"@{run_dir / DAEMON_TASK}"]
    for flag, value in (("--agent", args.agent), ("--model", prepared.options.model), ("--team", args.team),
                        ("--preset", args.preset), ("--timeout", args.timeout), ("--max-cost", args.max_cost),
                        ("--monitor", args.monitor), ("--monitor-key", args.monitor_key),
                        ("--monitor-allow", args.monitor_allow), ("--progress-every", args.progress_every),
                        ("--output-format", output_format(args))):
        if value is not None:
            argv += [flag, str(value)]
    return detach(["run", *argv, "--run-id", run_id], cwd, run_dir, run_id)


def start_fork_server_early(prepared: Prepared) -> EarlyForkServer | None:
    """The run's fork server, started now: its imports run beside the run machinery's that follow (about a third of
    a run's startup; legion.orchestration.preload). Hand it to `execute` or `resume`; their root adopts it."""
    from legion.orchestration.preload import prestart

    try:
        return prestart(prepared)
    except Exception:  # only a head start: the root starts its own, and reports why that one fails
        return None


async def _run(prepared: Any, view: View, fork_server: EarlyForkServer | None) -> RunResult:
    from legion.orchestration.run import execute

    return await execute(prepared, on_root=view_tap(view), fork_server=fork_server)


def detach(argv: list[str], cwd: Path, run_dir: Path, run_id: str) -> int:
    """Run `legion ARGV` (a `run` or `resume` command line without --detach) as a daemon; print the run id."""
    from legion.bus.security import ensure_private_dir

    ensure_private_dir(run_dir)
    log = open(run_dir / DAEMON_LOG, "ab")  # noqa: SIM115 (handed to the child)
    env = {**os.environ, "LEGION_DAEMON": "1"}
    # python -P: the daemon runs in the project, whose files must not shadow legion (legion.procs.interpreter)
    proc = subprocess.Popen(python_command("-m", "legion", "-C", str(cwd), *argv),
                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, cwd=cwd,
                            env=env, close_fds=True)
    log.close()
    (run_dir / DAEMON_PID).write_text(f"{proc.pid}\n")
    print(run_id)
    return 0


def _detach_resume(args: argparse.Namespace, cwd: Path, run_dir: Path, run_id: str) -> int:
    """The checked resume as a daemon, in the run's project: it checks again (nothing started here) and runs."""
    argv = ["resume", str(run_dir.resolve()), *args.names, *(["--all"] if args.all else [])]
    key, allow = (None if v is None else str(Path(v).resolve()) for v in (args.monitor_key, args.monitor_allow))
    for flag, value in (("--timeout", args.timeout), ("--progress-every", args.progress_every),
                        ("--monitor", args.monitor), ("--monitor-key", key), ("--monitor-allow", allow),
                        ("--output-format", output_format(args))):
        if value is not None:
            argv += [flag, str(value)]
    return detach(argv, cwd, run_dir, run_id)


def resolve_target(cwd: Path, target: str) -> Path:
    """A run directory, a run id, or a root session's transcript (run reuse by run.json's sessionFile)."""
    from legion.orchestration.resume import find_run_by_session

    path = Path(target)
    if target.endswith(".jsonl") and (path if path.is_absolute() else cwd / path).is_file():
        found = find_run_by_session(cwd, str(path if path.is_absolute() else cwd / path))
        if found is None:
            raise RunNotFound(f"no run under {cwd / '.legion/runs'} has {target} as its root session (sessionFile)")
        return found
    return resolve_run(cwd, target)


def cmd_resume(args: argparse.Namespace) -> int:
    from legion.orchestration.resume import prepare_resume, resume

    cwd = Path(args.cwd).resolve()
    quiet_logs()
    try:
        from legion.cli.server import server_config

        monitor_tcp, curve = server_config(args.monitor, args.monitor_key, args.monitor_allow)
        plan = prepare_resume(resolve_target(cwd, args.run), list(args.names), args.all, timeout=args.timeout)
        plan.prepared.options.monitor_tcp, plan.prepared.options.curve = monitor_tcp, curve
    except RunConfigError as exc:
        print(f"legion resume: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out = sys.stderr if output_format(args) != "text" or args.detach else sys.stdout  # stdout: JSON, or the run id
    printed = plan.report_lines()
    for line in printed:
        out.write(f"{line}\n")
    out.write(f"paused nodes of run {plan.prepared.run_id}:\n")
    for paused in plan.paused:
        mark = " ← resuming" if paused.id in plan.revive or paused.id == plan.root_id else ""
        out.write(f"  {paused.line()}{mark}\n")
    out.flush()
    if args.detach:
        return _detach_resume(args, plan.prepared.options.cwd, plan.prepared.run_dir, plan.prepared.run_id)
    fork_server = start_fork_server_early(plan.prepared)
    view = make_view(output_format(args), args.progress_every, run_started_event(plan.prepared, resumed=True))
    quiet_logs(view)  # under the live view, above its frame
    try:
        result = asyncio.run(resume(plan, on_root=view_tap(view), fork_server=fork_server))
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
