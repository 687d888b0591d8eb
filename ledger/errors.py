"""Typed errors of the ledger: every one says what went wrong, where, and how to fix it."""

from __future__ import annotations

from legion.codes import (
    MAIL_INVALID_FIELD,
    MAIL_INVALID_TEXT,
    MAIL_RATE_LIMITED,
    MAIL_REFUSED,
    MAIL_TOO_LARGE,
)
from legion.ledger.constants import EVENT_TYPES


class LedgerError(Exception):
    """Base class of every error the ledger raises on purpose."""


class Refusal(Exception):
    """A deliberate no from a write (a budget, a quota, a mail rule): the writer rolls the write back and hands
    it to its caller, who reports it, without logging it as a failed write."""


class JournalModeError(LedgerError):
    """A file database did not switch to WAL (PRAGMA journal_mode returned something else)."""

    def __init__(self, path: str, mode: str) -> None:
        self.path = path
        self.mode = mode
        super().__init__(
            f"legion.db at {path!r}: PRAGMA journal_mode=WAL returned {mode!r}, not 'wal'. "
            "The ledger needs WAL (shared-memory locking) for concurrent writers; this happens on "
            "network/FUSE mounts, read-only media or VFSes without shared memory. "
            "Put the run directory on a local, writable filesystem."
        )


class SchemaVersionError(LedgerError):
    """The database carries a schema version this code does not know (newer, or negative)."""

    def __init__(self, path: str, found: int, supported: int) -> None:
        self.path = path
        self.found = found
        self.supported = supported
        if "://" in path:
            super().__init__(
                f"the ledger at {path} has schema version {found} (table legion_schema), but this legion supports "
                f"up to {supported}. It was written by a newer legion: upgrade legion, or use another database. "
                "Nothing was changed."
            )
            return
        super().__init__(
            f"legion.db at {path!r} has schema user_version {found}, but this legion supports up to "
            f"{supported}. It was written by a newer legion: upgrade legion, or use a fresh run directory."
        )


class UnknownEventTypeError(LedgerError):
    """An event type outside the closed set was written or found stored."""

    def __init__(self, event_type: object, *, event_id: int | None = None) -> None:
        self.event_type = event_type
        self.event_id = event_id
        where = f" (stored event id {event_id})" if event_id is not None else ""
        super().__init__(
            f"unknown ledger event type {event_type!r}{where}; the closed set is {', '.join(EVENT_TYPES)}. "
            "Put extra detail in the event's data (e.g. a 'reason' field) instead of a new type."
        )


class InvalidNodeError(LedgerError):
    """A node field failed validation (slug, status, depth, unknown column)."""


class NodeNotFoundError(LedgerError):
    """The node id does not exist in the ledger."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        super().__init__(f"no node with id {node_id!r} in the ledger; insert it with insert_node() first")


class InvalidDeliveryTransitionError(LedgerError):
    """A messages.delivered change that the 5-value delivery domain does not allow."""

    def __init__(self, message_id: int, current: int, target: int) -> None:
        self.message_id = message_id
        self.current = current
        self.target = target
        super().__init__(
            f"message {message_id}: delivery transition {current}->{target} is illegal; legal transitions are "
            "0->1, 0->2, 0->4, 1->3, 1->4 (the same value again is a no-op; 2, 3 and 4 are final)"
        )


class DeliveryClaimLostError(LedgerError):
    """A token-guarded delivery write whose lease expired or was taken over: nothing was written."""

    def __init__(self, message_id: int, token: int, why: str) -> None:
        self.message_id = message_id
        self.token = token
        super().__init__(
            f"message {message_id}: delivery lease {token} {why}; nothing was written. Claim it again "
            "(claim_for_delivery) before writing, or leave it to the current holder"
        )


class MessageNotFoundError(LedgerError):
    """The message id does not exist."""

    def __init__(self, message_id: int) -> None:
        self.message_id = message_id
        super().__init__(f"no message with id {message_id} in the ledger")


class MailRefusedError(LedgerError, Refusal):
    """A mail send was refused; `code` is the machine-readable reason."""

    code = MAIL_REFUSED

    def __init__(self, message: str) -> None:
        super().__init__(f"{self.code}: {message}")


class MailInvalidTextError(MailRefusedError):
    """Subject or body contains U+0000 or is not valid text."""

    code = MAIL_INVALID_TEXT


class MailTooLargeError(MailRefusedError):
    """Subject over 256 bytes or body over the 32 KB hard limit."""

    code = MAIL_TOO_LARGE


class MailInvalidFieldError(MailRefusedError):
    """kind or urgency outside its closed set, or an empty sender/recipient."""

    code = MAIL_INVALID_FIELD


class MailRateLimitedError(MailRefusedError):
    """The sender has sent its quota of mail in the last 5 minutes."""

    code = MAIL_RATE_LIMITED


class ArtifactError(LedgerError):
    """An artifact record is invalid or would change an immutable artifact."""


class RunFileError(LedgerError):
    """run.json could not be written (reading never raises: a corrupt file is quarantined)."""


class LedgerUrlError(LedgerError):
    """A ledger URL that legion cannot use (an unknown scheme, a URL that does not parse)."""

    def __init__(self, shown: str, why: str) -> None:
        self.shown = shown
        super().__init__(f"ledger URL {shown!r}: {why}" if shown else why)


class LedgerConnectError(LedgerError):
    """The PostgreSQL server could not be reached or refused us (address, credentials, database name)."""

    def __init__(self, shown: str, reason: str, fix: str, *, unreachable: bool = False) -> None:
        self.shown = shown
        self.reason = reason
        self.unreachable = unreachable  # the server did not answer (down, restarting): waiting may help, unlike a refusal
        ended = reason.endswith((".", "?", "!"))
        super().__init__(f"cannot open the ledger at {shown}: {reason}{' ' if ended else '. '}{fix}")


class NotALedgerError(LedgerError):
    """The database holds tables but no legion schema version: it belongs to something else."""

    def __init__(self, shown: str, tables: list[str]) -> None:
        self.shown = shown
        self.tables = tables
        listed = ", ".join(tables[:5]) + (f" and {len(tables) - 5} more" if len(tables) > 5 else "")
        super().__init__(
            f"the database at {shown} is not a legion ledger: it holds tables ({listed}) but no legion_schema "
            "version table. Nothing was changed. Point the ledger URL at an empty database (createdb NAME) "
            "or at one that legion created."
        )


class LedgerUnreachable(LedgerError):
    """The PostgreSQL server went away in the middle of a run: the connection was lost, the server is shutting down
    or restarting, or it refuses connections for now. Transient: the ledger writer retries on a fresh connection
    (ledger/pg_engine.py), and a run pauses when it lasts (docs/servers.md, "A shared PostgreSQL ledger")."""

    def __init__(self, shown: str, reason: str) -> None:
        self.shown = shown
        self.reason = reason
        super().__init__(f"the ledger server at {shown} cannot be reached: {reason}")


class CommitOutcomeUnknown(LedgerUnreachable):
    """The connection was lost while COMMIT was in flight: the transaction may or may not have been applied. Its
    request id (recorded in the same transaction) tells which, once the server answers again."""

    def __init__(self, shown: str, reason: str, request_id: str | None) -> None:
        self.request_id = request_id
        super().__init__(shown, f"{reason} (during COMMIT: whether request {request_id} was applied is not known yet)")
