"""One real silent child produces exactly one L1 notice to its parent; a child inside a tool produces none."""

from __future__ import annotations

from typing import Any

from legion.supervision.stall import StallConfig
from tests.e2e.mail_harness import delivered, mail_run
from tests.support import until


def _launch(name: str, script: str) -> dict[str, Any]:
    return {"name": "subagent", "arguments": {"action": "launch", "agent": "worker", "name": name, "task": name,
                                              "model": f"scripted/{script}"}}


SCRIPTS = {
    "root.yaml": {"turns": [{"tool_calls": [_launch("quiet", "quiet.yaml"), _launch("tooled", "tooled.yaml")]}],
                  "default": {"text": "noted"}},
    # silent for 2.4 s inside one model call: one silence period (1.5 s) passes, a second (3 s) never does
    "quiet.yaml": {"turns": [{"text": "thought hard", "delay_ms": 2400}], "default": {"text": "ok"}},
    "tooled.yaml": {"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 2.4"}}]}],
                    "default": {"text": "ok"}},
}


async def test_a_silent_child_gives_exactly_one_l1_notice() -> None:
    async with mail_run(SCRIPTS, stall=StallConfig(silence_ms=1500)) as run:
        await until(lambda: all(run.orch.tree.get(n) is not None and run.node(n).status == "settled"
                                for n in ("quiet", "tooled")), 20.0, "both settled")
        sweeps = run.postman.sweeps
        await until(lambda: run.postman.sweeps >= sweeps + 3, 10.0, "more sweeps")
        notices = run.mail(to_node="root")
        assert [(n["from_node"], n["kind"]) for n in notices] == [("quiet", "notice")], notices
        assert notices[0]["subject"].startswith("Stall: quiet silent for ")
        await delivered(run, [int(notices[0]["id"])])  # to the parent, as mail; nothing was aborted
        assert run.node("quiet").outcome == "success"
