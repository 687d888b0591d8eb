"""The postman's backstop sweep never holds up event-driven delivery.

docs/spec-conformance.md §6.5, docs/architecture.md §9.6: a sweep whose completion-notice safety net waits on a slow
hand-over runs beside the wake-ups, not in front of them."""

from __future__ import annotations

from tests.e2e.mail_harness import mail_run
from tests.support import until


def _launch(name: str) -> dict[str, object]:
    return {"name": "subagent", "arguments": {"action": "launch", "agent": "worker", "name": name, "task": name,
                                              "model": "scripted/idle.yaml"}}


SCRIPTS = {"root.yaml": {"turns": [{"tool_calls": [_launch("b"), _launch("c")]}], "default": {"text": "noted"}},
           "idle.yaml": {"default": {"text": "ok"}}}


async def test_a_sweep_held_up_by_a_notice_hand_over_does_not_stop_woken_delivery() -> None:
    async with mail_run(SCRIPTS) as run:
        await until(lambda: all(run.orch.tree.get(n) is not None and run.node(n).status == "settled"
                                and not run.orch.busy(run.node(n)) for n in ("root", "b", "c"))
                    and not run.ledger.undelivered("root"), 20.0, "the tree settled, every notice delivered")
        lock = run.node("root").work.lock
        async with lock:  # a slow hand-over to the root (a relaunch waiting for a pool slot, a hung prompt)
            # a result owed to the idle root: only the sweep's safety net delivers it, and it waits on the lock
            await run.orch.ctx.write(lambda led: led.write_artifact(run.run_dir, node_id="c", name="c", round=99,
                                                                    text="late result"))
            await until(lambda: lock._waiters, 10.0, "the sweep's notice to the root waiting for its revive")
            reply = await run.tool("b", "legion_mail", to="c", subject="meanwhile", body="hello")
            assert reply["ok"], reply
            mid = int(reply["details"]["sent"][0]["id"])
            await until(lambda: run.mail(id=mid)[0]["state"] != "PENDING", 10.0, "the mail to c handed over")
        await until(lambda: not run.ledger.undelivered("root"), 10.0, "the notice delivered once the root is free")
