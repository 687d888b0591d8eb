"""The SQLite WAL ledger (legion.db): schema, migrations and every table's API.

`from legion.ledger import open_ledger, Ledger, ...`. Beyond the tables' basic API: `Ledger.transaction()` (group writes in one BEGIN IMMEDIATE), lease tokens
(`claim_for_delivery` returns an int token or None; `renew_delivery_claim(id, token)`;
`release_delivery_claim(id, token=None)`; `transition_delivery(..., token=)` writes only under a live lease, else
`DeliveryClaimLostError`), `write_artifact`, `mark_notified`, `mailbox_stats`,
`messages_in_state`, `list_nodes`, `last_event_id`, `LedgerWriter` (a writer thread with group commit:
writer.py), and the run-directory helpers
(`write_run_json`/`read_run_json`, `run_hygiene`, `rebuild_ledger`).
"""

from legion.ledger.artifacts import artifact_relpath
from legion.ledger.constants import (
    EVENT_TYPES,
    MAIL_DELIVERY_CLAIM_LEASE_MS,
    NODE_KINDS,
    NODE_SLUG_PATTERN,
    NODE_STATUSES,
    SCHEMA_VERSION,
    Delivery,
)
from legion.ledger.delivery_rules import has_ended, is_phase_timeout_notice, is_terminal, obsolete_reason
from legion.ledger.errors import (
    ArtifactError,
    DeliveryClaimLostError,
    InvalidDeliveryTransitionError,
    InvalidNodeError,
    JournalModeError,
    LedgerError,
    MailInvalidFieldError,
    MailInvalidTextError,
    MailRateLimitedError,
    MailRefusedError,
    MailTooLargeError,
    MessageNotFoundError,
    NodeNotFoundError,
    RunFileError,
    SchemaVersionError,
    UnknownEventTypeError,
)
from legion.ledger.events import Event
from legion.ledger.hygiene import HygieneReport, run_hygiene
from legion.ledger.ledger import Ledger, open_ledger
from legion.ledger.mail import MailSent
from legion.ledger.owner import owner_alive, owner_record, write_owner_file
from legion.ledger.rebuild import REBUILD_LIMITS, RebuildReport, rebuild_ledger
from legion.ledger.runfile import read_run_json, write_run_json
from legion.ledger.writer import DiskFullError, LedgerWriter, WriterClosedError, fail_fast, is_disk_full

__all__ = [
    "EVENT_TYPES",
    "MAIL_DELIVERY_CLAIM_LEASE_MS",
    "NODE_KINDS",
    "NODE_SLUG_PATTERN",
    "NODE_STATUSES",
    "REBUILD_LIMITS",
    "SCHEMA_VERSION",
    "ArtifactError",
    "Delivery",
    "DeliveryClaimLostError",
    "DiskFullError",
    "Event",
    "HygieneReport",
    "InvalidDeliveryTransitionError",
    "InvalidNodeError",
    "JournalModeError",
    "Ledger",
    "LedgerError",
    "LedgerWriter",
    "MailInvalidFieldError",
    "MailInvalidTextError",
    "MailRateLimitedError",
    "MailRefusedError",
    "MailSent",
    "MailTooLargeError",
    "MessageNotFoundError",
    "NodeNotFoundError",
    "RebuildReport",
    "RunFileError",
    "SchemaVersionError",
    "UnknownEventTypeError",
    "WriterClosedError",
    "artifact_relpath",
    "fail_fast",
    "has_ended",
    "is_disk_full",
    "is_phase_timeout_notice",
    "is_terminal",
    "obsolete_reason",
    "open_ledger",
    "owner_alive",
    "owner_record",
    "read_run_json",
    "rebuild_ledger",
    "run_hygiene",
    "write_owner_file",
    "write_run_json",
]
