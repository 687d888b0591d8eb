"""Failures say why (issue 21, item 14; docs/spec-conformance.md §2.1): a child that fails on a model error (an HTTP
400 from its provider) or on an unrecognised stop reason reports the reason in `wait`, in its completion notice and
in `collect`, never "(no final output)"; the unrecognised stop reason is named, and its outcome is `failed`, not
the `unknown` of a missing turn."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.harness import (
    NOTICE_FIRST_LINE,
    launch,
    node_rows,
    project,
    subagent,
    tool_results,
    user_texts,
)
from tests.e2e.test_providers import run_async, stub_provider

pytestmark = pytest.mark.timeout(120)

BAD_REQUEST = json.dumps({"error": {"message": "messages[0].content: invalid type, expected a string",
                                    "type": "invalid_request_error"}})


def _failing_children(stubs: Any, proj: Any) -> dict[str, Any]:
    """The launch of c1 (its provider answers HTTP 400) and c2 (its model stops with finish_reason weird_reason)."""
    from openai_stub import Reply

    bad, odd = stubs
    bad.default = Reply(status=400, body=BAD_REQUEST, content_type="application/json")
    odd.default = Reply(text_chunks=["half an answer"], finish="weird_reason")
    proj.settings({"providers": {"bad": stub_provider(bad, "m400"), "odd": stub_provider(odd, "modd")}})
    return launch({"name": "c1", "agent": "worker", "task": "t1", "model": "bad/m400"},
                  {"name": "c2", "agent": "worker", "task": "t2", "model": "odd/modd"})


async def test_a_failed_child_reports_its_model_error_and_unrecognised_stop_reason(stubs) -> None:  # type: ignore[no-untyped-def]
    with project() as proj:
        root = proj.script(
            "root",
            _failing_children(stubs, proj),
            subagent("wait"),  # both results inline, each as its completion notice shows it (`result_block`)
            subagent("collect", name="c1"),
            subagent("collect", name="c2"),
            {"text": "root done"})
        out = await run_async(proj, "go", "--model", root, env={"STUB_KEY": "sk-e2e"})
        replies = tool_results(out.run_dir / "root.jsonl")
        assert len(replies) == 4, out.explain()
        waited, collect_c1, collect_c2 = replies[1], replies[2], replies[3]
        for text in (waited, collect_c1):
            assert "invalid type, expected a string" in text and "400" in text, text
        for text in (waited, collect_c2):
            assert "unrecognised finish_reason 'weird_reason'" in text, text
        assert "outcome failed" in collect_c1 and "outcome failed" in collect_c2, (collect_c1, collect_c2)
        assert "half an answer" in collect_c2, collect_c2  # the text it did write comes first
        for text in replies[1:]:
            assert "no final output" not in text, text
        # the round's artifact, which the completion notice names and inlines, carries the reason too
        assert "400" in (out.run_dir / "artifacts" / "c1" / "r1.md").read_text()
        assert "weird_reason" in (out.run_dir / "artifacts" / "c2" / "r1.md").read_text()
        rows = node_rows(out.run_dir)
        assert rows["c1"]["status"] == "failed" and rows["c2"]["status"] == "failed", rows


async def test_the_completion_notice_of_a_failed_child_says_why(stubs) -> None:  # type: ignore[no-untyped-def]
    with project() as proj:
        # the root ends its turn: each child's result reaches it as a completion notice (one batch or two)
        root = proj.script(
            "root",
            _failing_children(stubs, proj),
            default={"text": "noted"})
        out = await run_async(proj, "go", "--model", root, env={"STUB_KEY": "sk-e2e"})
        notices = "\n".join(t for t in user_texts(out.run_dir / "root.jsonl") if t.startswith(NOTICE_FIRST_LINE))
        assert "c1 (worker, bad/m400): failed, outcome failed" in notices, out.explain()
        assert "invalid type, expected a string" in notices and "weird_reason" in notices, notices
        assert "no final output" not in notices, notices
