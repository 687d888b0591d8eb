"""Mail storage: send with every limit, the 5-value delivery domain, and claim leases (docs/spec-conformance.md §6)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import Select, bindparam, func, select

from legion.ledger.base import LedgerBase
from legion.ledger.constants import (
    LEGAL_DELIVERY_TRANSITIONS,
    MAIL_BODY_HARD_BYTES,
    MAIL_BODY_SOFT_BYTES,
    MAIL_BOUNCED,
    MAIL_DELIVERED,
    MAIL_DELIVERY_CLAIM_LEASE_MS,
    MAIL_KINDS,
    MAIL_RATE_PER_5_MIN,
    MAIL_RATE_WINDOW_MS,
    MAIL_SENT,
    MAIL_SUBJECT_MAX_BYTES,
    MAIL_URGENCIES,
    Delivery,
)
from legion.ledger.delivery_rules import OBSOLETE_REASON, is_terminal
from legion.ledger.errors import (
    DeliveryClaimLostError,
    InvalidDeliveryTransitionError,
    LedgerError,
    MailInvalidFieldError,
    MailInvalidTextError,
    MailRateLimitedError,
    MailTooLargeError,
    MessageNotFoundError,
)
from legion.ledger.events import APPEND_EVENT_SQL, notifying
from legion.ledger.schema import Tables
from legion.ledger.sql import RUN, Sql

# Served by idx_messages_rate (covering: from_node, created_at); pinned by a query-plan test.
RATE_COUNT_SQL = Sql(
    "SELECT count(*) FROM messages WHERE from_node = ? AND created_at > ?",
    f"SELECT count(*) FROM messages WHERE run = {RUN} AND from_node = %s AND created_at > %s",
)
_MAIL_COLUMNS = "from_node, to_node, subject, body, kind, urgency, delivered, delivered_at, created_at"
INSERT_MAIL_SQL = Sql(
    f"INSERT INTO messages ({_MAIL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, 0, NULL, ?)",
    f"INSERT INTO messages (run, {_MAIL_COLUMNS}) VALUES ({RUN}, %s, %s, %s, %s, %s, %s, 0, NULL, %s) RETURNING id",
)
_SENDER_SQL = Sql("SELECT 1 FROM nodes WHERE id = ?", f"SELECT 1 FROM nodes WHERE run = {RUN} AND id = %s")
_APPEND_IF_NODE_SQL = Sql(
    "INSERT INTO events (node_id, type, data, ts) VALUES ((SELECT id FROM nodes WHERE id = ?), ?, ?, ?)",
    notifying(f"INSERT INTO events (run, node_id, type, data, ts) "
              f"VALUES ({RUN}, (SELECT id FROM nodes WHERE run = {RUN} AND id = %s), %s, %s, %s)"),
)
# FOR UPDATE: a lease write (claim, renew, release) takes no run lock, only this row's
_MESSAGE_FOR_TRANSITION_SQL = Sql(
    "SELECT delivered, from_node, to_node, delivered_at FROM messages WHERE id = ?",
    f"SELECT delivered, from_node, to_node, delivered_at FROM messages WHERE run = {RUN} AND id = %s FOR UPDATE",
)
_RECIPIENT_SQL = Sql(
    "SELECT status, phase FROM nodes WHERE id = ?", f"SELECT status, phase FROM nodes WHERE run = {RUN} AND id = %s"
)
_SET_DELIVERED_SQL = Sql(
    "UPDATE messages SET delivered = ?, delivered_at = ? WHERE id = ? AND delivered = ?",
    f"UPDATE messages SET delivered = %s, delivered_at = %s WHERE run = {RUN} AND id = %s AND delivered = %s",
)
_LEASE_FREE = "delivered = 0 AND (delivered_at IS NULL OR delivered_at <= {})"
# SKIP LOCKED: a claimer that finds the row locked by another claimer gets no lease at once instead of waiting
_CLAIM_SQL = Sql(
    f"UPDATE messages SET delivered_at = ? WHERE id = ? AND {_LEASE_FREE.format('?')}",
    f"UPDATE messages SET delivered_at = %s WHERE run = {RUN} AND id = (SELECT id FROM messages "
    f"WHERE run = {RUN} AND id = %s AND {_LEASE_FREE.format('%s')} FOR UPDATE SKIP LOCKED)",
)
_RENEW_SQL = Sql(
    "UPDATE messages SET delivered_at = ? WHERE id = ? AND delivered = 0 AND delivered_at = ? AND delivered_at > ?",
    f"UPDATE messages SET delivered_at = %s WHERE run = {RUN} AND id = %s AND delivered = 0 "
    "AND delivered_at = %s AND delivered_at > %s",
)
_RELEASE = "UPDATE messages SET delivered_at = NULL WHERE {}id = {} AND delivered = 0 AND delivered_at IS NOT NULL"
_RELEASE_SQL = Sql(_RELEASE.format("", "?"), _RELEASE.format(f"run = {RUN} AND ", "%s"))
_RELEASE_TOKEN_SQL = Sql(_RELEASE.format("", "?") + " AND delivered_at = ?",
                         _RELEASE.format(f"run = {RUN} AND ", "%s") + " AND delivered_at = %s")


def _get_message(t: Tables) -> Select[Any]:
    return select(*t.cols(t.messages)).where(*t.scope(t.messages), t.messages.c.id == bindparam("id"))


def _in_state(t: Tables) -> Select[Any]:
    messages = t.messages
    return (
        select(*t.cols(messages))
        .where(*t.scope(messages), messages.c.delivered == bindparam("state"), messages.c.id > bindparam("after"))
        .order_by(messages.c.id)
        .limit(bindparam("limit"))
    )


def _in_state_to(t: Tables) -> Select[Any]:
    messages = t.messages
    return (
        select(*t.cols(messages))
        .where(*t.scope(messages), messages.c.delivered == bindparam("state"), messages.c.id > bindparam("after"),
               messages.c.to_node == bindparam("to"))
        .order_by(messages.c.id)
        .limit(bindparam("limit"))
    )


def _recipients(t: Tables) -> Select[Any]:
    messages = t.messages
    return select(messages.c.to_node).where(*t.scope(messages)).distinct()


@dataclass(slots=True)
class _Addressed:
    seeded: bool = False
    nodes: set[str] = field(default_factory=set)


# Per ledger in this process (its file, or its PostgreSQL database and run): every node any of its mail was ever
# addressed to. This process's sends add to it before they commit, and one read adds what was there before
# (`addressed`), so "not in it" means "no mail" for every mail this process wrote. It only grows.
_ADDRESSED: dict[tuple[str, str | None], _Addressed] = {}


@dataclass(frozen=True, slots=True)
class MailSent:
    """Result of a successful send: the message id, its mail_sent event id, and soft-limit warnings."""

    id: int
    event_id: int
    created_at: int
    warnings: tuple[str, ...] = ()


def _utf8(label: str, text: object) -> bytes:
    if not isinstance(text, str):
        raise MailInvalidTextError(f"{label} must be a string, got {type(text).__name__}")
    if "\x00" in text:
        raise MailInvalidTextError(f"{label} contains U+0000 (NUL); remove it")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise MailInvalidTextError(f"{label} is not valid Unicode text ({exc.reason})") from exc


def validate_mail(
    from_node: str, to_node: str, subject: str, body: str, kind: str | None, urgency: str
) -> tuple[str, ...]:
    """Check every limit of docs/spec-conformance.md §6.1; returns warnings (the 4 KB soft limit)."""
    for label, node in (("sender", from_node), ("recipient", to_node)):
        if not isinstance(node, str) or not node or "\x00" in node:
            raise MailInvalidFieldError(f"{label} must be a non-empty node id, got {node!r}")
    if kind is not None and kind not in MAIL_KINDS:
        raise MailInvalidFieldError(f"kind {kind!r} is not one of {', '.join(MAIL_KINDS)} (or omitted)")
    if urgency not in MAIL_URGENCIES:
        raise MailInvalidFieldError(f"urgency {urgency!r} is not one of {', '.join(MAIL_URGENCIES)}")
    subject_bytes = len(_utf8("subject", subject))
    body_bytes = len(_utf8("body", body))
    if subject_bytes > MAIL_SUBJECT_MAX_BYTES:
        raise MailTooLargeError(f"subject is {subject_bytes} bytes; the limit is {MAIL_SUBJECT_MAX_BYTES} bytes")
    if body_bytes > MAIL_BODY_HARD_BYTES:
        raise MailTooLargeError(
            f"body is {body_bytes} bytes; the hard limit is {MAIL_BODY_HARD_BYTES} bytes. "
            "Write the content to a file and mail its path instead"
        )
    if body_bytes > MAIL_BODY_SOFT_BYTES:
        return (
            f"body is {body_bytes} bytes (over the {MAIL_BODY_SOFT_BYTES}-byte soft limit); "
            "consider writing long content to a file and mailing its path",
        )
    return ()


class MailMixin(LedgerBase):
    """Asynchronous mail between nodes."""

    _mail_rate_per_5_min: int = MAIL_RATE_PER_5_MIN

    def send_mail(
        self,
        from_node: str,
        to_node: str,
        subject: str,
        body: str,
        kind: str | None = None,
        urgency: str = "info",
    ) -> MailSent:
        """Store a PENDING mail and its mail_sent event; the rate limit is counted in the same transaction."""
        warnings = validate_mail(from_node, to_node, subject, body, kind, urgency)
        now = self._now()
        with self._db.write() as raw:
            # Checked before the INSERT so that a refusal inside a caller's transaction writes nothing.
            if raw.execute(_SENDER_SQL, (from_node,)).fetchone() is None:
                raise MailInvalidFieldError(f"sender {from_node!r} is not a node of this ledger")
            sent = int(raw.execute(RATE_COUNT_SQL, (from_node, now - MAIL_RATE_WINDOW_MS)).fetchone()[0])
            if sent >= self._mail_rate_per_5_min:
                raise MailRateLimitedError(
                    f"{from_node!r} already sent {sent} mails in the last 5 minutes (limit "
                    f"{self._mail_rate_per_5_min}); wait, or batch the content into one mail"
                )
            book = self._addressed_book()
            if book is not None:  # before the row can be seen: a reader that trusts the book never misses it
                book.nodes.add(to_node)
            cur = raw.execute(INSERT_MAIL_SQL, (from_node, to_node, subject, body, kind, urgency, now))
            message_id = int(cur.lastrowid or 0)
            data = {"message_id": message_id, "to": to_node, "subject": subject, "kind": kind, "urgency": urgency}
            event = raw.execute(APPEND_EVENT_SQL, (from_node, MAIL_SENT, orjson.dumps(data).decode(), now))
        return MailSent(id=message_id, event_id=int(event.lastrowid or 0), created_at=now, warnings=warnings)

    _book: _Addressed | None = None  # this Ledger's entry of `_ADDRESSED` (found once: asked on hot paths)

    def _addressed_book(self) -> _Addressed | None:
        if self._book is None:
            db = self._db
            if db.file:
                key: tuple[str, str | None] = (db.file, None)
            elif db.backend == "postgresql":
                key = (db.path, getattr(db, "run_id", None))
            else:  # in memory: each is its own database, and nobody else writes it
                return None
            self._book = _ADDRESSED.setdefault(key, _Addressed())
        return self._book

    def addressed(self) -> set[str] | None:
        """The nodes this ledger's mail was ever addressed to, without a query after the first: read once, then
        kept by this process's sends (mail another process sends is only in it once `note_addressed` was told of
        it, e.g. by a reader that found it). None for an in-memory ledger (ask `messages_in_state`)."""
        book = self._addressed_book()
        if book is None:
            return None
        if not book.seeded:
            with self._db.read():
                rows = self._db.select(_recipients, {}, key="mail_recipients")
            book.nodes.update(str(row["to_node"]) for row in rows)
            book.seeded = True
        return book.nodes

    def note_addressed(self, node_ids: Iterable[str]) -> None:
        """Mail found addressed to these nodes (written by another process, say): `addressed` includes them."""
        book = self._addressed_book()
        if book is not None:
            book.nodes.update(node_ids)

    def get_message(self, message_id: int) -> dict[str, Any] | None:
        with self._db.read():
            rows = self._db.select(_get_message, {"id": message_id}, key="get_message")
        return rows[0] if rows else None

    def pending_inbox(self, to_node: str, limit: int = 100) -> list[dict[str, Any]]:
        """PENDING mail for a recipient, oldest first (the only state worth retrying)."""
        return self.messages_in_state(Delivery.PENDING, to_node=to_node, limit=limit)

    def messages_in_state(
        self, state: Delivery, *, to_node: str | None = None, after_id: int = 0, limit: int = 20
    ) -> list[dict[str, Any]]:
        """Mail in one delivery state with id > after_id (for a rotating confirmation cursor)."""
        params = {"state": int(_delivery(state, "messages_in_state")), "after": after_id, "to": to_node, "limit": limit}
        with self._db.read():
            if to_node is None:
                return self._db.select(_in_state, params, key="messages_in_state")
            return self._db.select(_in_state_to, params, key="messages_in_state_to")

    def recent_mail(self, *, to_node: str | None = None, from_node: str | None = None,
                    limit: int = 200) -> list[dict[str, Any]]:
        """The newest `limit` messages of the run (to a node, from a node, or all), oldest first."""
        t = self._db.tables
        messages = t.messages
        stmt = select(messages).where(*t.scope(messages))
        if to_node is not None:
            stmt = stmt.where(messages.c.to_node == to_node)
        if from_node is not None:
            stmt = stmt.where(messages.c.from_node == from_node)
        with self._db.read():
            rows = self._db.select(stmt.order_by(messages.c.id.desc()).limit(max(1, limit)))
        return rows[::-1]

    def mailbox_stats(self, node_id: str) -> dict[str, int]:
        """Counts of a recipient's mail per delivery state."""
        t = self._db.tables
        messages = t.messages
        stmt = (
            select(messages.c.delivered, func.count().label("n"))
            .where(*t.scope(messages), messages.c.to_node == node_id)
            .group_by(messages.c.delivered)
        )
        with self._db.read():
            rows = self._db.select(stmt)
        stats = {state.name.lower(): 0 for state in Delivery if state.name != "INJECTED"}
        for row in rows:
            stats[_delivery(row["delivered"], f"mailbox {node_id!r}: stored delivered value").name.lower()] = int(row["n"])
        return stats

    def transition_delivery(
        self,
        message_id: int,
        target: Delivery | int,
        *,
        reason: str | None = None,
        token: int | None = None,
        lease_ms: int = MAIL_DELIVERY_CLAIM_LEASE_MS,
    ) -> Delivery:
        """The single write entry of messages.delivered; returns the state actually stored.

        Same value again is a no-op; anything outside 0->1, 0->2, 0->4, 1->3, 1->4 raises.
        ACCEPTED for a terminal recipient lands as BOUNCED. BOUNCED and OBSOLETE write mail_bounced
        (OBSOLETE with reason obsolete_after_phase_change), DELIVERED writes mail_delivered.
        With `token` (from claim_for_delivery) a PENDING mail is written only while that lease is
        still held and live: an expired or taken-over lease writes nothing (DeliveryClaimLostError).
        """
        target = _delivery(target, f"transition_delivery({message_id})")
        now = self._now()
        with self._db.write() as raw:
            row = raw.execute(_MESSAGE_FOR_TRANSITION_SQL, (message_id,)).fetchone()
            if row is None:
                raise MessageNotFoundError(message_id)
            current = _delivery(row[0], f"message {message_id}: stored delivered value (the row is corrupt)")
            from_node, to_node = row[1], row[2]
            if current == target:
                return current
            if token is not None and current == Delivery.PENDING:
                _check_lease(message_id, token, row[3], now, lease_ms)
            if (current, target) == (Delivery.PENDING, Delivery.ACCEPTED):
                recipient = raw.execute(_RECIPIENT_SQL, (to_node,)).fetchone()
                if recipient is not None and is_terminal({"status": recipient[0], "phase": recipient[1]}):
                    target, reason = Delivery.BOUNCED, reason or "recipient_terminal"
            if (current, target) not in LEGAL_DELIVERY_TRANSITIONS:
                raise InvalidDeliveryTransitionError(message_id, int(current), int(target))
            raw.execute(_SET_DELIVERED_SQL, (int(target), now, message_id, int(current)))
            event = _delivery_event(message_id, from_node, to_node, target, reason)
            if event is not None:
                node_id, event_type, data = event
                # The node may be gone (rebuild keeps messages, not nodes): then the event has no node.
                raw.execute(_APPEND_IF_NODE_SQL, (node_id, event_type, orjson.dumps(data).decode(), now))
        return target

    def claim_for_delivery(self, message_id: int, *, lease_ms: int = MAIL_DELIVERY_CLAIM_LEASE_MS) -> int | None:
        """Lease a PENDING mail for delivery; returns the lease token (its stamp) or None if taken/not pending.

        The lease is `delivered_at` on a PENDING row; it expires lease_ms after the stamp (an expired
        lease writes nothing; the next claimer just overwrites it).
        """
        now = self._now()
        with self._db.write_row() as raw:
            cur = raw.execute(_CLAIM_SQL, (now, message_id, now - lease_ms))
        return now if cur.rowcount == 1 else None

    def renew_delivery_claim(
        self, message_id: int, token: int, *, lease_ms: int = MAIL_DELIVERY_CLAIM_LEASE_MS
    ) -> int | None:
        """Extend a live lease we still hold (call every lease_ms/3); returns the new token or None if lost.

        An expired lease is lost even if nobody has claimed it yet (an expired lease writes nothing).
        """
        clock = self._now()
        now = max(clock, token + 1)
        with self._db.write_row() as raw:
            cur = raw.execute(_RENEW_SQL, (now, message_id, token, clock - lease_ms))
        return now if cur.rowcount == 1 else None

    def release_delivery_claim(self, message_id: int, token: int | None = None) -> bool:
        """Drop a lease now (send error or lost race); with a token only if we still hold it."""
        sql, params = (_RELEASE_SQL, (message_id,)) if token is None else (_RELEASE_TOKEN_SQL, (message_id, token))
        with self._db.write_row() as raw:
            cur = raw.execute(sql, params)
        return cur.rowcount == 1


def _delivery(value: object, where: str) -> Delivery:
    """A member of the 5-value domain, or a LedgerError saying what was given (never a bare ValueError)."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in _DELIVERY_VALUES:
        raise LedgerError(
            f"{where}: delivery state {value!r} is not one of 0..4 (PENDING, ACCEPTED, BOUNCED, DELIVERED, OBSOLETE)"
        )
    return Delivery(value)


_DELIVERY_VALUES = frozenset(int(d) for d in Delivery)


def _check_lease(message_id: int, token: int, stamp: int | None, now: int, lease_ms: int) -> None:
    if stamp != token:
        raise DeliveryClaimLostError(message_id, token, "is no longer held (released or taken over)")
    if stamp <= now - lease_ms:
        raise DeliveryClaimLostError(message_id, token, f"expired ({lease_ms} ms lease)")


def _delivery_event(
    message_id: int, from_node: str, to_node: str, target: Delivery, reason: str | None
) -> tuple[str, str, dict[str, Any]] | None:
    base: dict[str, Any] = {"message_id": message_id, "from": from_node, "to": to_node}
    if target == Delivery.BOUNCED:
        return from_node, MAIL_BOUNCED, {**base, "reason": reason or "bounced"}
    if target == Delivery.OBSOLETE:
        return from_node, MAIL_BOUNCED, {**base, "reason": reason or OBSOLETE_REASON}
    if target == Delivery.DELIVERED:
        return to_node, MAIL_DELIVERED, base
    return None
