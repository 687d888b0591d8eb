"""Retries you can see (docs/events.md, "Retries"): a root on a local OpenAI-compatible stub that answers 429 first.
Each retry is a plain line on stderr, an event in `legion run --json` and a line in the run's legion.log; when the
retries run out, `retry_gave_up` and the provider's error end the run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.e2e.harness import project
from tests.e2e.test_providers import run_async, stub_provider
from tests.events_schema import check_events, json_lines

sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from openai_stub import OpenAIStub, Reply

pytestmark = pytest.mark.timeout(90)
SLOW_DOWN = Reply(status=429, body='{"error": {"message": "slow down"}}', headers={"retry-after": "0.3"})


async def test_a_429_then_an_answer_shows_each_retry(stubs: tuple[OpenAIStub, OpenAIStub]) -> None:
    stub, _ = stubs
    with project() as proj:
        proj.settings({"providers": {"openai": {**stub_provider(stub, "gpt-test"), "maxRetries": 2}}})
        stub.replies.extend([SLOW_DOWN, SLOW_DOWN, Reply(text_chunks=["answered after the wait"])])
        out = await run_async(proj, "say something", "--model", "openai/gpt-test", "--json",
                              env={"STUB_KEY": "sk-e2e"})
        assert out.code == 0, out.explain()
        assert len(stub.requests) == 3
        events = json_lines(out.stdout)
        check_events(events, "a run with retries")
        retries = [e for e in events if e["type"].startswith("retry_")]
        assert [(e["type"], e["node"], e["attempt"]) for e in retries] == [
            ("retry_scheduled", "root", 1), ("retry_scheduled", "root", 2), ("retry_succeeded", "root", 2)]
        first = retries[0]
        assert (first["status_code"], first["error"], first["delay_ms"], first["max_retries"]) == (
            429, "slow down", 300, 2)
        assert first["provider"] == "openai" and first["model"] == "openai/gpt-test"
        assert events[-1]["type"] == "result" and events[-1]["final_text"] == "answered after the wait"
        line = "retry_scheduled  root openai/gpt-test request failed (HTTP 429: slow down); retry {} of 2 in 0.3s"
        assert line.format(1) in out.stderr and line.format(2) in out.stderr, out.stderr
        assert "retry_succeeded  root openai/gpt-test request answered on retry 2 of 2" in out.stderr
        log = (out.run_dir / "legion.log").read_text()
        assert "root: openai/gpt-test request failed (HTTP 429: slow down); retry 1 of 2 in 0.3s" in log, log[-3000:]
        assert "root: openai/gpt-test request answered on retry 2 of 2" in log


async def test_retries_that_run_out_give_up_with_the_providers_error(stubs: tuple[OpenAIStub, OpenAIStub]) -> None:
    """Plain mode (no --json): the lines on stderr; the run fails with the provider's reason."""
    stub, _ = stubs
    with project() as proj:
        proj.settings({"providers": {"openai": {**stub_provider(stub, "gpt-test"), "maxRetries": 1}}})
        stub.replies.extend([SLOW_DOWN, SLOW_DOWN])
        out = await run_async(proj, "say something", "--model", "openai/gpt-test", env={"STUB_KEY": "sk-e2e"})
        assert out.code == 1, out.explain()
        assert len(stub.requests) == 2
        assert "request failed (HTTP 429: slow down); retry 1 of 1 in 0.3s" in out.stderr, out.stderr
        assert "retry_gave_up    root openai/gpt-test request still failing after 1 retries (HTTP 429: slow down); " \
               "giving up" in out.stderr
        assert "rate limited and still failing after 1 retries" in out.stdout + out.stderr
        assert "giving up" in (out.run_dir / "legion.log").read_text()
