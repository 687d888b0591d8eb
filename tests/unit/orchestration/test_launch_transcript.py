"""A launch creates its child's (empty) transcript in the transaction that reserves the child's row: a transcript
that cannot be created refuses the launch and records nothing; one that can exists before the child starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from legion.orchestration import launch as launch_module
from legion.orchestration.launch import LaunchRequest
from tests.unit.orchestration.pool_double import start_run, write_project

pytestmark = pytest.mark.timeout(30)


async def test_a_transcript_that_cannot_be_created_refuses_the_launch_and_records_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "run").mkdir()
    orch, pool = start_run(tmp_path / "run", write_project(tmp_path / "project", {}))
    try:
        await orch.launch(None, LaunchRequest(agent="lead", task="lead the run", name="root", model="scripted/echo"))
        assert (tmp_path / "run" / "root.jsonl").is_file()
        real = launch_module._transcript_path
        monkeypatch.setattr(launch_module, "_transcript_path",
                            lambda run_dir, name: real(run_dir / "missing-folder", name) if name == "a"
                            else real(run_dir, name))
        reply = await orch.handle_tool("root", "subagent", {"action": "launch", "agent": "worker", "task": "t",
                                                            "name": "a"})
        assert not reply["ok"] and reply["code"] == "START_FAILED", reply
        assert "transcript" in reply["text"] and "missing-folder" in reply["text"], reply["text"]
        assert orch.ctx.ledger.get_node("a") is None and orch.tree.get("a") is None
        assert "a" not in pool.running()
        # the run goes on: the next launch works, its transcript made before its session starts
        reply = await orch.handle_tool("root", "subagent", {"action": "launch", "agent": "worker", "task": "t",
                                                            "name": "b"})
        assert reply["ok"], reply
        assert (tmp_path / "run" / "b.jsonl").is_file() and orch.ctx.ledger.get_node("b") is not None
    finally:
        await orch.close()
        pool.close()
