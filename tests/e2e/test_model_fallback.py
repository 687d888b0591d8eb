"""`fallbackModels` is used (issue 21, item 15; docs/spec-conformance.md §1.5): a child whose model cannot be used at
all — its provider is unknown, its API key is missing — runs on the next fallback model; each switch is recorded
(a `node_launched` event carrying `fallback`, the node's model in the ledger, the transcript's `model_change`) and
shown by `status` and `collect`. A model that works but fails (an error on its call) is not replaced."""

from __future__ import annotations

import json

import pytest

from legion.ledger.runfile import LAUNCHES_DIR
from tests.e2e.harness import launch, messages, node_rows, project, subagent, tool_results

pytestmark = pytest.mark.timeout(120)

# a provider legion knows whose key variable is never set: the call fails before any network traffic
KEYLESS = {"keyless": {"baseUrl": "http://127.0.0.1:9/v1", "apiKey": "LEGION_E2E_NEVER_SET_KEY", "models": ["m1"]}}


def test_a_child_whose_model_cannot_be_used_runs_on_its_fallback_models() -> None:
    with project() as proj:
        child = proj.script("child", {"text": "answered by the fallback"})
        proj.settings({"providers": KEYLESS})
        proj.card("flaky", model="nowhere/missing-model", fallbackModels=["keyless/m1", child])
        root = proj.script(
            "root",
            launch({"name": "c1", "agent": "flaky", "task": "answer"}),
            subagent("collect", name="c1"),
            subagent("status", name="c1"),
            {"text": "root done"}, default={"text": "noted"})
        out = proj.run("go", "--model", root, "--timeout", "60", env={"LEGION_E2E_NEVER_SET_KEY": ""})
        assert out.code == 0, out.explain()
        rows = node_rows(out.run_dir)
        assert rows["c1"]["status"] == "settled" and rows["c1"]["model"] == child, rows["c1"]

        launched = [e for e in proj.events(out.run_dir) if e.get("node") == "c1" and e["type"] == "node_launched"]
        switches = [e["fallback"] for e in launched if "fallback" in e]
        assert [(s["from"], s["remaining"]) for s in switches] == [
            ("nowhere/missing-model", [child]), ("keyless/m1", [])], launched
        assert "unknown provider 'nowhere'" in switches[0]["error"], switches
        assert "LEGION_E2E_NEVER_SET_KEY" in switches[1]["error"], switches
        assert [e["model"] for e in launched if "fallback" in e] == ["keyless/m1", child]

        collected, status = tool_results(out.run_dir / "root.jsonl")[1:3]
        assert f"c1 (flaky, {child}): settled, outcome success" in collected, collected
        assert "answered by the fallback" in collected, collected
        assert "model nowhere/missing-model could not be used" in collected, collected
        assert f"switched to its fallback model {child}" in collected, collected
        assert child in status.splitlines()[0], status

        transcript = out.run_dir / "c1.jsonl"
        assistant = [m for m in messages(transcript) if m.get("role") == "assistant"]
        assert [m.get("stopReason") for m in assistant] == ["stop"], assistant  # the failed calls are not turns
        status_json = proj.cli_json("status", str(out.run_dir), "--json")
        nodes = status_json["nodes"] if isinstance(status_json, dict) else status_json
        assert any(n.get("id") == "c1" and n.get("model") == child for n in nodes), status_json
        # a later root (`legion resume`) revives c1 on the model that worked, with no provider pin
        record = json.loads((out.run_dir / LAUNCHES_DIR / "c1.json").read_text())
        assert record["model"] == record["spec"]["model"] == child and record["provider_pin"] is None, record
        assert "fallbackModels" not in record["spec"], record


def test_a_model_that_fails_on_its_call_is_not_replaced() -> None:
    with project() as proj:
        broken = proj.script("broken", {"error": "the provider broke mid-call"})
        spare = proj.script("spare", {"text": "never used"})
        proj.card("fragile", model=broken, fallbackModels=[spare])
        root = proj.script(
            "root",
            launch({"name": "c1", "agent": "fragile", "task": "answer"}),
            subagent("collect", name="c1"),
            {"text": "root done"}, default={"text": "noted"})
        out = proj.run("go", "--model", root, "--timeout", "60")
        assert out.code == 0, out.explain()
        rows = node_rows(out.run_dir)
        assert rows["c1"]["status"] == "failed" and rows["c1"]["model"] == broken, rows["c1"]
        events = [e for e in proj.events(out.run_dir) if e.get("node") == "c1"]
        assert not any("fallback" in e for e in events), events
        collected = tool_results(out.run_dir / "root.jsonl")[1]
        assert "the provider broke mid-call" in collected and "fallback" not in collected, collected
