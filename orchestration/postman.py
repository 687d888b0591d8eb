"""The postman: mail delivery, confirmation and stall notices.

docs/spec-conformance.md §6.2–§6.6, §6.8; docs/architecture.md §9.6–§9.8.

Event-driven: a send, a session becoming idle or settling, a launch or a resume wakes delivery for exactly
the recipients concerned, so mail reaches an idle recipient within milliseconds. A slow sweep
(`POSTMAN_INTERVAL_S`, 2 s) is the backstop, in docs/spec-conformance.md §6.5's order: stall detection, confirmation,
delivery to every recipient with PENDING mail (children and the root), the completion-notice safety net,
the held-notices health count, the runtime orphan scan (phase timeouts belong to the phase layer; usage is polled by the orchestrator).

Delivery by recipient state (§6.2, docs/architecture.md §9.7), every delivery claiming its lease first (the
lease excludes wait/collect preemption and any other process): running → `steer` (urgency `action-needed`)
or `follow_up` (`info`); idle/settled and hosted → `prompt`; retired (not paused) or no longer hosted →
revive, the mail its first message; paused by session shutdown, or still starting → stays PENDING; terminal
→ BOUNCED plus a bounce mail to the sender. The text injected is `format_mail(row)`, the `[legion mail #id]`
envelope the confirmation looks for (exact match among the recipient's last 20 turns).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

from legion.bus.protocol import AGENT_SETTLED, TOOL_CALL, TURN_START
from legion.ledger.constants import (
    MAIL_DELIVERY_CLAIM_LEASE_MS,
    NODE_ABANDONED,
    NODE_LAUNCHED,
    NODE_RESUMED,
    OPERATOR_NODE,
    ORPHAN_DETECTED,
    PHASE_TIMEOUT,
    Delivery,
)
from legion.ledger.delivery_rules import is_phase_timeout_notice, is_terminal, obsolete_reason
from legion.ledger.errors import DeliveryClaimLostError, LedgerUnreachable
from legion.ledger.ledger import Ledger
from legion.ledger.mail import MailSent
from legion.ledger.writer import background_task
from legion.orchestration.agent_tree import AgentNode, Hold, MailState, StallTrack
from legion.orchestration.stall import Activity, StallConfig, decide
from legion.supervision.lifecycle import SESSION_SHUTDOWN
from legion.workers.session_service import NO_SESSION
from legion.workers.transcript import user_texts_last_turns

if TYPE_CHECKING:
    from legion.orchestration.orchestrator import Orchestrator

POSTMAN_INTERVAL_S = 2.0
CONFIRM_PER_RECIPIENT = 20  # mails checked per recipient per sweep (a rotating cursor covers the rest)
ACCEPTED_SCAN = 10_000  # ACCEPTED mail rows a sweep reads to find the recipients to confirm (oldest first)
TURN_WINDOW = 20  # MAIL_DELIVERY_TURN_WINDOW
CONFIRM_DEBOUNCE_S = 0.25  # a busy recipient is confirmed at most this often between sweeps
DELIVERY_BATCH = 100
OPERATOR_SENDER = OPERATOR_NODE  # the ledger row that stands for the operator as a mail sender
BOUNCE_PREFIX = "Bounced: "
REDELIVERED_PREFIX = "Redelivered: "
SUBJECT_MAX = 256

def format_mail(row: dict[str, Any]) -> str:
    """The envelope injected into the recipient: the only form the DELIVERED criterion matches."""
    kind = row.get("kind") or "mail"
    head = f"{_envelope(int(row['id']))} from {row['from_node']} ({kind}, {row.get('urgency') or 'info'})"
    reply = "" if str(row["from_node"]).startswith("@") else f"\n(reply with legion_mail to '{row['from_node']}')"
    return f"{head}\nSubject: {row['subject']}{reply}\n\n{row['body']}"


def system_send(led: Ledger, from_node: str, to_node: str, subject: str, body: str, *,
                kind: str | None = "notice", urgency: str = "info") -> MailSent:
    """A mail legion writes on a node's behalf (bounce, stall notice, redelivery): it does not use the
    node's rate quota (docs/spec-conformance.md §6.6). Runs on the writer thread, which serialises every send."""
    quota = led._mail_rate_per_5_min
    led._mail_rate_per_5_min = 1 << 30
    try:
        return led.send_mail(from_node, to_node, _cap(subject), body, kind=kind, urgency=urgency)
    finally:
        led._mail_rate_per_5_min = quota


def _cap(subject: str) -> str:
    raw = subject.encode("utf-8")
    return subject if len(raw) <= SUBJECT_MAX else raw[: SUBJECT_MAX - 3].decode("utf-8", "ignore") + "…"


class Postman:
    """Delivers, confirms and obsoletes the mail of one run; sends stall notices to parents.

    What it knows of one recipient lives on the recipient's node (`AgentNode.mail`); its own state is the run's
    queue of recipients to wake (`_dirty`) and its tasks."""

    def __init__(self, orch: Orchestrator, *, interval: float = POSTMAN_INTERVAL_S,
                 clock: Callable[[], float] = time.time, stall: StallConfig | None = None,
                 lease_ms: int = MAIL_DELIVERY_CLAIM_LEASE_MS) -> None:
        self.orch = orch
        self.ctx = orch.ctx
        self.interval = interval
        self.lease_ms = lease_ms  # a lease older than this is a crashed deliverer's: claimed again
        self.clock = clock
        limits = orch.ctx.settings.legion
        # the run's stall thresholds (`legion.silenceNoticeMs`, `legion.loopNoticeMs`); a role's card may set its own
        # L2 radius (`_stall_config`)
        self.stall_config = stall or StallConfig(silence_ms=limits.silence_notice_ms, radius_ms=limits.loop_notice_ms)
        self._radii: dict[str, StallConfig] = {}  # by role: the run's config with the card's `loopNoticeMs`
        self.orphan_stale_ms = limits.orphan_stale_ms
        self.mail_rate = limits.mail_rate_per_5min
        self.sweeps = 0
        self.counts = {"accepted": 0, "bounced": 0, "obsolete": 0, "delivered": 0, "stall": 0, "redelivered": 0,
                       "handover_failed": 0, "recovered": 0}
        self._recovering: set[int] = set()  # ACCEPTED mail being handed over again (`_recover`)
        self._wake = asyncio.Event()
        self._dirty: set[str] = set()  # recipients woken since the loop last looked (a queue, not a node's state)
        self._task: asyncio.Task[None] | None = None
        self._sweeping = False  # a backstop sweep is running (as its own task)
        self._next_sweep = 0.0
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self.swept = asyncio.Event()  # set after every sweep (tests and the benchmark wait on it)

    # ----- wiring -------------------------------------------------------------------------------
    def start(self) -> Postman:
        orch = self.orch
        orch.subscribe("status", self._on_status)
        orch.subscribe("settled", lambda node: self.wake(node.id))
        orch.subscribe("launched", self._on_launched)
        orch.root.subscribe_sessions(self._on_session_event)  # after the orchestrator's own subscription
        orch.attach(mail=self)  # the mail handlers (`legion_mail`, wait/collect) reach it through `orch.mail`
        with contextlib.suppress(Exception):  # (an outage: the first hook that asks reads it instead)
            self.ctx.ledger.addressed()  # the book's one read, here rather than in the first hook that asks
        self._task = asyncio.ensure_future(self._run())
        self._task.set_name("postman")
        return self

    async def close(self) -> None:
        self.orch.detach(self)
        self._closed = True  # (3.11's wait_for may swallow a cancel that races its wake-up: the loop checks)
        self._wake.set()
        tasks = [t for t in (self._task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    def wake(self, *node_ids: str) -> None:
        """Deliver to these recipients now (a send, a settle, an idle session, a resume)."""
        self._dirty.update(node_ids)
        self._wake.set()

    # ----- hooks (quick, never raise) ----------------------------------------------------------------
    def _on_status(self, node: AgentNode, status: str, event: str | None, data: dict[str, Any]) -> None:
        now = self._now_ms()
        book = node.mail
        if status == "retired" and data.get("reason") == SESSION_SHUTDOWN:
            book.paused = True
        elif status in ("starting", "running"):
            book.paused = False
        track = book.track
        if not node.live:
            book.track = None  # its next run opens a new window at its first session event
        elif track is not None and status == "running" and event is not None:  # (re)launched or resumed
            # a new window, keeping the tools in flight: the status lands through the ledger writer, so it
            # can come after this run's first session events (a tool already started: not silent)
            book.track = StallTrack(run_started_ms=now, last_event_ms=now, tools=track.tools)
        if status != "starting":
            self.wake(node.id)
        if _relaunched(event, data) and not self._closed and self._may_have_mail(node.id):
            # what its dead incarnation accepted, taken now: mail accepted after this is the new incarnation's
            accepted = self.ctx.ledger.messages_in_state(Delivery.ACCEPTED, to_node=node.id, limit=DELIVERY_BATCH)
            if accepted:
                self._spawn(self._recover(node.id, accepted), f"recover:{node.id}")

    def _on_launched(self, node: AgentNode) -> None:
        node.mail.paused = False
        self.wake(node.id)

    def _on_session_event(self, worker_id: str, name: str, body: dict[str, Any]) -> None:
        node_id = body.get("nodeId") if isinstance(body.get("nodeId"), str) else worker_id
        node = self.orch.tree.get(str(node_id))
        if node is None:  # not an agent of this run (a pool's own event): no mail, no stall window
            return
        if name in (TURN_START, AGENT_SETTLED) and not self._closed:
            self._confirm_soon(node)
        if name == AGENT_SETTLED:
            node.mail.queued.clear()  # a settled session has consumed (or an abort cleared) what was queued
        now = self._now_ms()
        track = node.mail.track
        if track is None:
            if name not in (TURN_START, TOOL_CALL):
                return
            track = node.mail.track = StallTrack(run_started_ms=now, last_event_ms=now)
        track.last_event_ms = now
        if name == TURN_START:  # no tool of an earlier turn (or a dead incarnation) is in flight any more
            track.tools.clear()
        elif name == TOOL_CALL:
            call = str(body.get("id"))
            if body.get("phase") == "start":
                track.tools[call] = (str(body.get("tool") or "tool"), now)
            else:
                track.tools.pop(call, None)
        elif name == AGENT_SETTLED:
            track.tools.clear()

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    # ----- the loop ---------------------------------------------------------------------------------
    async def _run(self) -> None:
        """Dispatch wake-ups at once; start a backstop sweep every interval. A sweep runs beside the loop, never
        in it: one slow hand-over inside it (a notice to a parent whose revive waits for a pool slot, a hung
        prompt) must not hold up every other recipient's delivery."""
        self._next_sweep = time.monotonic() + self.interval
        while not self._closed:
            timeout = None if self._sweeping else max(0.0, self._next_sweep - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            if self._closed:
                return
            dirty, self._dirty = self._dirty, set()
            for node_id in dirty:
                self._kick(node_id)
            if not self._sweeping and time.monotonic() >= self._next_sweep:
                self._sweeping = True  # one sweep at a time; the next one is due an interval after it ends
                self._spawn(self._backstop(), "postman:sweep")

    async def _backstop(self) -> None:
        try:
            await self.sweep()
        except LedgerUnreachable as exc:  # an outage: the next sweep tries again
            logger.warning("postman sweep not done: {}", exc)
        except Exception as exc:  # the backstop never dies of one bad sweep
            logger.opt(exception=exc).error("postman sweep failed")
        finally:
            self._sweeping = False
            self._next_sweep = time.monotonic() + self.interval
            self._wake.set()

    def _kick(self, node_id: str) -> None:
        node = self.orch.tree.get(node_id)
        if node is None:  # not (or no longer) a node of this run: nothing to deliver to
            return
        book = node.mail
        if book.delivering:
            book.again = True
            return
        book.delivering = True
        task = background_task(self._deliver_loop(node_id, book))
        task.set_name(f"postman:{node_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver_loop(self, node_id: str, book: MailState) -> None:
        try:
            while True:
                book.again = False
                try:
                    await self.deliver(node_id)
                except Exception as exc:  # retried at the next wake or sweep: the mail is still PENDING
                    logger.warning("mail delivery to {} failed: {!r}", node_id, exc)
                if not book.again:
                    return
        finally:
            book.delivering = False

    async def sweep(self) -> None:
        """The backstop, in docs/spec-conformance.md §6.5's order."""
        self.stall_sweep()
        await self.confirm()
        for node_id in self._pending_recipients():
            self._kick(node_id)
        await self._notice_safety_net()
        self.orch.count_held_notices(self._now_ms())
        await self.orphan_scan()
        self.sweeps += 1
        self.swept.set()
        self.swept = asyncio.Event()

    def _pending_recipients(self) -> list[str]:
        rows = self.ctx.ledger.messages_in_state(Delivery.PENDING, limit=10_000)
        seen: dict[str, None] = {}
        for row in rows:
            seen.setdefault(str(row["to_node"]))
        self.ctx.ledger.note_addressed(seen)  # mail another process wrote: delivered from now on like our own
        return [n for n in seen if n in self.orch.tree]

    def _may_have_mail(self, node_id: str) -> bool:
        """False when no mail was ever addressed to the node (`Ledger.addressed`: no read per wake, settle or turn
        of the many nodes that never get mail); the sweep's reads find what another process wrote. Never raises
        (the session-event hooks ask): a book that cannot be read yet means "ask the ledger"."""
        try:
            addressed = self.ctx.ledger.addressed()
        except Exception:  # its first read failed (an outage): read as before; a later call reads it again
            return True
        return addressed is None or node_id in addressed

    # ----- delivery -----------------------------------------------------------------------------------
    async def deliver(self, node_id: str) -> int:
        """Deliver what `node_id` has PENDING, oldest first; returns how many were handed over."""
        node = self.orch.tree.get(node_id)
        if node is None or not self._may_have_mail(node_id):
            return 0
        handed = 0
        for row in self.ctx.ledger.pending_inbox(node_id, limit=DELIVERY_BATCH):
            hold = node.mail.hold
            if hold is not None:  # a blocked wait/collect takes it into its tool result
                hold.arrived.set()
                return handed
            if await self._deliver_one(node, row):
                handed += 1
        return handed

    def _state(self, node: AgentNode) -> str:
        row = self.ctx.ledger.get_node(node.id)
        if is_terminal(row):
            return "terminal"
        if node.status == "retired" and node.mail.paused:
            return "paused"
        if node.status == "starting":
            return "starting"
        if node.live:
            return "running"
        if node.status == "settled" and self.orch.hosted(node):
            return "idle"
        return "revive"

    async def _deliver_one(self, node: AgentNode, row: dict[str, Any]) -> bool:
        mid = int(row["id"])
        if await self._discard_if_stale(row):
            return False
        state = self._state(node)
        if state in ("paused", "starting"):
            return False  # woken again when it runs (or when the run is resumed)
        token = await self.ctx.write(lambda led: led.claim_for_delivery(mid, lease_ms=self.lease_ms))
        if token is None:
            return False  # another deliverer holds it
        state = self._state(node)  # again: during the claim the recipient may have been parked (then revive it)
        if state in ("paused", "starting"):
            await self.ctx.write(lambda led: led.release_delivery_claim(mid, token))
            return False
        if state == "terminal":
            await self._bounce(row, token, "recipient_terminal")
            return False
        text = format_mail(row)
        try:
            disposition = await self._hand_over(node, state, row, text)
        except Exception as exc:
            await self.ctx.write(lambda led: led.release_delivery_claim(mid, token))
            self.counts["handover_failed"] += 1
            logger.warning("mail #{} to {} not handed over ({}): {!r}", mid, node.id, state, exc)
            return False
        if disposition == "intercepted":
            await self._bounce(row, token, "intercepted_by_input_handler")
            return False
        try:
            stored = await self.ctx.write(lambda led: led.transition_delivery(mid, Delivery.ACCEPTED, token=token,
                                                                                   lease_ms=self.lease_ms))
        except DeliveryClaimLostError as exc:  # handed over, but the lease lapsed: it may come again (a duplicate)
            logger.warning("mail #{}: {}", mid, exc)
            return True
        self.counts["accepted" if stored == Delivery.ACCEPTED else "bounced"] += 1
        if disposition == "queued" and state == "running":
            self._queued(node, row)
        return True

    def _queued(self, node: AgentNode, row: dict[str, Any]) -> None:
        """A mail waits in the running session's queue for its next boundary. A wait/collect that began meanwhile
        would hold that boundary off until it returns: the blocking call takes the mail back into its result."""
        book = node.mail
        book.queued[int(row["id"])] = row
        if book.hold is not None:
            book.hold.reclaim = True
            book.hold.arrived.set()

    async def _hand_over(self, node: AgentNode, state: str, row: dict[str, Any], text: str) -> str:
        root = self.orch.root
        if state == "running":
            op = "session.steer" if row.get("urgency") == "action-needed" else "session.follow_up"
            reply = await root.session_request(node.id, op, text=text)
        elif state == "idle":
            reply = await root.session_request(node.id, "session.prompt", text=text)
            if reply.get("code") == NO_SESSION:  # its host lost it (a restarted pool): revive it with the mail
                return await self.orch.revive(node, text)
        else:  # mail is a summons: the resumed session's first message is the mail
            return await self.orch.revive(node, text)
        if not reply.get("ok"):
            raise RuntimeError(f"{reply.get('code') or ''} {reply.get('error') or reply.get('text')}".strip())
        return str(reply.get("disposition") or "accepted")

    async def _bounce(self, row: dict[str, Any], token: int, reason: str) -> None:
        mid, sender, recipient = int(row["id"]), str(row["from_node"]), str(row["to_node"])
        bounce_back = (sender in self.orch.tree and not str(row["subject"]).startswith(BOUNCE_PREFIX))

        def write(led: Ledger) -> None:
            led.transition_delivery(mid, Delivery.BOUNCED, token=token, reason=reason, lease_ms=self.lease_ms)
            if bounce_back:
                system_send(led, recipient, sender, f"{BOUNCE_PREFIX}{row['subject']}",
                            f"Your mail #{mid} to '{recipient}' was not delivered: {reason.replace('_', ' ')}. "
                            f"'{recipient}' can never take mail again; act without it or tell your parent.")

        try:
            await self.ctx.write(write)
        except DeliveryClaimLostError as exc:
            logger.warning("mail #{} bounce: {}", mid, exc)
            return
        self.counts["bounced"] += 1
        if bounce_back:
            self.wake(sender)
        self._mail_gone()

    async def _discard_if_stale(self, row: dict[str, Any]) -> bool:
        """PENDING → OBSOLETE for a phase-timeout notice whose phase is over (never injected)."""
        reason = self._obsolete(row)
        if reason is None:
            return False
        mid = int(row["id"])
        await self.ctx.write(lambda led: led.transition_delivery(mid, Delivery.OBSOLETE, reason=reason))
        self.counts["obsolete"] += 1
        self._mail_gone()
        return True

    def _obsolete(self, row: dict[str, Any]) -> str | None:
        if not is_phase_timeout_notice(row):
            return None
        sender = self.ctx.ledger.get_node(str(row["from_node"]))
        phase, since = _generating_phase(self.ctx.ledger, str(row["from_node"]), int(row["created_at"]))
        return obsolete_reason(row, sender, phase, since)

    # ----- crash recovery (docs/spec-conformance.md §6.3: may duplicate, never lose) ------------------------------
    async def _recover(self, node_id: str, accepted: list[dict[str, Any]]) -> int:
        """Hand over again the mail a dead incarnation of `node_id` accepted but never recorded: its host died
        between the hand-over (a queued steer or follow-up, a tool result in the making) and the transcript write.
        The relaunched session continues from its transcript, so a mail absent from it was never seen; the same
        envelope goes in again and its confirmation moves it to DELIVERED. Returns how many went in again."""
        node = self.orch.tree.get(node_id)
        if node is None:
            return 0
        try:
            text = await asyncio.to_thread(_read_text, node.transcript)
        except OSError as exc:  # nothing to compare with: handing over again risks only a duplicate
            logger.warning("transcript of {} unreadable for mail recovery: {!r}", node_id, exc)
            text = ""
        lost = [row for row in accepted if _envelope(int(row["id"])) not in text and int(row["id"]) not in self._recovering]
        ids = {int(row["id"]) for row in lost}
        self._recovering |= ids  # (a revive below relaunches it again: that recovery must not take these too)
        again = 0
        try:
            for row in lost:
                mid, state = int(row["id"]), self._state(node)
                if state in ("paused", "starting", "terminal"):
                    # (paused or starting: its next relaunch recovers it; terminal: nothing can take it any more)
                    logger.warning("mail #{} to {} was lost with its host and cannot go in again ({})", mid, node_id,
                                   state)
                    break
                try:
                    if await self._hand_over(node, state, row, format_mail(row)) == "queued" and state == "running":
                        self._queued(node, row)
                    again += 1
                    logger.info("mail #{} to {} went in again: its host died before recording it", mid, node_id)
                except Exception as exc:  # stays ACCEPTED: the next relaunch of its recipient tries again
                    logger.warning("mail #{} to {} not handed over again ({}): {!r}", mid, node_id, state, exc)
        finally:
            self._recovering -= ids
        self.counts["recovered"] += again
        return again

    # ----- confirmation -------------------------------------------------------------------------------
    async def confirm(self) -> int:
        """ACCEPTED → DELIVERED on an exact envelope match in the recipient's last 20 turns (DELIVERED beats
        OBSOLETE); ≤ 20 mails per recipient per sweep, a rotating cursor per recipient."""
        confirmed = 0
        # only recipients with ACCEPTED mail: one read for the run, not one per node of a 1,000-node tree per sweep
        waiting = dict.fromkeys(str(row["to_node"]) for row in
                                self.ctx.ledger.messages_in_state(Delivery.ACCEPTED, limit=ACCEPTED_SCAN))
        self.ctx.ledger.note_addressed(waiting)
        for node_id in waiting:
            node = self.orch.tree.get(node_id)
            if node is not None:
                confirmed += await self.confirm_node(node)
        return confirmed

    async def confirm_node(self, node: AgentNode) -> int:
        book = node.mail
        if book.confirming:  # one confirmation per recipient at a time (a sweep and an event)
            return 0
        book.confirming = True
        try:
            return await self._confirm_node(node)
        finally:
            book.confirming = False

    async def _confirm_node(self, node: AgentNode) -> int:
        if not self._may_have_mail(node.id):
            return 0
        rows = self.ctx.ledger.messages_in_state(Delivery.ACCEPTED, to_node=node.id, after_id=node.mail.cursor,
                                                 limit=CONFIRM_PER_RECIPIENT)
        node.mail.cursor = int(rows[-1]["id"]) if len(rows) == CONFIRM_PER_RECIPIENT else 0
        return await self._confirm_rows(node, rows) if rows else 0

    def _confirm_soon(self, node: AgentNode) -> None:
        """A recipient consumed input (a turn started, or it settled): confirm while the mail is still inside
        its last 20 turns (a busy inbox can push it out before the next sweep)."""
        book, node_id = node.mail, node.id
        if book.confirm_due or not self._may_have_mail(node_id):  # (mail handed over later: its own turn confirms it)
            return
        book.confirm_due = True

        async def later() -> None:
            try:
                await asyncio.sleep(CONFIRM_DEBOUNCE_S)
                current = self.orch.tree.get(node_id)  # (launched again meanwhile: its new incarnation)
                if current is not None:
                    await self.confirm_node(current)
            finally:
                book.confirm_due = False

        self._spawn(later(), f"confirm:{node_id}")

    async def _confirm_rows(self, node: AgentNode, rows: list[dict[str, Any]]) -> int:
        try:
            seen = set(await asyncio.to_thread(user_texts_last_turns, node.transcript, TURN_WINDOW))
        except Exception as exc:  # an unreadable transcript confirms nothing (the mail stays ACCEPTED)
            logger.debug("transcript of {} unreadable for confirmation: {!r}", node.id, exc)
            seen = set()
        moves: list[tuple[int, Delivery, str | None]] = []
        for row in rows:
            if format_mail(row) in seen:
                moves.append((int(row["id"]), Delivery.DELIVERED, None))
            elif (reason := self._obsolete(row)) is not None:
                moves.append((int(row["id"]), Delivery.OBSOLETE, reason))
        if moves:
            await self.ctx.write(lambda led: [led.transition_delivery(i, t, reason=r) for i, t, r in moves])
        delivered = sum(1 for _, t, _ in moves if t == Delivery.DELIVERED)
        for mid, _, _ in moves:
            node.mail.queued.pop(mid, None)
        self.counts["delivered"] += delivered
        self.counts["obsolete"] += len(moves) - delivered
        if moves:
            self._mail_gone()
        return delivered

    def _mail_gone(self) -> None:
        """Mail left PENDING/ACCEPTED for good (bounced, obsolete, confirmed): PENDING mail holds its
        run open (`Orchestrator._check_done`), so the run may end now."""
        self.orch._check_done()

    # ----- wait/collect preemption (docs/spec-conformance.md §6.6) -----------------------------------------------------
    @contextlib.contextmanager
    def hold(self, node_id: str) -> Iterator[Hold]:
        """Freeze delivery to `node_id` while it is blocked; released on every exit path."""
        hold = Hold(node_id)
        node = self.orch.tree.get(node_id)
        book = node.mail if node is not None else None  # (not a node of this run: there is no mail to hold)
        if book is not None:
            book.hold = hold
        try:
            yield hold
        finally:
            if book is not None and book.hold is hold:
                book.hold = None
            self.wake(node_id)  # anything that arrived at the very end goes the normal way

    async def withdraw(self, node_id: str) -> list[dict[str, Any]]:
        """Take back the mail queued in `node_id`'s session and not consumed yet (it blocked in wait/collect right
        after the hand-over), for the blocking call's result; it stays ACCEPTED, as mail taken by `take` does."""
        node = self.orch.tree.get(node_id)
        if node is None or not node.mail.queued:
            return []
        rows = list(node.mail.queued.values())
        try:
            reply = await self.orch.root.session_request(node_id, "session.withdraw",
                                                         texts=[format_mail(row) for row in rows])
        except Exception as exc:  # nothing taken back: the mail goes in at the session's next boundary
            logger.warning("mail queued in {} not taken back for its wait: {!r}", node_id, exc)
            return []
        withdrawn = set(reply.get("withdrawn") or []) if reply.get("ok") else set()
        for row in rows:
            node.mail.queued.pop(int(row["id"]), None)  # taken back, or consumed already: not queued any more
        return [row for row in rows if format_mail(row) in withdrawn]

    async def take(self, node_id: str, limit: int = DELIVERY_BATCH) -> list[dict[str, Any]]:
        """Claim the PENDING mail of `node_id` (≤ limit) and mark it ACCEPTED: it goes into a tool result."""
        taken: list[dict[str, Any]] = []
        if not self._may_have_mail(node_id):
            return taken
        for row in self.ctx.ledger.pending_inbox(node_id, limit=limit):
            if await self._discard_if_stale(row):
                continue
            mid = int(row["id"])

            def claim(led: Ledger, mid: int = mid) -> Delivery | None:
                token = led.claim_for_delivery(mid, lease_ms=self.lease_ms)
                if token is None:
                    return None
                return led.transition_delivery(mid, Delivery.ACCEPTED, token=token, lease_ms=self.lease_ms)

            stored = await self.ctx.write(claim)
            if stored == Delivery.ACCEPTED:
                taken.append(row)
                self.counts["accepted"] += 1
        return taken

    async def redeliver(self, rows: list[dict[str, Any]]) -> None:
        """A tool result carrying these mails was discarded: queue each again, `Redelivered: ` (no quota)."""
        def write(led: Ledger) -> list[str]:
            for row in rows:
                system_send(led, str(row["from_node"]), str(row["to_node"]), f"{REDELIVERED_PREFIX}{row['subject']}",
                            str(row["body"]), kind=row.get("kind"), urgency=str(row.get("urgency") or "info"))
            return [str(row["to_node"]) for row in rows]

        if rows:
            self.wake(*await self.ctx.write(write))
            self.counts["redelivered"] += len(rows)

    # ----- stall notices (docs/spec-conformance.md §6.8) ----------------------------------------------------------------
    def stall_sweep(self) -> int:
        """One decision per live child with a parent; notices go to the parent as `notice` mail."""
        now = self._now_ms()
        notices: list[tuple[str, str, str, str]] = []
        for node in self.orch.tree:
            track = node.mail.track
            if track is None or not node.live or node.parent is None or node.parent not in self.orch.tree:
                continue
            if node.blocked_on is not None:  # silent because it waits on its parent's answer (its notice said so)
                continue
            act = Activity(last_event_ms=track.last_event_ms, run_started_ms=track.run_started_ms,
                           tools=tuple(track.tools.values()))
            notice, track.stall = decide(node.id, now, act, track.stall, self._stall_config(node.role))
            if notice is not None:
                notices.append((node.id, node.parent, notice.subject, notice.text))
        if notices:
            self.counts["stall"] += len(notices)
            self._spawn(self._send_notices(notices), "stall-notices")
        return len(notices)

    def _stall_config(self, role: str) -> StallConfig:
        """The run's thresholds with the L2 radius of the role's card (`loopNoticeMs`, or its agentOverrides entry),
        when it names one."""
        config = self._radii.get(role)
        if config is None:
            card = self.ctx.catalog.cards.get(role)
            radius = card.loop_notice_ms if card is not None else None
            config = self.stall_config if radius is None else replace(self.stall_config, radius_ms=radius)
            self._radii[role] = config
        return config

    async def _send_notices(self, notices: list[tuple[str, str, str, str]]) -> None:
        def write(led: Ledger) -> None:
            for child, parent, subject, text in notices:
                system_send(led, child, parent, subject, text, kind="notice")

        try:
            await self.ctx.write(write)
        except Exception as exc:
            logger.warning("stall notices not sent: {!r}", exc)
            return
        self.wake(*(parent for _, parent, _, _ in notices))

    # ----- safety nets ---------------------------------------------------------------------------------
    async def _notice_safety_net(self) -> None:
        """Completion notices still owed to an idle parent (the orchestrator's outbox) get another try."""
        for node in self.orch.tree:
            if (not self.orch.busy(node) and node.status == "settled" and self.orch.hosted(node)
                    and self.ctx.ledger.undelivered(node.id)):
                await self.orch.deliver_notices(node.id)

    async def orphan_scan(self) -> list[str]:
        """Live in the ledger and hosted nowhere → `orphan_detected` (the alarm, once); still so after orphanStaleMs
        of silence → failed + node_abandoned."""
        now = self._now_ms()
        found = []
        for node in self.orch.tree:
            if not node.live or node.status == "starting" or self.orch.hosted(node):
                node.mail.orphan_alarm = False
                continue
            row = self.ctx.ledger.get_node(node.id) or {}
            silent = now - int(row.get("updated_at") or now)
            if not node.mail.orphan_alarm:
                node.mail.orphan_alarm = True
                data = {"reason": "hosted_nowhere", "status": node.status, "silentMs": silent}
                await self.ctx.write(_alarm(node.id, data))
                self.orch.root.publish(ORPHAN_DETECTED, {"node_id": node.id, **data})
                logger.warning("orphan scan: {} is {} in the ledger but hosted nowhere", node.id, node.status)
            if silent < self.orphan_stale_ms:
                continue
            found.append(node.id)
            await self.ctx.write(_abandon(node.id))
            self.orch.root.mark_failed(node.id, "abandoned")
            logger.warning("orphan scan: {} is live in the ledger but hosted nowhere; marked failed", node.id)
        return found

    def _spawn(self, coro: Any, name: str) -> None:
        task = background_task(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _relaunched(event: str | None, data: dict[str, Any]) -> bool:
    """A new incarnation of the node's session from its transcript: a restart after its host died, a revive that
    continues a cut run, or a relaunch found idle (new input to a live session, `reopened`, is none)."""
    if event == NODE_LAUNCHED:
        return data.get("restart") is True
    if event == NODE_RESUMED:
        return bool(data.get("relaunched"))
    return data.get("resumed") is True


def _envelope(message_id: int) -> str:
    """The head of `format_mail`'s envelope, as it appears in a transcript line."""
    return f"[legion mail #{message_id}]"


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _generating_phase(ledger: Ledger, sender: str, created_at: int) -> tuple[str | None, int | None]:
    """`data.phase`/`data.phaseSince` of the sender's last `phase_timeout` event at or before the notice."""
    phase: str | None = None
    since: int | None = None
    cursor = 0
    while True:
        batch = ledger.events_after(cursor, node_id=sender)
        if not batch:
            return phase, since
        for event in batch:
            if event.type == PHASE_TIMEOUT and event.ts <= created_at:
                data = event.data or {}
                phase = data.get("phase") if isinstance(data.get("phase"), str) else None
                raw = data.get("phaseSince", data.get("phase_since"))
                since = raw if isinstance(raw, int) else None
        cursor = batch[-1].id


def _alarm(node_id: str, data: dict[str, Any]) -> Callable[[Ledger], int]:
    return lambda led: led.append_event(node_id, ORPHAN_DETECTED, data)


def _abandon(node_id: str) -> Callable[[Ledger], int]:
    return lambda led: led.append_event(node_id, NODE_ABANDONED, {"reason": "orphan_scan"})
