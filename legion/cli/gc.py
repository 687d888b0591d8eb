"""`legion gc [--dry-run] [--branches]`: remove the worktrees of finished runs whose branch is merged.

A live run's worktrees are never touched (run.json's owner process is alive); a worktree whose branch is
not merged into the default branch is kept and listed with the reason. Ledger records stay.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from legion.paths import runs_dir
from legion.reports.liveness import root_alive


def add_parser(sub: Any) -> None:
    p = sub.add_parser("gc", help="remove team worktrees of finished runs whose branch is merged")
    p.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    p.add_argument("--branches", action="store_true", help="also delete the merged legion/* branches")
    p.set_defaults(func=cmd_gc)


def cmd_gc(ns: argparse.Namespace) -> int:
    # imported here: every `legion` command builds this parser, and the ledger costs ~150 ms to import
    from legion.orchestration.worktree import WORKTREES, WorktreeError, gc_apply, gc_plan, git

    cwd = Path(ns.cwd).resolve()
    root = runs_dir(cwd)
    runs = sorted(p for p in root.iterdir() if (p / WORKTREES).is_dir()) if root.is_dir() else []
    if not runs:
        print(f"legion gc: no team worktrees under {root}")
        return 0
    try:
        repo = Path(git(cwd, "rev-parse", "--show-toplevel"))
        items = gc_plan(repo, runs, {r for r in runs if root_alive(r)})
    except WorktreeError as exc:
        print(f"legion gc: {exc}", file=sys.stderr)
        return 1
    for item in items:
        verb = "would remove" if ns.dry_run and item.action == "remove" else item.action
        print(f"{verb:<12} {item.path} [{item.branch or '-'}]: {item.why}")
    if not ns.dry_run:
        for line in gc_apply(repo, items, branches=ns.branches):
            print(line)
    return 0
