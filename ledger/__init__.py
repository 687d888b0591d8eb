"""The SQLite WAL ledger (legion.db): schema, migrations and every table's API.

`from legion.ledger import open_ledger, Ledger, ...`. Beyond the tables' basic API: `Ledger.transaction()` (group writes in one BEGIN IMMEDIATE), lease tokens
(`claim_for_delivery` returns an int token or None; `renew_delivery_claim(id, token)`;
`release_delivery_claim(id, token=None)`; `transition_delivery(..., token=)` writes only under a live lease, else
`DeliveryClaimLostError`), `write_artifact`, `mark_notified`, `mailbox_stats`,
`messages_in_state`, `list_nodes`, `last_event_id`, `LedgerWriter` (a writer thread with group commit:
writer.py), and the run-directory helpers
(`write_run_json`/`read_run_json`, `run_hygiene`, `rebuild_ledger`).

The public names are exported lazily (PEP 562, `legion.lazy_exports`), so importing one submodule (the
closed sets of `constants`, say, which the CLI reads before anything else) never drags in SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from legion import lazy_exports

_EXPORTS: dict[str, str] = {
    "artifact_relpath": "artifacts",
    "Delivery": "constants",
    "EVENT_TYPES": "constants",
    "MAIL_DELIVERY_CLAIM_LEASE_MS": "constants",
    "NODE_KINDS": "constants",
    "NODE_SLUG_PATTERN": "constants",
    "NODE_STATUSES": "constants",
    "SCHEMA_VERSION": "constants",
    "has_ended": "delivery_rules",
    "is_phase_timeout_notice": "delivery_rules",
    "is_terminal": "delivery_rules",
    "obsolete_reason": "delivery_rules",
    "ArtifactError": "errors",
    "DeliveryClaimLostError": "errors",
    "InvalidDeliveryTransitionError": "errors",
    "InvalidNodeError": "errors",
    "JournalModeError": "errors",
    "LedgerError": "errors",
    "MailInvalidFieldError": "errors",
    "MailInvalidTextError": "errors",
    "MailRateLimitedError": "errors",
    "MailRefusedError": "errors",
    "MailTooLargeError": "errors",
    "MessageNotFoundError": "errors",
    "NodeNotFoundError": "errors",
    "RunFileError": "errors",
    "SchemaVersionError": "errors",
    "UnknownEventTypeError": "errors",
    "Event": "events",
    "HygieneReport": "hygiene",
    "run_hygiene": "hygiene",
    "Ledger": "ledger",
    "open_fleet_ledger": "ledger",
    "open_ledger": "ledger",
    "MailSent": "mail",
    "owner_alive": "owner",
    "owner_record": "owner",
    "write_owner_file": "owner",
    "REBUILD_LIMITS": "rebuild",
    "RebuildReport": "rebuild",
    "rebuild_ledger": "rebuild",
    "read_run_json": "runfile",
    "write_run_json": "runfile",
    "DiskFullError": "writer",
    "LedgerWriter": "writer",
    "WriterClosedError": "writer",
    "fail_fast": "writer",
    "is_disk_full": "writer",
}

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
    "open_fleet_ledger",
    "open_ledger",
    "owner_alive",
    "owner_record",
    "read_run_json",
    "rebuild_ledger",
    "run_hygiene",
    "write_owner_file",
    "write_run_json",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:
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
    from legion.ledger.ledger import Ledger, open_fleet_ledger, open_ledger
    from legion.ledger.mail import MailSent
    from legion.ledger.owner import owner_alive, owner_record, write_owner_file
    from legion.ledger.rebuild import REBUILD_LIMITS, RebuildReport, rebuild_ledger
    from legion.ledger.runfile import read_run_json, write_run_json
    from legion.ledger.writer import DiskFullError, LedgerWriter, WriterClosedError, fail_fast, is_disk_full
