"""A run whose root talks to an OpenAI-compatible endpoint (the local stub, configured in settings `providers`),
and a `kind: pi` child (a project card) driven by the real `pi --mode rpc` against another local stub."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import LEGION, Outcome, Project, node_rows, project, tool_results

sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from openai_stub import OpenAIStub, Reply

pytestmark = pytest.mark.timeout(90)
PI = shutil.which("pi")


async def run_async(proj: Project, task: str, *args: str, env: dict[str, str], timeout: float = 60) -> Outcome:
    """`legion run` without blocking this event loop (the stubs are served by it)."""
    run_id = proj.next_run_id()
    proc = await asyncio.create_subprocess_exec(LEGION, "run", task, "--run-id", run_id, *args, cwd=proj.dir,
                                                env={**proj._env(None), **env}, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return Outcome(proc.returncode, out.decode(), err.decode(), proj.run_path(run_id))


def tool_call(call_id: str, name: str, args: dict[str, Any]) -> Reply:
    return Reply(tool_calls=[(call_id, name, [json.dumps(args)])])


def stub_provider(stub: OpenAIStub, *models: str) -> dict[str, Any]:
    return {"baseUrl": stub.base_url, "apiKey": "STUB_KEY", "models": list(models)}


async def test_an_openai_root_dispatches_a_scripted_child(stubs: tuple[OpenAIStub, OpenAIStub]) -> None:
    root_stub, _ = stubs
    with project() as proj:
        proj.settings({"providers": {"openai": stub_provider(root_stub, "gpt-test")}})
        child = proj.script("c1", {"text": "child result 42"})
        root_stub.replies.extend([
            tool_call("t1", "subagent", {"action": "launch", "tasks": [
                {"name": "c1", "agent": "worker", "task": "find 42", "model": child}]}),
            tool_call("t2", "subagent", {"action": "wait"}),
            Reply(text_chunks=["the answer ", "is 42"])])
        out = await run_async(proj, "find the answer", "--model", "openai/gpt-test", env={"STUB_KEY": "sk-e2e"})
        assert out.code == 0, out.explain()
        assert out.stdout.startswith("the answer is 42\n")
        assert len(root_stub.requests) == 3
        first = root_stub.requests[0]
        assert first.headers["authorization"] == "Bearer sk-e2e" and first.body["model"] == "gpt-test"
        assert "subagent" in {t["function"]["name"] for t in first.body["tools"]}
        sent = json.dumps(root_stub.requests[2].body["messages"])
        assert "child result 42" in sent  # the wait result went back to the model
        rows = node_rows(out.run_dir)
        assert rows["root"]["model"] == "openai/gpt-test" and rows["c1"]["status"] == "settled"
        with proj.ledger(out.run_dir) as led:
            assert (led.get_usage("root") or {}).get("tokens_in", 0) > 0  # the stub's usage chunks were recorded


@pytest.mark.skipif(PI is None, reason="the pi CLI is not installed (npm install -g @mariozechner/pi-coding-agent)")
async def test_a_pi_child_driven_by_the_real_pi(stubs: tuple[OpenAIStub, OpenAIStub]) -> None:
    """pi reads its providers from $HOME/.pi/agent/models.json, legion from settings: both name the stub."""
    root_stub, pi_stub = stubs
    with project() as proj:
        home = proj.dir / "home"
        (home / ".pi" / "agent").mkdir(parents=True)
        (home / ".pi" / "agent" / "models.json").write_text(json.dumps({"providers": {"stub": {
            "baseUrl": pi_stub.base_url, "api": "openai-completions", "apiKey": "STUB_KEY",
            "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
            "models": [{"id": "m1"}]}}}))
        proj.settings({"providers": {"openai": stub_provider(root_stub, "gpt-test"),
                                     "stub": stub_provider(pi_stub, "m1")}})
        proj.card("pichild", body="You are a pi-run helper. Answer briefly.", kind="pi", model="stub/m1",
                  tools=["read", "bash"])
        pi_stub.replies.append(Reply(text_chunks=["pi ", "says ", "hello"]))
        root_stub.replies.extend([
            tool_call("t1", "subagent", {"action": "launch", "tasks": [
                {"name": "p1", "agent": "pichild", "task": "greet"}]}),
            tool_call("t2", "subagent", {"action": "wait"}),
            Reply(text_chunks=["pi answered"])])
        out = await run_async(proj, "ask pi", "--model", "openai/gpt-test",
                              env={"STUB_KEY": "sk-e2e", "HOME": str(home), "PI_OFFLINE": "1"})
        assert out.code == 0, out.explain()
        rows = node_rows(out.run_dir)
        pi_log = out.run_dir / "p1.pi-stderr.log"
        why = f"{rows['p1']}\npi stderr:\n{pi_log.read_text()[-2000:] if pi_log.exists() else '-'}\n{out.explain()}"
        assert rows["p1"]["kind"] == "pi" and rows["p1"]["status"] == "settled" and rows["p1"]["model"] == "stub/m1", why
        assert len(pi_stub.requests) == 1
        assert json.dumps(pi_stub.requests[0].body["messages"]).count("greet") >= 1
        assert "pi says hello" in tool_results(out.run_dir / "root.jsonl")[1]
        assert (out.run_dir / "artifacts" / "p1" / "r1.md").read_text().strip() == "pi says hello"


async def test_an_unpriced_model_is_reported_unknown_and_its_tokens_stop_a_cost_budget(
        stubs: tuple[OpenAIStub, OpenAIStub]) -> None:
    """`gpt-test` has no price (genai-prices does not know it, settings give none): its cost is recorded as
    unknown, never 0, and the cost budget charges its tokens at `unknownCostPerMTokUsd`. Each stub turn uses
    10 + 5 tokens = $1.50 at $100,000/Mtok, so after the first turn the $1 budget stops the root's next one."""
    root_stub, _ = stubs
    with project() as proj:
        proj.settings({"providers": {"openai": stub_provider(root_stub, "gpt-test")},
                       "legion": {"budget": {"maxCostUsd": 1.0, "unknownCostPerMTokUsd": 100_000}}})
        root_stub.replies.extend([tool_call("t1", "subagent", {"action": "list"}), Reply(text_chunks=["never"])])
        out = await run_async(proj, "spend", "--model", "openai/gpt-test", env={"STUB_KEY": "sk-e2e"})
        assert len(root_stub.requests) == 1, out.explain()  # the second model call was never made
        with proj.ledger(out.run_dir) as led:
            usage = led.get_usage("root") or {}
        assert (usage.get("tokens_in"), usage.get("tokens_out"), usage.get("cost_usd")) == (10, 5, 0.0)
        assert usage.get("unknown_cost_tokens") == 15
        said = out.stdout + out.stderr
        assert "tree-wide cost budget is spent ($1.5000 of $1.0000" in said, out.explain()
        assert "15 tokens at unknown prices counted at $100000/Mtok" in said
        assert "15 tok · $0.0000+?" in out.stdout and "+ unknown (15 tokens of unpriced models" in out.stdout
        summary = proj.cli("summary", out.run_dir.name)
        assert summary.returncode == 0, summary.stderr
        assert "15 tok · $0.0000+?" in summary.stdout and "+ unknown (15 tokens" in summary.stdout
        [node] = proj.cli_json("summary", out.run_dir.name, "--json")["nodes"]
        assert (node["cost_usd"], node["unknown_cost_tokens"]) == (0.0, 15)
