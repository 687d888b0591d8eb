"""The one public event shape (legion/reports/events.py, docs/events.md): the envelope, the fields at the top level,
`run_started` first and `result` last in `legion run --json`, the `result` alone with `--output-format json`, and
a retry as a plain line on stderr in every mode. Every event made here validates against docs/events.md."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from legion.cli.progress import JsonView, LineView, ResultView
from legion.ledger import open_ledger
from legion.orchestration.run import RunResult
from legion.reports.events import ledger_event, public_event, result, run_started, settings_digest
from tests.events_schema import check_events, problems

RETRY = {"node_id": "root", "worker": "pool", "attempt": 1, "max_retries": 2, "delay_ms": 400, "status_code": 429,
         "error": "slow down", "provider": "anthropic", "model": "anthropic/claude-sonnet-4-5"}


def test_the_envelope_and_the_fields_at_the_top_level() -> None:
    event = public_event("node_settled", {"node_id": "c1", "status": "settled", "reason": "normal", "seq": 7,
                                          "type": "x"}, run="r1", seq=12, ts_ms=1_796_231_693_123)
    assert list(event)[:5] == ["type", "ts", "run", "seq", "node"]
    assert event == {"type": "node_settled", "ts": "2026-12-02T17:14:53.123Z", "run": "r1", "seq": 12, "node": "c1",
                     "status": "settled", "reason": "normal", "seq_": 7, "type_": "x"}
    worker = public_event("usage", {"nodeId": "w1", "input": 3, "output": 1, "costUsd": 0.0}, run="r1", seq=1)
    assert worker["node"] == "w1" and "nodeId" not in worker
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", worker["ts"])
    assert public_event("supervisor_exited", {"supervisor": "top", "reason": "shutdown"}, run="r1", seq=2)["node"] is None
    check_events([event | {"type": "node_settled"}, worker])


def test_a_stored_event_even_a_damaged_one() -> None:
    row = {"id": 5, "node_id": "c1", "type": "node_failed", "data": {"reason": "crash"}, "ts": 0}
    assert ledger_event(row, run="r1") == {"type": "node_failed", "ts": "1970-01-01T00:00:00.000Z", "run": "r1",
                                           "seq": 5, "node": "c1", "reason": "crash"}
    damaged = ledger_event({"id": 6, "node_id": None, "type": "node_failed", "data": [1], "ts": "x"}, run="r1")
    assert damaged["data"] == [1] and damaged["bad_ts"] == "'x'" and damaged["node"] is None


def test_an_undocumented_or_malformed_event_is_caught() -> None:
    assert problems(public_event("no_such_event", {}, run="r1", seq=1)) == [
        "no_such_event: not documented in docs/events.md"]
    assert problems({"type": "usage", "run": "r1", "seq": 1, "node": None}) == [
        'envelope: $: "ts" is a required property']
    bad = public_event("retry_scheduled", {**RETRY, "attempt": 0}, run="r1", seq=1)
    assert problems(bad) == ["retry_scheduled: $.attempt: 0 is less than the minimum of 1"]


def test_the_settings_digest_is_stable_and_short() -> None:
    assert settings_digest({"a": 1, "b": {"c": 2}}) == settings_digest({"b": {"c": 2}, "a": 1})
    assert settings_digest({"a": 1}) != settings_digest({"a": 2})
    assert re.fullmatch(r"sha256:[0-9a-f]{16}", settings_digest({}))


def _finished_run(tmp_path: Path) -> RunResult:
    """A run directory with a ledger (root and one child, their usage) and the root's transcript."""
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    transcript = run_dir / "root.jsonl"
    usage = {"input": 100, "output": 20, "cacheRead": 400, "cacheWrite": 50}
    lines = [{"type": "message", "message": {"role": "user", "content": "hi", "timestamp": 1000}},
             *({"type": "message", "message": {"role": "assistant", "content": [{"type": "text", "text": "ok"}],
                                               "usage": usage, "timestamp": 2000 + i}} for i in range(2))]
    transcript.write_text("".join(json.dumps(line) + "\n" for line in lines))
    led = open_ledger(run_dir / "legion.db")
    try:
        led.insert_node(id="root", name="root", role="root", depth=0, status="settled", session_file=str(transcript),
                        model="anthropic/claude-sonnet-4-5")
        led.insert_node(id="c1", name="c1", role="worker", depth=1, parent_id="root", status="settled",
                        model="local/m")
        led.upsert_usage("root", 200, 40, 0.25)
        led.upsert_usage("c1", 10, 5, 0.0, unknown_cost_tokens=15)
    finally:
        led.close()
    return RunResult(0, "settled", run_dir, "r1", "ok", [], wall_s=1.5)


def test_the_result_carries_the_totals_and_the_nodes(tmp_path: Path) -> None:
    event = result(_finished_run(tmp_path), seq=9)
    check_events([event])
    assert (event["type"], event["seq"], event["node"], event["run"]) == ("result", 9, None, "r1")
    assert (event["status"], event["exit_code"], event["is_error"], event["duration_ms"]) == ("settled", 0, False, 1500)
    assert event["total_cost_usd"] == 0.25 and event["unknown_cost_tokens"] == 15 and event["num_turns"] == 2
    assert (event["tokens_in"], event["tokens_out"], event["cache_read"], event["cache_write"]) == (210, 45, 800, 100)
    assert [(n["node"], n["parent"], n["turns"], n["cache_read"]) for n in event["nodes"]] == [
        ("root", None, 2, 800), ("c1", "root", 0, 0)]
    assert event["final_text"] == "ok" and "resume" not in event


def test_the_json_stream_starts_with_run_started_and_ends_with_the_result(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    started = run_started(run="r1", run_dir=tmp_path / "r1", cwd=tmp_path, model="scripted/echo", agent="root",
                          team=None, settings={"legion": {}})
    view = JsonView(out, started)
    view.event("node_status", {"node_id": "root", "status": "running"}, 1)
    view.event("text_delta", {"node_id": "root", "delta": "hi"}, 2)  # left out: the monitor has it
    view.event("retry_scheduled", RETRY, 3)
    view.summary(_finished_run(tmp_path))
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    check_events(events)
    assert [(e["type"], e["seq"]) for e in events] == [("run_started", 0), ("node_status", 1),
                                                        ("retry_scheduled", 3), ("result", 4)]
    assert events[0]["run"] == "r1" and events[0]["model"] == "scripted/echo" and events[0]["resumed"] is False
    assert all(e["run"] == "r1" for e in events)
    err = capsys.readouterr().err
    assert "retry_scheduled  root anthropic/claude-sonnet-4-5 request failed (HTTP 429: slow down); retry 1 of 2" in err


def test_output_format_json_prints_the_result_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    view = ResultView(out, progress_every=0)
    view.event("node_status", {"node_id": "root", "status": "running"}, 1)
    view.event("retry_succeeded", {**RETRY, "node_id": "root"}, 2)
    view.summary(_finished_run(tmp_path))
    view.close()
    [only] = [json.loads(line) for line in out.getvalue().splitlines()]
    assert only["type"] == "result" and only["seq"] == 3
    err = capsys.readouterr().err  # the plain lines went to stderr
    assert "node_status      root running" in err and "request answered on retry 1 of 2" in err


def test_the_plain_view_prints_a_retry_line() -> None:
    stream = io.StringIO()
    view = LineView(stream, progress_every=0)
    view.event("retry_gave_up", {**RETRY, "attempt": 2})
    view.close()
    assert "retry_gave_up    root anthropic/claude-sonnet-4-5 request still failing after 2 retries (HTTP 429: slow " \
           "down); giving up" in stream.getvalue()


