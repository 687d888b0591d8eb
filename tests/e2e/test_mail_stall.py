"""One real silent child produces exactly one L1 notice to its parent; a child inside a tool produces none."""

from __future__ import annotations

import time
from typing import Any

from legion.orchestration.stall import StallConfig
from tests.e2e.mail_harness import Run, delivered, mail_run
from tests.support import until


def _launch(name: str, script: str) -> dict[str, Any]:
    return {"name": "subagent", "arguments": {"action": "launch", "agent": "worker", "name": name, "task": name,
                                              "model": f"scripted/{script}"}}


SCRIPTS = {
    "root.yaml": {"turns": [{"tool_calls": [_launch("quiet", "quiet.yaml"), _launch("tooled", "tooled.yaml")]}],
                  "default": {"text": "noted"}},
    # silent for 3 s inside one model call: one silence period (2 s) passes, a second (4 s) never does
    "quiet.yaml": {"turns": [{"text": "thought hard", "delay_ms": 3000}], "default": {"text": "ok"}},
    "tooled.yaml": {"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 3"}}]}],
                    "default": {"text": "ok"}},
}


def _tools_in_flight(run: Run, name: str) -> bool:
    """The postman's stall window of `name` has a tool in flight."""
    node = run.orch.tree.get(name)
    return node is not None and node.mail.track is not None and bool(node.mail.track.tools)


async def test_a_silent_child_gives_exactly_one_l1_notice() -> None:
    async with mail_run(SCRIPTS, stall=StallConfig(silence_ms=2000)) as run:
        await until(lambda: all(run.orch.tree.get(n) is not None and run.node(n).status == "settled"
                                for n in ("quiet", "tooled")), 20.0, "both settled")
        sweeps = run.postman.sweeps
        await until(lambda: run.postman.sweeps >= sweeps + 3, 10.0, "more sweeps")
        notices = run.mail(to_node="root")
        assert [(n["from_node"], n["kind"]) for n in notices] == [("quiet", "notice")], notices
        assert notices[0]["subject"].startswith("Stall: quiet silent for ")
        await delivered(run, [int(notices[0]["id"])])  # to the parent, as mail; nothing was aborted
        assert run.node("quiet").outcome == "success"


GATED = {
    "root.yaml": {"turns": [{"tool_calls": [_launch("t", "gated.yaml")]}], "default": {"text": "noted"}},
    "gated.yaml": {"turns": [{"tool_calls": [{"name": "bash", "arguments": {
        "command": "while [ ! -e gate ]; do sleep 0.02; done"}}]}], "default": {"text": "ok"}},
}


async def test_a_running_status_landing_after_a_tool_started_keeps_the_tool_in_flight() -> None:
    """The `running` status lands through the ledger writer, so under load it can come after the run's first
    tool call started: the child is inside a tool, never silent, and its parent gets no L1 notice."""
    async with mail_run(GATED, stall=StallConfig(silence_ms=2000)) as run:
        postman = run.postman
        await until(lambda: _tools_in_flight(run, "t") and run.node("t").live,
                    20.0, "t inside its tool")
        postman._on_status(run.node("t"), "running", "node_launched", {})  # the status, late
        postman.clock = lambda: time.time() + 10.0  # far past the silence period, short of the L2 radius
        sweeps = postman.sweeps
        await until(lambda: postman.sweeps >= sweeps + 3, 10.0, "three sweeps past the silence period")
        assert run.mail(to_node="root") == []
        (run.cwd / "gate").touch()
        await until(lambda: run.node("t").status == "settled", 20.0, "t settled")
