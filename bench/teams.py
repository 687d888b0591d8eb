"""Teams benchmark (issue 10): the default phase machine end to end, and the latency of a phase request.

Figures:
- `default_machine_s`: wall time of a whole `legion run` (scripted models, zero model delay, real git):
  root → centurion in its worktree → contract → two workers by file ownership → reviewer → verification
  → done → collection → squash commit on the team's branch. Target ≤ 5 s (p50 over the runs). For scale, the
  same run without a team (root → one worker) is measured as the baseline and the ratio printed.
- `phase_request_ms`: a `legion_phase` request evaluated and answered: root-side (evaluation + the phase write
  through the ledger writer + the reply) and session-side round trip (tool call → result in the centurion's
  transcript), over a few hundred accepted transitions a ⇄ b of a custom machine. Target root-side p50 ≤ 5 ms.

Prints one JSON object; exits non-zero when a target is missed. `--quick` runs fewer repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import _stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the e2e tests' script builders

from legion.orchestration import commands
from tests.e2e.teams_support import (
    call,
    happy_scripts,
    model,
    phase,
    project,
    run,
    wait,
    worker_script,
)

TARGET_DEFAULT_MACHINE_S = 5.0
TARGET_PHASE_P50_MS = 5.0
PINGPONG = {"start": "a", "phases": [{"id": "a", "next": ["b"]}, {"id": "b", "next": ["a", "done"]}]}


def _short_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="lb-", dir="/tmp"))


def default_machine_run() -> tuple[float, dict[str, Any]]:
    tmp = _short_dir()
    try:
        root = project(tmp, happy_scripts())
        started = time.perf_counter()
        result = run(root)
        wall = time.perf_counter() - started
        ok = result.exit_code == 0 and bool(result.branches) and result.branches[0].get("phase") == "done"
        return wall, {"ok": ok, "status": result.status, "branch": result.branches[0] if result.branches else None}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def baseline_run() -> float:
    tmp = _short_dir()
    try:
        scripts = {"root": {"turns": [call("subagent", action="launch", agent="worker", name="w1", task="t",
                                           model=model("w1")), wait(), {"text": "done"}]},
                   "w1": worker_script("a.txt", "A")}
        root = project(tmp, scripts)
        started = time.perf_counter()
        run(root)
        return time.perf_counter() - started
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def phase_requests(n: int) -> tuple[list[float], list[float], int]:
    """Root-side and session-side latencies (ms) of `n` accepted transitions, and how many were accepted."""
    root_ms: list[float] = []
    original = commands.TOOLS["legion_phase"]

    async def timed(orch: Any, caller: Any, args: dict[str, Any]) -> dict[str, Any]:
        started = time.perf_counter()
        reply = await original(orch, caller, args)
        root_ms.append((time.perf_counter() - started) * 1000)
        return reply

    turns = [phase("b" if i % 2 == 0 else "a") for i in range(n)]
    scripts = {"root": {"turns": [call("subagent", action="launch", agent="centurion", name="pp", task="t",
                                       model=model("pp"), phases=PINGPONG), wait("pp"), {"text": "done"}]},
               "pp": {"turns": [*turns, {"text": "pp done"}]}}
    tmp = _short_dir()
    commands.TOOLS["legion_phase"] = timed
    try:
        root = project(tmp, scripts)
        result = run(root, timeout=120)
        session_ms, accepted = _round_trips(result.run_dir / "pp.jsonl")
        return root_ms, session_ms, accepted
    finally:
        commands.TOOLS["legion_phase"] = original
        shutil.rmtree(tmp, ignore_errors=True)


def _round_trips(transcript: Path) -> tuple[list[float], int]:
    calls: dict[str, float] = {}
    trips: list[float] = []
    accepted = 0
    for line in transcript.read_text().splitlines():
        entry = json.loads(line)
        msg = entry.get("message") or {}
        stamp = datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00")).timestamp() * 1000
        if msg.get("role") == "assistant":
            for part in msg.get("content", []):
                if part.get("type") == "toolCall" and part.get("name") == "legion_phase":
                    calls[part["id"]] = stamp
        elif msg.get("role") == "toolResult" and msg.get("toolCallId") in calls:
            trips.append(stamp - calls.pop(msg["toolCallId"]))
            accepted += not msg.get("isError")
    return trips, accepted


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one end-to-end run and 100 phase requests")
    args = ap.parse_args()
    runs, requests = (1, 100) if args.quick else (5, 400)
    os.environ.setdefault("GIT_AUTHOR_NAME", "bench")
    os.environ.setdefault("GIT_AUTHOR_EMAIL", "bench@legion")
    os.environ.setdefault("GIT_COMMITTER_NAME", "bench")
    os.environ.setdefault("GIT_COMMITTER_EMAIL", "bench@legion")
    walls, checks = [], []
    for _ in range(runs):
        wall, check = default_machine_run()
        walls.append(wall)
        checks.append(check)
    base = [baseline_run() for _ in range(runs)]
    root_ms, session_ms, accepted = phase_requests(requests)
    p50_wall = statistics.median(walls)
    p50_phase = statistics.median(root_ms) if root_ms else float("inf")
    met = {
        "default_machine_s": p50_wall <= TARGET_DEFAULT_MACHINE_S and all(c["ok"] for c in checks),
        "phase_request_ms": p50_phase <= TARGET_PHASE_P50_MS and accepted == requests,
    }
    out = {
        "bench": "teams",
        "default_machine_s": _stats.summary(walls, count=True),
        "default_machine_ok": [c["ok"] for c in checks],
        "baseline_one_worker_s": _stats.summary(base, count=True),
        "team_over_baseline": round(p50_wall / statistics.median(base), 2),
        "phase_request_root_ms": _stats.summary(root_ms, count=True),
        "phase_request_round_trip_ms": _stats.summary(session_ms, count=True) if session_ms else None,
        "phase_requests_accepted": accepted,
        "targets": {"default_machine_s_p50": TARGET_DEFAULT_MACHINE_S, "phase_request_root_ms_p50": TARGET_PHASE_P50_MS},
        "met": met,
    }
    print(json.dumps(out))
    return 0 if all(met.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
