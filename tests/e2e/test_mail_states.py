"""Delivery by recipient state (docs/spec-conformance.md §6.2, docs/architecture.md §9.7).

Steer / follow-up / prompt / revive / PENDING while paused by session shutdown until resumed /
BOUNCED plus a bounce mail for a terminal recipient."""

from __future__ import annotations

from typing import Any

from tests.e2e.mail_harness import Run, delivered, mail_run
from tests.support import until


def _launch(name: str, script: str) -> dict[str, Any]:
    return {"name": "subagent", "arguments": {"action": "launch", "agent": "worker", "name": name, "task": name,
                                              "model": f"scripted/{script}"}}


SCRIPTS = {
    "root.yaml": {"turns": [{"tool_calls": [_launch("busy", "busy.yaml"), _launch("idle", "idle.yaml"),
                                            _launch("gone", "idle.yaml"), _launch("paused", "idle.yaml"),
                                            _launch("dead", "fail.yaml")]}],
                  "default": {"text": "noted"}},
    # busy until the test creates the gate file (a fixed delay would let a loaded machine outrun it)
    "busy.yaml": {"turns": [{"tool_calls": [{"name": "bash", "arguments": {
        "command": "while [ ! -e gate ]; do sleep 0.02; done"}}]}], "default": {"text": "ok"}},
    "idle.yaml": {"default": {"text": "ok"}},
    "fail.yaml": {"turns": [{"error": "boom"}], "default": {"error": "boom"}},
}


def _record_ops(run: Run) -> list[tuple[str, str]]:
    """Which session op carried each mail (the root's nodes.session_request, called through)."""
    ops: list[tuple[str, str]] = []
    real = run.root.nodes.session_request

    async def spy(node_id: str, op: str, **body: Any) -> dict[str, Any]:
        if "[legion mail #" in str(body.get("text", "")):
            ops.append((node_id, op))
        return await real(node_id, op, **body)

    run.root.nodes.session_request = spy  # type: ignore[method-assign]
    return ops


async def _send(run: Run, to: str, subject: str, urgency: str = "info") -> int:
    reply = await run.tool("root", "legion_mail", to=to, subject=subject, body=f"body of {subject}", urgency=urgency)
    assert reply["ok"], reply
    return int(reply["details"]["sent"][0]["id"])


def _state(run: Run, mid: int) -> str:
    return str(run.mail(id=mid)[0]["state"])


async def test_each_recipient_state_gets_its_delivery_method() -> None:
    async with mail_run(SCRIPTS) as run:
        ops = _record_ops(run)
        await until(lambda: run.orch.tree.get("busy") is not None and run.node("busy").live, 20.0, "busy running")
        steer = await _send(run, "busy", "urgent", "action-needed")
        follow = await _send(run, "busy", "fyi")
        await until(lambda: _state(run, steer) != "PENDING" and _state(run, follow) != "PENDING", 10.0,
                    "both handed over while busy runs")
        (run.cwd / "gate").touch()
        await until(lambda: all(run.orch.tree.get(n) and run.node(n).status in ("settled", "failed")
                                for n in ("idle", "gone", "paused", "dead")), 20.0, "the others settled")
        prompt = await _send(run, "idle", "summons")
        await delivered(run, [steer, follow, prompt])
        assert ("busy", "session.steer") in ops and ("busy", "session.follow_up") in ops
        assert ("idle", "session.prompt") in ops

        retired = await run.tool("root", "subagent", action="retire", name="gone")
        assert retired["ok"], retired
        await until(lambda: run.node("gone").status == "retired", 10.0, "gone retired")
        revived = await _send(run, "gone", "wake up")
        await delivered(run, [revived])  # resumed, the mail its first message
        texts = [m for m in _user_texts(run, "gone") if "[legion mail #" in m]
        assert len(texts) == 1 and f"#{revived}]" in texts[0]


async def test_paused_recipient_gets_its_mail_only_after_resume() -> None:
    async with mail_run(SCRIPTS) as run:
        await until(lambda: run.orch.tree.get("paused") is not None and run.node("paused").status == "settled",
                    20.0, "paused settled")
        await run.orch.retire_subtree(run.node("paused"), cause="session-shutdown")
        await until(lambda: run.node("paused").status == "retired", 10.0, "retired by session shutdown")
        mid = await _send(run, "paused", "while paused")
        sweeps = run.postman.sweeps
        await until(lambda: run.postman.sweeps >= sweeps + 3, 10.0, "three backstop sweeps")
        assert _state(run, mid) == "PENDING" and run.mail(id=mid)[0]["delivered_at"] is None
        resumed = await run.tool("root", "subagent", action="resume", name="paused")
        assert resumed["ok"], resumed
        await delivered(run, [mid])


async def test_terminal_recipient_bounces_with_a_bounce_mail() -> None:
    async with mail_run(SCRIPTS) as run:
        await until(lambda: run.orch.tree.get("dead") is not None and run.node("dead").status == "failed",
                    20.0, "dead failed")
        await until(lambda: run.orch.tree.get("idle") is not None and run.node("idle").status == "settled",
                    20.0, "idle settled")
        reply = await run.tool("idle", "legion_mail", to="dead", subject="are you there", body="?")
        assert reply["ok"], reply
        mid = int(reply["details"]["sent"][0]["id"])
        await until(lambda: _state(run, mid) == "BOUNCED", 10.0, "bounced")
        bounce = await until(lambda: run.mail(to_node="idle", from_node="dead"), 10.0, "the bounce mail")
        assert bounce[0]["subject"] == "Bounced: are you there" and bounce[0]["kind"] == "notice"
        await delivered(run, [int(bounce[0]["id"])])  # the sender is told, through its own inbox
        events = [e for e in run.ledger.events_after(0, limit=1000) if e.type == "mail_bounced"]
        assert [e.data["reason"] for e in events] == ["recipient_terminal"]


def _user_texts(run: Run, node: str) -> list[str]:
    from legion.workers.transcript import user_texts_last_turns

    return user_texts_last_turns(run.node(node).transcript, 100)


GATED = {
    "root.yaml": {"turns": [{"tool_calls": [_launch("w", "gated.yaml")]}], "default": {"text": "noted"}},
    # "GATE" starts a run that stays in its tool call until the test creates the gate file
    "gated.yaml": {"rules": [{"match": "^GATE", "on": "user", "reply": {"tool_calls": [
        {"name": "bash", "arguments": {"command": "while [ ! -e gate ]; do sleep 0.02; done"}}]}}],
        "default": {"text": "ok"}},
}


async def test_a_summons_queued_behind_a_concurrent_revive_still_reaches_the_session() -> None:
    """A mail for a parked node whose revive waits behind another revive of it (a notice, a continue) that
    leaves it running: the mail is queued into the running session, never accepted and dropped."""
    async with mail_run(GATED) as run:
        await until(lambda: run.orch.tree.get("w") is not None and run.node("w").status == "settled"
                    and not run.orch.hosted(run.node("w")), 20.0, "w settled and parked")
        w = run.node("w")
        lock = w.work.lock
        async with lock:  # the other revive, made deterministic: it holds the node's revive lock
            mid = await _send(run, "w", "summons")
            await until(lambda: lock._waiters, 10.0, "the postman's revive waiting for the lock")
            assert await run.orch._revive(w, "GATE: hold on") == "accepted"
            assert w.live
        await until(lambda: _state(run, mid) == "ACCEPTED", 10.0, "the mail handed over")
        assert w.live  # still in its gated tool call: the mail could only have been queued
        (run.cwd / "gate").touch()
        await delivered(run, [mid])
        assert sum(f"[legion mail #{mid}]" in t for t in _user_texts(run, "w")) == 1
