"""`legion demo` as a user runs it: the whole phase machine with one rework, a delivered branch, exit 0."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson

from tests.events_schema import check_events, json_lines
from tests.integration.cli_support import env


def test_demo_completes_and_keep_leaves_the_project_with_its_branch(tmp_path: Path) -> None:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "legion", "demo", "--keep"], capture_output=True, text=True,
                          timeout=120, env=env(), cwd=tmp_path)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert wall < 60  # the acceptance is ≤ 15 s on an idle machine; CI shares its cores
    out = proc.stdout
    assert "alpha [centurion] settled · phase done" in out
    for member in ("planner [planner]", "w1 [worker]", "w2 [worker]", "r1 [reviewer]", "w3 [worker]", "r2 [reviewer]"):
        assert member in out
    kept = Path(re.search(r"kept: (\S+)", out).group(1))  # type: ignore[union-attr]
    try:
        branch = re.search(r"delivered branch (legion/alpha-\S+) at", out).group(1)  # type: ignore[union-attr]
        files = subprocess.run(["git", "-C", str(kept), "ls-tree", "-r", "--name-only", branch], capture_output=True,
                               text=True, check=True).stdout.split()
        assert {"greet.py", "README.md", "CONTRACT.md"} <= set(files)
        events = subprocess.run([sys.executable, "-m", "legion", "-C", str(kept), "events", "--json", "--limit",
                                 "1000"], capture_output=True, text=True, env=env(), check=True).stdout
        moves = [(e["from"], e["to"]) for e in map(orjson.loads, events.splitlines())
                 if e["type"] == "phase_change" and "from" in e]
        assert moves == [("planning", "implementing"), ("implementing", "reviewing"), ("reviewing", "implementing"),
                         ("implementing", "reviewing"), ("reviewing", "verifying"), ("verifying", "done")]
    finally:
        shutil.rmtree(kept.parent, ignore_errors=True)


def test_demo_without_keep_leaves_nothing(tmp_path: Path) -> None:
    before = set(Path("/tmp").glob("legion-demo-*"))
    proc = subprocess.run([sys.executable, "-m", "legion", "demo", "--json"], capture_output=True, text=True,
                          timeout=120, env=env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = json_lines(proc.stdout)
    check_events(events, "legion demo --json")
    assert events[0]["type"] == "run_started" and events[-1]["type"] == "result"
    assert events[-1]["status"] == "settled" and events[-1]["exit_code"] == 0
    assert set(Path("/tmp").glob("legion-demo-*")) <= before
