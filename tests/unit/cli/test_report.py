"""legion/report.py and legion/fastread.py: transcript figures, spans, git HEAD from files, the schema guard."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson

from legion import fastread
from legion.ledger import SCHEMA_VERSION
from legion.report import _spans, git_head, transcript_stats


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
    assert _spans(events, now_ms=2500) == 100 + 300 + 500


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
