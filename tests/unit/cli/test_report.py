"""legion/reports/run_report.py and legion/reports/fastread.py: transcript figures, spans, git HEAD from files, the schema guard."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson

from legion.ledger import SCHEMA_VERSION
from legion.reports import fastread
from legion.reports.run_report import (
    _Cache,
    _measure,
    _node_report,
    _span_intervals,
    git_head,
    transcript_stats,
)


def test_fastread_knows_the_ledger_schema_version() -> None:
    assert fastread.KNOWN_SCHEMA == SCHEMA_VERSION  # else reports would read a changed schema blind


def _msg(role: str, ts: int, **extra: object) -> bytes:
    return orjson.dumps({"type": "message", "message": {"role": role, "timestamp": ts, **extra}})


def test_transcript_stats_split_generation_tool_and_skip_downtime(tmp_path: Path) -> None:
    lines = [
        _msg("user", 1000, content=[{"type": "text", "text": "go"}]),
        _msg("assistant", 3000, content=[{"type": "toolCall", "id": "a", "name": "bash"}], stopReason="toolUse"),
        _msg("toolResult", 3500, content=[]),
        orjson.dumps({"type": "custom_message", "timestamp": "2026-01-01T00:00:00.000Z", "customType": "x"}),
        b"{torn line",
        _msg("assistant", 1767225600000 + 400, content=[{"type": "text", "text": "one\ntwo"}], stopReason="stop"),
    ]
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(lines))
    stats = transcript_stats(path)
    assert (stats.turns, stats.tool_calls) == (2, 1)
    assert stats.tool_ms == 500
    assert stats.generation_ms == 2000 + 400  # the restart note restarted the clock
    assert stats.final_text == "one\ntwo"


def test_spans_sum_active_time_and_run_open_spans_to_now() -> None:
    events = [("node_launched", 0), ("node_retired", 100), ("node_resumed", 1000), ("node_settled", 1300),
              ("node_resumed", 2000)]
    assert _measure(_span_intervals(events, now_ms=2500)) == 100 + 300 + 500


def _worker_transcript(path: Path, t0: int) -> Path:
    """A prompt at t0, a tool call at +20 ms, a 356 ms bash at +376 ms, the answer at +390 ms."""
    path.write_bytes(b"\n".join([
        _msg("user", t0, content=[{"type": "text", "text": "go"}]),
        _msg("assistant", t0 + 20, content=[{"type": "toolCall", "id": "a", "name": "bash"}]),
        _msg("toolResult", t0 + 376, content=[]),
        _msg("assistant", t0 + 390, content=[{"type": "text", "text": "done"}]),
    ]))
    return path


def test_wall_covers_the_work_when_the_ledger_recorded_the_launch_late(tmp_path: Path) -> None:
    """The root's writer stamps node_launched when it commits it, after the worker began (here 24 ms late):
    wall still holds the generation and tool time, and the three figures add up."""
    t0 = 1_767_225_600_000
    row = {"id": "w1", "name": "w1", "role": "worker", "status": "settled",
           "session_file": str(_worker_transcript(tmp_path / "w1.jsonl", t0))}
    events = [("node_launched", t0 + 24), ("node_settled", t0 + 376)]  # a span shorter than the tool call
    r = _node_report(row, {}, events, _Cache(tmp_path), now_ms=t0 + 10_000)
    assert (r.generation_s, r.tool_s) == (0.034, 0.356)
    assert r.wall_s == 0.390  # the union of the ledger's span and the transcript's work
    assert r.wall_s >= r.generation_s + r.tool_s and r.waiting_s >= 0
    assert abs(r.wall_s - r.generation_s - r.tool_s - r.waiting_s) < 1e-9


def test_wall_is_the_ledger_span_when_it_holds_the_work_and_waiting_is_the_rest(tmp_path: Path) -> None:
    t0 = 1_767_225_600_000
    row = {"id": "w1", "name": "w1", "role": "worker", "status": "settled",
           "session_file": str(_worker_transcript(tmp_path / "w1.jsonl", t0))}
    r = _node_report(row, {}, [("node_launched", t0 - 100), ("node_settled", t0 + 500)], _Cache(tmp_path),
                     now_ms=t0 + 10_000)
    assert (r.wall_s, r.generation_s, r.tool_s) == (0.6, 0.034, 0.356)
    assert abs(r.waiting_s - 0.21) < 1e-9


def test_a_clock_that_steps_back_never_counts_an_interval_twice(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join([
        _msg("user", 1000),
        _msg("assistant", 1500, content=[{"type": "toolCall", "id": "a", "name": "bash"}]),
        _msg("toolResult", 1200, content=[]),  # the clock stepped back 300 ms
        _msg("assistant", 1600, content=[{"type": "text", "text": "done"}]),
    ]))
    stats = transcript_stats(path)
    assert (stats.generation_ms, stats.tool_ms) == (500 + 100, 0)
    assert stats.busy == [[1000, 1600]]


def test_git_head_reads_branch_and_sha_of_a_worktree(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    run = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    subprocess.run([*run, "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "-b", "feat", str(tmp_path / "wt")], check=True)
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert git_head(str(repo)) == ("main", sha)
    assert git_head(str(tmp_path / "wt")) == ("feat", sha)
    subprocess.run(["git", "-C", str(repo), "pack-refs", "--all"], check=True)
    assert git_head(str(tmp_path / "wt")) == ("feat", sha)
    assert git_head(str(tmp_path / "nowhere")) == (None, None)
