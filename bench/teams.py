"""Teams benchmark (issue 10): the default phase machine end to end, and the latency of a phase request.

Figures:
- `default_machine_s`: wall time of a whole `legion run` (scripted models, zero model delay, real git):
  root → centurion in its worktree → contract → two workers by file ownership → reviewer → verification
  → done → collection → squash commit on the team's branch. Target ≤ 5 s (p50 over the runs). The same run
  without a team (root → one worker) is measured as the baseline, run by run, and the ratio printed.
- `phase_request_ms`: a `legion_phase` request evaluated and answered: root-side (evaluation + the phase write
  through the ledger writer + the reply) and session-side round trip (tool call → result in the centurion's
  transcript), over a few hundred accepted transitions a ⇄ b of a custom machine. Target root-side p50 ≤ 5 ms.
  Its baseline, measured at the same time: a bare `sqlite3` write transaction of the same shape (UPDATE + INSERT
  in its own WAL file with the ledger's pragmas, so a commit syncs the WAL as the ledger's does) every 10 ms in a
  process of its own while the phase requests run, p50.

The machine's speed varies ±40 % between runs, so what gates (unless `--strict`, which gates the absolute 5 s and
5 ms too) is each figure's ratio to its baseline of the same run; every run finishing with its branch at `done`
and every phase request accepted are correctness and always gate. Prints one JSON object; exits non-zero when a
gated check fails. `--quick` runs fewer repetitions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
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
# the team run's p50 over the one-worker run's p50 (measured 1.35-2.0), and the phase request's root-side p50 over the
# bare write transaction's p50 (measured 0.6-10: both are a few ms of scheduling on a loaded machine, at different
# moments; a coarse bound, it catches a request grown by an order of magnitude), on the 2-core machine under the
# acceptance test run's load
MAX_RATIO_DEFAULT_MACHINE = 4.0
MAX_RATIO_PHASE_REQUEST = 20.0
ABSOLUTE = ("default_machine_s", "phase_request_ms")  # gated only with --strict
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


BARE_WRITER = r"""
import json, select, sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA busy_timeout=5000")
con.execute("PRAGMA journal_mode=WAL")
con.execute("PRAGMA foreign_keys=ON")
con.execute("CREATE TABLE nodes (id TEXT PRIMARY KEY, phase TEXT, updated_at INTEGER)")
con.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, node_id TEXT, type TEXT, data TEXT, ts INTEGER)")
con.execute("INSERT INTO nodes VALUES ('pp', 'a', 0)")
print("ready", flush=True)
samples, i = [], 0
while not select.select([sys.stdin], [], [], 0.01)[0]:
    i += 1
    started = time.perf_counter()
    now = time.time_ns() // 1_000_000
    con.execute("BEGIN IMMEDIATE")
    con.execute("UPDATE nodes SET phase = ?, updated_at = ? WHERE id = 'pp'", ("b" if i % 2 else "a", now))
    con.execute("INSERT INTO events (node_id, type, data, ts) VALUES ('pp', 'phase_changed', ?, ?)",
                (json.dumps({"from": "a", "to": "b"}), now))
    con.execute("COMMIT")
    samples.append((time.perf_counter() - started) * 1000)
print(json.dumps(samples), flush=True)
"""


class BareWriter:
    """The phase request's baseline, beside it in time: in a process of its own, a bare sqlite3 UPDATE + INSERT
    transaction (its own WAL file, the ledger's pragmas: a commit syncs the WAL) every 10 ms, timed (ms) — what one
    write transaction costs on this machine and disk at that moment."""

    def __enter__(self) -> BareWriter:
        self._dir = _short_dir()
        self.samples: list[float] = []
        self._proc = subprocess.Popen([sys.executable, "-c", BARE_WRITER, str(self._dir / "bare.db")],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the bare writer did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            out, _ = self._proc.communicate("stop\n", timeout=60)
            self.samples = json.loads(out.strip().splitlines()[-1])
        finally:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
            shutil.rmtree(self._dir, ignore_errors=True)


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
    ap.add_argument("--strict", action="store_true", help="gate the absolute 5 s and 5 ms targets too")
    args = ap.parse_args()
    runs, requests = (1, 100) if args.quick else (5, 400)
    os.environ.setdefault("GIT_AUTHOR_NAME", "bench")
    os.environ.setdefault("GIT_AUTHOR_EMAIL", "bench@legion")
    os.environ.setdefault("GIT_COMMITTER_NAME", "bench")
    os.environ.setdefault("GIT_COMMITTER_EMAIL", "bench@legion")
    walls, checks, base = [], [], []
    for _ in range(runs):  # interleaved: each pair sees the same machine
        wall, check = default_machine_run()
        walls.append(wall)
        checks.append(check)
        base.append(baseline_run())
    with BareWriter() as bare:  # its writes land between the phase requests': the same disk at the same moment
        root_ms, session_ms, accepted = phase_requests(requests)
    bare_ms = bare.samples
    p50_wall = statistics.median(walls)
    p50_phase = statistics.median(root_ms) if root_ms else float("inf")
    wall_ratio = p50_wall / statistics.median(base)
    phase_ratio = p50_phase / statistics.median(bare_ms)
    met = {
        "default_machine_done": all(c["ok"] for c in checks),
        "default_machine_over_baseline": wall_ratio <= MAX_RATIO_DEFAULT_MACHINE,
        "default_machine_s": p50_wall <= TARGET_DEFAULT_MACHINE_S,
        "phase_requests_accepted": accepted == requests,
        "phase_request_over_bare_write": phase_ratio <= MAX_RATIO_PHASE_REQUEST,
        "phase_request_ms": p50_phase <= TARGET_PHASE_P50_MS,
    }
    gated = sorted(k for k in met if args.strict or k not in ABSOLUTE)
    out = {
        "bench": "teams",
        "default_machine_s": _stats.summary(walls, count=True),
        "default_machine_ok": [c["ok"] for c in checks],
        "baseline_one_worker_s": _stats.summary(base, count=True),
        "team_over_baseline": round(wall_ratio, 2),
        "phase_request_root_ms": _stats.summary(root_ms, count=True),
        "phase_request_round_trip_ms": _stats.summary(session_ms, count=True) if session_ms else None,
        "phase_requests_accepted": accepted,
        "bare_phase_write_ms": _stats.summary(bare_ms, count=True),
        "phase_request_over_bare_write": round(phase_ratio, 2),
        "targets": {"default_machine_s_p50": TARGET_DEFAULT_MACHINE_S, "phase_request_root_ms_p50": TARGET_PHASE_P50_MS,
                    "team_over_baseline_max": MAX_RATIO_DEFAULT_MACHINE,
                    "phase_request_over_bare_write_max": MAX_RATIO_PHASE_REQUEST},
        "met": met,
        "gated": gated,
        "ok": all(met[k] for k in gated),
    }
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
