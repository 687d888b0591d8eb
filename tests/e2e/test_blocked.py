"""Blocked children (docs/spec-conformance.md §2.1): a `kind: pi` child run by the real `pi --mode rpc` whose
extension asks `ctx.ui.confirm(...)` before each bash call. Through `legion run` with a scripted root (a local
OpenAI-compatible stub): the node becomes `blocked` with `node_blocked` carrying the request, the root gets an
action-needed notice, `wait` and `collect` report the blocked state (collect runs no acceptance command), a steer
that does not answer is refused, `steer approve` answers it and the bash runs; a card with `onBlocked: reject`
has the dialog cancelled at once (the bash is refused by the extension, the node never waits)."""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import Project, node_rows, project, tool_results
from tests.e2e.test_providers import run_async, stub_provider, tool_call

sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from openai_stub import OpenAIStub, Reply

PI = shutil.which("pi")
pytestmark = [pytest.mark.timeout(150),
              pytest.mark.skipif(PI is None, reason="the pi CLI is not installed "
                                 "(npm install -g @mariozechner/pi-coding-agent)")]

# a pi extension (auto-discovered from $HOME/.pi/agent/extensions): every bash call needs the host's confirmation
GATE = """export default function (pi) {
  pi.on("tool_call", async (event, ctx) => {
    if (event.toolName !== "bash") return;
    const ok = await ctx.ui.confirm("Run bash?", String(event.input.command));
    if (!ok) return { block: true, reason: "denied by the host" };
  });
}
"""


def _pi_home(proj: Project, pi_stub: OpenAIStub) -> Path:
    home = proj.dir / "home"
    (home / ".pi" / "agent" / "extensions").mkdir(parents=True)
    (home / ".pi" / "agent" / "models.json").write_text(json.dumps({"providers": {"stub": {
        "baseUrl": pi_stub.base_url, "api": "openai-completions", "apiKey": "STUB_KEY",
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
        "models": [{"id": "m1"}]}}}))
    (home / ".pi" / "agent" / "extensions" / "gate.ts").write_text(GATE)
    return home


def _events(proj: Project, run_dir: Path, node: str, type_: str) -> list[dict[str, Any]]:
    with proj.ledger(run_dir) as led:
        return [e.data for e in led.events_after(0, 100_000, node_id=node) if e.type == type_]


def _mail(run_dir: Path) -> list[dict[str, Any]]:
    with contextlib.closing(sqlite3.connect(f"file:{run_dir / 'legion.db'}?mode=ro", uri=True)) as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute("SELECT * FROM messages ORDER BY id")]


def _why(out: Any, run_dir: Path) -> str:
    log = run_dir / "p1.pi-stderr.log"
    return f"pi stderr:\n{log.read_text()[-2000:] if log.exists() else '-'}\n{out.explain()}"


async def test_a_blocked_pi_child_is_reported_and_answered_by_a_steer(stubs: tuple[OpenAIStub, OpenAIStub]) -> None:
    root_stub, pi_stub = stubs
    with project() as proj:
        home = _pi_home(proj, pi_stub)
        proj.settings({"providers": {"openai": stub_provider(root_stub, "gpt-test"),
                                     "stub": stub_provider(pi_stub, "m1")}})
        proj.card("gated", body="You run commands.", kind="pi", model="stub/m1", tools=["bash"],
                  acceptance={"level": "attested", "criteria": [
                      {"description": "checked", "command": "echo check >> checks.log"}]})
        pi_stub.replies.extend([tool_call("b1", "bash", {"command": "echo approved-ran"}),
                                Reply(text_chunks=["ran it"])])
        root_stub.replies.extend([
            tool_call("t1", "subagent", {"action": "launch", "tasks": [
                {"name": "p1", "agent": "gated", "task": "run the command"}]}),
            tool_call("t2", "subagent", {"action": "wait", "timeoutMs": 60000}),
            tool_call("t3", "subagent", {"action": "collect", "name": "p1", "timeoutMs": 60000}),
            tool_call("t4", "subagent", {"action": "steer", "name": "p1", "message": "maybe"}),
            tool_call("t5", "subagent", {"action": "steer", "name": "p1", "message": "approve"}),
            tool_call("t6", "subagent", {"action": "collect", "name": "p1", "timeoutMs": 60000}),
            Reply(text_chunks=["all done"])])
        out = await run_async(proj, "run it through p1", "--model", "openai/gpt-test", timeout=120,
                              env={"STUB_KEY": "sk-e2e", "HOME": str(home), "PI_OFFLINE": "1"})
        why = _why(out, out.run_dir)
        assert out.code == 0, why
        results = tool_results(out.run_dir / "root.jsonl")
        waited, blocked_collect, refused, answered, final = results[1:6]
        assert "'p1' is blocked" in waited and "confirm" in waited and "Run bash?" in waited, why
        assert "'p1' is blocked" in blocked_collect and "echo approved-ran" in blocked_collect, why
        assert "No result yet" in blocked_collect and "acceptance" not in blocked_collect, why
        assert "does not answer it" in refused and "'approve' or 'reject'" in refused, why
        assert "steer → p1: approved" in answered, why
        assert "ran it" in final and "settled" in final and "acceptance: verified" in final, why
        assert (proj.dir / "checks.log").read_text() == "check\n"  # only the terminal collect verified
        blocked = _events(proj, out.run_dir, "p1", "node_blocked")
        assert len(blocked) == 1, why
        request = blocked[0]["request"]
        assert blocked[0]["policy"] == "ask" and request["method"] == "confirm", blocked
        assert request["title"] == "Run bash?" and request["message"] == "echo approved-ran", blocked
        notices = [m for m in _mail(out.run_dir) if m["from_node"] == "p1" and m["to_node"] == "root"
                   and m["urgency"] == "action-needed"]
        assert len(notices) == 1 and "subagent steer" in notices[0]["body"], notices
        assert node_rows(out.run_dir)["p1"]["status"] == "settled"
        # the bash ran once approved: its output went back to pi's model
        assert "approved-ran" in json.dumps(pi_stub.requests[1].body["messages"]), why


async def test_on_blocked_reject_cancels_the_dialog_at_once(stubs: tuple[OpenAIStub, OpenAIStub]) -> None:
    root_stub, pi_stub = stubs
    with project() as proj:
        home = _pi_home(proj, pi_stub)
        proj.settings({"providers": {"openai": stub_provider(root_stub, "gpt-test"),
                                     "stub": stub_provider(pi_stub, "m1")}})
        proj.card("gated", body="You run commands.", kind="pi", model="stub/m1", tools=["bash"], onBlocked="reject")
        pi_stub.replies.extend([tool_call("b1", "bash", {"command": "echo never-ran"}),
                                Reply(text_chunks=["it was refused"])])
        root_stub.replies.extend([
            tool_call("t1", "subagent", {"action": "launch", "tasks": [
                {"name": "p1", "agent": "gated", "task": "run the command"}]}),
            tool_call("t2", "subagent", {"action": "wait", "timeoutMs": 60000}),
            Reply(text_chunks=["done"])])
        out = await run_async(proj, "run it through p1", "--model", "openai/gpt-test", timeout=120,
                              env={"STUB_KEY": "sk-e2e", "HOME": str(home), "PI_OFFLINE": "1"})
        why = _why(out, out.run_dir)
        assert out.code == 0, why
        assert "it was refused" in tool_results(out.run_dir / "root.jsonl")[1], why
        blocked = _events(proj, out.run_dir, "p1", "node_blocked")
        assert [(b["policy"], b["answer"], b["request"]["method"]) for b in blocked] == [
            ("reject", "rejected", "confirm")], why
        assert not [m for m in _mail(out.run_dir) if m["urgency"] == "action-needed"]
        sent = json.dumps(pi_stub.requests[1].body["messages"])
        assert "denied by the host" in sent and "never-ran\\n" not in sent, why
        assert node_rows(out.run_dir)["p1"]["status"] == "settled"
