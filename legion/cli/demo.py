"""`legion demo`: what legion does, in one command, with no key and no network.

A throwaway git project in a temp directory and a scripted team: the root session dispatches a centurion
(in its own git worktree) that runs the default phase machine — a planner writes the contract
(planning), two workers write their files in parallel (implementing), a reviewer rejects one of them, a
third worker fixes it (one rework), a second reviewer approves (reviewing), the supervisor runs the
contract's verification commands (verifying → done) and the centurion delivers a one-commit branch. The
live tree shows on a terminal; the summary, the delivered branch and its files follow. `--keep` leaves the
project for inspection (`git -C DIR log legion/…`, `legion -C DIR summary`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from legion.cli.common import EXIT_USAGE
from legion.run_errors import RunConfigError

GIT_NAME, GIT_EMAIL = "legion demo", "demo@legion.invalid"
VERIFY = ["test -f greet.py", "python3 -c 'import greet; assert greet.hello(\"you\") == \"Hello, you!\"'",
          "grep -q '^# greet' README.md"]
CONTRACT = """# Contract: greet

Goal: a greeting module and its documentation.

- w1 owns greet.py: hello(name) returns "Hello, <name>!".
- w2 owns README.md: a "# greet" title and a usage line.

```legion-verify
{commands}
```
"""
TASK = "Add a greet module (hello(name) -> 'Hello, <name>!') with a README, reviewed and verified."


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="a scripted team through the whole phase machine on a throwaway git project "
                                    "(no key, no network)")
    p.add_argument("--keep", action="store_true", help="keep the project directory (its path is printed)")
    p.add_argument("--json", action="store_true", help="JSON lines on stdout: the run's events, `run_started` first "
                   "and `result` last (docs/events.md)")
    p.set_defaults(func=cmd_demo)


def _call(tool: str, /, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": tool, "arguments": arguments}]}


def _bash(command: str) -> dict[str, Any]:
    return _call("bash", command=command)


def _phase(to: str, **extra: Any) -> dict[str, Any]:
    return _call("legion_phase", to=to, **extra)


def _model(name: str) -> str:
    return f"scripted/scripts/{name}.yaml"


def _launch(*tasks: tuple[str, str, str]) -> dict[str, Any]:
    return _call("subagent", action="launch",
                 tasks=[{"agent": agent, "name": name, "task": task, "model": _model(name)} for agent, name, task in tasks])


def _wait(*names: str) -> dict[str, Any]:
    return _call("subagent", action="wait", **({"names": list(names)} if names else {}))


def _verdict(ok: bool) -> str:
    from legion.agents.verdict import Verdict, VerdictIssue, format_verdict

    issues = () if ok else (VerdictIssue("README.md has no '# greet' title (the contract asks for one)",
                                         "blocker", "README.md", 1),)
    return "Reviewed greet.py and README.md against CONTRACT.md.\n\n" + format_verdict(
        Verdict(ok, "greet.py and README.md match the contract" if ok else "README.md misses its title", issues))


def scripts() -> dict[str, dict[str, Any]]:
    """The scripted models of the demo team, one per node."""
    contract = CONTRACT.format(commands="\n".join(VERIFY))
    return {
        "root": {"turns": [
            _call("subagent", action="launch", agent="centurion", name="alpha", task=TASK, model=_model("alpha"),
                  phases="default"),
            _wait("alpha"), _call("subagent", action="collect", name="alpha"),
            {"text": "The greet module is done: planned, implemented by two workers, reworked once after review, "
                     "verified, and delivered on its team branch (shown at the end)."}],
            "default": {"text": "Noted."}},
        "alpha": {"turns": [
            _launch(("planner", "planner", "Write CONTRACT.md for: " + TASK)), _wait("planner"),
            _phase("implementing", evidence="CONTRACT.md"),
            _launch(("worker", "w1", "Write greet.py per CONTRACT.md"), ("worker", "w2", "Write README.md")),
            _wait("w1", "w2"),
            _phase("reviewing"), _launch(("reviewer", "r1", "Review greet.py and README.md")), _wait("r1"),
            _phase("implementing", note="r1: README.md misses its '# greet' title"),
            _launch(("worker", "w3", "Fix README.md: add the '# greet' title (review r1)")), _wait("w3"),
            _phase("reviewing"), _launch(("reviewer", "r2", "Review the fix")), _wait("r2"),
            _phase("verifying"), {"text": "Verification requested."},
            _bash("git add -A && git reset -q --soft $(git merge-base HEAD main) && "
                  "git commit -qm 'greet: module and README (team alpha)' && git rev-parse HEAD"),
            {"text": "Delivered: greet.py and README.md in one commit on the team branch."}],
            "default": {"text": "Nothing more to do."}},
        "planner": {"turns": [_bash(f"cat > CONTRACT.md <<'LEGION_EOF'\n{contract}LEGION_EOF"),
                              {"text": "CONTRACT.md written: w1 owns greet.py, w2 owns README.md; 3 checks."}]},
        "w1": {"turns": [_bash("printf 'def hello(name: str) -> str:\\n    return f\"Hello, {name}!\"\\n' > greet.py"),
                         {"text": "greet.py: hello(name)."}]},
        "w2": {"turns": [_bash("printf 'Usage: from greet import hello\\n' > README.md"),
                         {"text": "README.md: a usage line."}]},
        "r1": {"turns": [{"text": _verdict(False)}]},
        "w3": {"turns": [_bash("printf '# greet\\n\\n' | cat - README.md > R && mv R README.md"),
                         {"text": "README.md: added the '# greet' title."}]},
        "r2": {"turns": [{"text": _verdict(True)}]},
    }


def make_project(base: Path) -> Path:
    """The throwaway git project: a first commit with the scripts (a worktree must see them too)."""
    root = base / "greet"
    (root / "scripts").mkdir(parents=True)
    for name, script in scripts().items():
        (root / "scripts" / f"{name}.yaml").write_text(yaml.safe_dump(script, sort_keys=False, width=1000))
    (root / ".gitignore").write_text(".legion/\n__pycache__/\n")
    (root / ".legion").mkdir()
    (root / ".legion" / "settings.json").write_text(json.dumps({"legion": {"budget": {"maxCostUsd": 1.0}}}))
    # the project's own identity, in its git config: the team commits in its worktree too, and a machine (a fresh
    # CI runner, a container) may have no git identity of its own
    for args in (["init", "-q", "-b", "main"], ["config", "user.name", GIT_NAME], ["config", "user.email", GIT_EMAIL],
                 ["add", "-A"], ["commit", "-q", "-m", "an empty project"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    return root


def cmd_demo(args: argparse.Namespace) -> int:
    if shutil.which("git") is None:
        print("legion demo: git is not on PATH; the demo delivers a git branch (install git)", file=sys.stderr)
        return EXIT_USAGE
    base = Path(tempfile.mkdtemp(prefix="legion-demo-", dir="/tmp"))  # short: ipc socket paths
    try:
        return _demo(base, args)
    finally:
        if args.keep:
            print(f"kept: {base / 'greet'}  (try `legion -C {base / 'greet'} summary`)")
        else:
            shutil.rmtree(base, ignore_errors=True)


def _demo(base: Path, args: argparse.Namespace) -> int:
    from legion.cli.progress import make_view, quiet_logs, run_started_event, view_tap
    from legion.cli.run import start_fork_server_early
    from legion.prepare import RunOptions, prepare_run

    root = make_project(base)
    try:
        prepared = prepare_run(RunOptions(task=TASK, cwd=root, model=_model("root"), timeout=120,
                                          env=dict(os.environ)))
    except RunConfigError as exc:
        print(f"legion demo: {exc}", file=sys.stderr)
        return EXIT_USAGE
    fork_server = start_fork_server_early(prepared)
    from legion.orchestration.run import execute
    from legion.reports.run_report import run_report, summary_lines

    quiet_logs()
    if not args.json:
        kept = "kept afterwards" if args.keep else "removed afterwards; --keep keeps it"
        print(f"legion demo · a throwaway git project in {root} ({kept})\n  task: {TASK}\n", flush=True)
    view = make_view("stream-json" if args.json else "text", started=run_started_event(prepared))
    quiet_logs(view)  # under the live view, above its frame
    try:
        result = asyncio.run(execute(prepared, on_root=view_tap(view), fork_server=fork_server))
    finally:
        view.close()
    if args.json:
        view.summary(result)
        return result.exit_code
    out = sys.stdout
    out.write(f"{result.final_text.strip()}\n\n── {result.status} (exit {result.exit_code}) in {result.wall_s:.1f}s\n")
    if result.detail:
        out.write(f"   {result.detail}\n")
    out.write("\n".join(summary_lines(run_report(result.run_dir))) + "\n")
    for branch in result.branches:
        files = subprocess.run(["git", "-C", str(root), "show", "--stat", "--format=%h %s", branch["branch"]],
                               capture_output=True, text=True).stdout.strip()
        out.write(f"\ndelivered branch {branch['branch']} at {branch['sha'][:12]}:\n{files}\n")
    if not result.branches:
        out.write("\nno branch was delivered\n")
    return result.exit_code if result.branches else max(result.exit_code, 1)
