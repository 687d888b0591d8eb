"""OBSOLETE (docs/spec-conformance.md §6.3, frozen): only a `notice` whose subject starts `Phase timeout:`, whose sender's
phase/phase_since moved on (or the sender ended) since the generating `phase_timeout` event; checked before
delivery (never injected) and at confirmation (a label change); DELIVERED beats OBSOLETE."""

from __future__ import annotations

from typing import Any

from legion.ledger.ledger import Ledger
from legion.orchestration.postman import format_mail, system_send
from legion.workers.transcript import user_texts_last_turns
from tests.e2e.mail_harness import Run, delivered, mail_run
from tests.support import until


def _launch(name: str, script: str) -> dict[str, Any]:
    return {"name": "subagent", "arguments": {"action": "launch", "agent": "worker", "name": name, "task": name,
                                              "model": f"scripted/{script}"}}


SCRIPTS = {
    "root.yaml": {"turns": [{"tool_calls": [_launch("cen", "long.yaml"), _launch("slow", "slow.yaml")]}],
                  "default": {"text": "noted"}},
    "long.yaml": {"turns": [{"text": "phase work", "delay_ms": 60_000}], "default": {"text": "ok"}},
    "slow.yaml": {"turns": [{"text": "busy", "delay_ms": 60_000}], "default": {"text": "ok"}},
}


async def _phase(run: Run, phase: str, since: int, *, timeout_event: bool = False) -> None:
    def write(led: Ledger) -> None:
        led.update_node("cen", phase=phase, phase_since=since)
        if timeout_event:
            led.append_event("cen", "phase_timeout", {"phase": phase, "phaseSince": since})

    await run.orch.ctx.write(write)


async def _notice(run: Run, to: str, subject: str = "Phase timeout: implementing", kind: str = "notice") -> int:
    sent = await run.orch.ctx.write(lambda led: system_send(led, "cen", to, subject, "over time", kind=kind))
    run.postman.wake(to)
    return sent.id


async def _ready(run: Run) -> None:
    await until(lambda: all(run.orch.tree.get(n) is not None for n in ("cen", "slow"))
                and run.node("cen").live and run.node("slow").live and run.node("root").status == "settled",
                20.0, "cen and slow running, root idle")
    await _phase(run, "implementing", 1000, timeout_event=True)


def _state(run: Run, mid: int) -> str:
    return str(run.mail(id=mid)[0]["state"])


async def test_stale_before_delivery_is_never_injected() -> None:
    async with mail_run(SCRIPTS) as run:
        await _ready(run)
        await _phase(run, "implementing", 2000)  # the same phase re-entered: phase_since moved (docs/spec-conformance.md §10 item 17)
        stale = await _notice(run, "root")
        await until(lambda: _state(run, stale) == "OBSOLETE", 10.0, "obsolete before delivery")
        assert not any("[legion mail #" in t for t in user_texts_last_turns(run.node("root").transcript))
        bounced = [e.data for e in run.ledger.events_after(0, limit=1000) if e.type == "mail_bounced"]
        assert bounced == [{"message_id": stale, "from": "cen", "to": "root", "reason": "obsolete_after_phase_change"}]
        # never for other kinds, nor for a notice with another subject
        report = await _notice(run, "root", kind="report")
        stall = await _notice(run, "root", subject="Stall: cen silent")
        await delivered(run, [report, stall])


async def test_stale_at_confirmation_changes_the_label_only() -> None:
    async with mail_run(SCRIPTS) as run:
        await _ready(run)
        mid = await _notice(run, "slow")  # running: queued as a follow-up, not consumed for a minute
        await until(lambda: _state(run, mid) == "ACCEPTED", 10.0, "accepted")
        await _phase(run, "reviewing", 3000)
        await until(lambda: _state(run, mid) == "OBSOLETE", 10.0, "obsolete at confirmation")


async def test_delivered_beats_obsolete() -> None:
    async with mail_run(SCRIPTS, interval=600.0) as run:  # no sweep: confirmation runs when the test says
        run.postman._confirm_soon = lambda node_id: None  # type: ignore[method-assign]  # nor after a turn
        await _ready(run)
        mid = await _notice(run, "root")  # idle: prompted, the envelope is a user message at once
        await until(lambda: _state(run, mid) == "ACCEPTED", 10.0, "accepted")
        row = run.mail(id=mid)[0]
        await until(lambda: format_mail(row) in user_texts_last_turns(run.node("root").transcript), 10.0, "seen")
        await _phase(run, "reviewing", 3000)
        assert await run.postman.confirm() == 1
        assert _state(run, mid) == "DELIVERED"
