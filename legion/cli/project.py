"""The project's setup: `legion init` (settings and a sample card), `legion agents` (the role cards) and
`legion team [NAME]` (the rosters)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from legion.cli.common import EXIT_USAGE, print_json
from legion.paths import ensure_ignored, project_dir

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

    p = sub.add_parser("init", help="write .legion/settings.json, the settings reference (docs/settings.md) and a "
                                    "sample project card (never overwrites)")
    p.set_defaults(func=cmd_init)


def add_agents_parser(sub: Any) -> None:
    p = sub.add_parser("agents", help="list role cards with their layer, effective model and origin")
    p.add_argument("scope", nargs="?", default="both", choices=["user", "project", "both"],
                   help="user or project: only that layer's cards; both (default): every card, built-ins included")
    p.add_argument("--all", action="store_true", help="include disabled cards")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_agents)


# ----- agents ---------------------------------------------------------------------------------------
def cmd_agents(args: argparse.Namespace) -> int:
    from legion.agents import AgentDefinitionError, format_rows, list_agents

    try:
        # `user` / `project`: that layer's cards only (the built-ins are listed by `both`, the default)
        rows = list_agents(Path(args.cwd), args.scope, include_disabled=args.all, layer_only=args.scope != "both")
    except AgentDefinitionError as exc:
        print(f"legion agents: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print_json([row.__dict__ for row in rows])
    else:
        print("\n".join(format_rows(rows)) if rows else f"(no {args.scope} cards)")
    broken = sum(row.source == "error" for row in rows)
    if broken:
        print(f"legion agents: {broken} card file(s) failed to load (the 'error' rows); fix them or move "
              "them away", file=sys.stderr)
        return 1
    return 0


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
            with contextlib.suppress(BrokenPipeError):
                print_json({"active": active.name, "source": active.source, "teams": listing}, default=str)
            return 0
        for team in listing:
            mark = "*" if team["active"] else " "
            print(f"{mark} {team['name']:<16} {', '.join(team['members'])}"
                  + (f" — {team['description']}" if team["description"] else ""))
        print(f"(* active: {active.name}, from {active.source}; LEGION_TEAM or the `team` setting selects one)")
        return 0
    if args.name != "default" and args.name not in teams:
        from legion.orchestration.orchestrator import did_you_mean

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
        with contextlib.suppress(BrokenPipeError):
            print_json({"team": args.name, "members": members}, default=str)
        return 0
    for m in members:
        print(f"{m['name']:<16} {m['role']:<12} {m['model']}  ({m['origin']})")
    return 0


# ----- init -----------------------------------------------------------------------------------------
def cmd_init(args: argparse.Namespace) -> int:
    from legion.cli.settings_doc import render

    folder = project_dir(Path(args.cwd).resolve())
    files = {
        folder / "settings.json": orjson.dumps({"legion": {"maxDepth": 4, "maxChildrenPerNode": 8,
                                                          "budget": {"maxCostUsd": 5.0}},
                                               "retentionDays": 14}, option=orjson.OPT_INDENT_2) + b"\n",
        folder / "settings.reference.md": render().encode(),  # docs/settings.md of this legion
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
        print(f"wrote {path}" + (" (every settings key: legion's docs/settings.md, for this version)"
                                 if path.name == "settings.reference.md" else ""))
    ignore = folder / ".gitignore"
    if not ignore.exists():
        ensure_ignored(folder.parent)
        print(f"wrote {ignore} (git ignores .legion/; `git add -f` shares a file of it)")
    print("next: `legion doctor`, `legion agents`, `legion demo`, then `legion run \"your task\"`")
    return 0

