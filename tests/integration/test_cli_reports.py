"""`legion summary` and `legion timing` on a real finished run, as a user runs them."""

from __future__ import annotations

import orjson

from tests.integration.cli_support import legion, project


def test_summary_and_timing_of_a_finished_run() -> None:
    with project(worker_sleep=0.3) as cwd:
        done = legion(cwd, "run", "--run-id", "s1", "--model", "scripted/root.yaml", "task")
        assert done.returncode == 0, done.stderr
        summary = legion(cwd, "summary")
        assert summary.returncode == 0, summary.stderr
        assert "w1 [worker] settled" in summary.stdout and "W1 RESULT ok" in summary.stdout
        data = orjson.loads(legion(cwd, "summary", "s1", "--json").stdout)
        nodes = {n["name"]: n for n in data["nodes"]}
        assert set(nodes) == {"root", "w1"}
        w1 = nodes["w1"]
        assert w1["turns"] == 2 and w1["tool_calls"] == 1 and w1["tokens_in"] > 0 and w1["final"] == ["W1 RESULT ok"]
        timing = orjson.loads(legion(cwd, "timing", "s1", "w1", "--json").stdout)
        (only,) = timing["nodes"]
        assert only["name"] == "w1"
        assert only["tool_s"] >= 0.3  # the bash sleep
        assert only["wall_s"] >= only["tool_s"]
        assert abs(only["wall_s"] - only["generation_s"] - only["tool_s"] - only["waiting_s"]) < 0.01
        missing = legion(cwd, "timing", "s1", "w11")
        assert missing.returncode == 2 and "did you mean 'w1'" in missing.stderr
        assert legion(cwd, "summary", "nope").returncode == 2
