"""The SQLite WAL ledger (legion.db): schema, migrations and every table's API.

`from legion.ledger import open_ledger, Ledger, ...` — see INTERFACES.md.
"""

from legion.ledger.constants import (
    EVENT_TYPES,
    NODE_KINDS,
    NODE_STATUSES,
    SCHEMA_VERSION,
    Delivery,
)
from legion.ledger.errors import (
    InvalidDeliveryTransitionError,
    InvalidNodeError,
    JournalModeError,
    LedgerError,
    NodeNotFoundError,
    SchemaVersionError,
    UnknownEventTypeError,
)
from legion.ledger.events import Event
from legion.ledger.ledger import Ledger, open_ledger

__all__ = [
    "EVENT_TYPES",
    "NODE_KINDS",
    "NODE_STATUSES",
    "SCHEMA_VERSION",
    "Delivery",
    "Event",
    "InvalidDeliveryTransitionError",
    "InvalidNodeError",
    "JournalModeError",
    "Ledger",
    "LedgerError",
    "NodeNotFoundError",
    "SchemaVersionError",
    "UnknownEventTypeError",
    "open_ledger",
]
