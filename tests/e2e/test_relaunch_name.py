"""A node launched again under its name: the new incarnation takes over what the orchestrator and the Postman
hold for the name (docs/architecture.md §7), so a revive of the old one and the relaunch never race."""

from __future__ import annotations

import asyncio

from tests.e2e.mail_harness import Run, mail_run
from tests.support import until

SCRIPTS = {"root.yaml": {"turns": [{"tool_calls": [{"name": "subagent", "arguments": {
    "action": "launch", "agent": "worker", "name": "w", "task": "w", "model": "scripted/idle.yaml"}}]}],
    "default": {"text": "noted"}}, "idle.yaml": {"default": {"text": "ok"}}}


def _quiet(run: Run) -> bool:
    nodes = [run.orch.tree.get(n) for n in ("root", "w")]
    return all(n is not None and n.status == "settled" and not run.orch.busy(n) for n in nodes) and not (
        run.ledger.undelivered("root"))


async def test_a_relaunch_waits_for_the_names_revive_and_the_new_node_keeps_the_names_lock() -> None:
    async with mail_run(SCRIPTS) as run:
        await until(lambda: _quiet(run) and not run.orch.hosted(run.node("w")), 20.0, "w settled and parked")
        old = run.node("w")
        lock = old.work.lock
        async with lock:  # a revive of w in progress (a mail, a notice, `legion resume`)
            relaunch = asyncio.ensure_future(run.launch("root", "w", "idle.yaml"))
            await until(lambda: lock._waiters, 10.0, "the relaunch waiting for w's lock")
            assert run.node("w") is old  # nothing of the new incarnation exists while the revive holds the name
        new = await asyncio.wait_for(relaunch, 30.0)
        assert new is not old and run.node("w") is new
        assert new.work is old.work and new.mail is old.mail and new.work.lock is lock
        await until(lambda: _quiet(run), 20.0, "the relaunched w settled and its result delivered")
        assert new.rounds == 2  # its first run's artifact was r1
