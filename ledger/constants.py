"""Closed sets and limits of the ledger (docs/spec-conformance.md §4, §6, §8.2)."""

from __future__ import annotations

import re
from enum import IntEnum
from typing import Final

SCHEMA_VERSION: Final = 5
BUSY_TIMEOUT_MS: Final = 5000
STATEMENT_CACHE_SIZE: Final = 64
CHECKPOINT_EVERY_COMMITS: Final = 100
DEFAULT_SUBTREE_MAX_DEPTH: Final = 64

# The stored event types, by name: code writes and reads them through these names, never as literals
# (tests/unit/meta/test_vocabulary.py checks it).
NODE_LAUNCHED: Final = "node_launched"
NODE_SETTLED: Final = "node_settled"
NODE_FAILED: Final = "node_failed"
NODE_RETIRED: Final = "node_retired"
NODE_RESUMED: Final = "node_resumed"
NODE_BLOCKED: Final = "node_blocked"
NODE_ABANDONED: Final = "node_abandoned"
NODE_HANDLED: Final = "node_handled"
PHASE_CHANGE: Final = "phase_change"
PHASE_TIMEOUT: Final = "phase_timeout"
MAIL_SENT: Final = "mail_sent"
MAIL_DELIVERED: Final = "mail_delivered"
MAIL_BOUNCED: Final = "mail_bounced"
BUDGET_REFUSED: Final = "budget_refused"
ORPHAN_DETECTED: Final = "orphan_detected"  # a live row's owner is gone (the alarm; node_abandoned converges it)
TREE_FINALIZED: Final = "tree_finalized"  # a run's tree is final: its root's work done, nothing live, nothing owed

# The closed set of stored event types. Adding one is a contract revision: the sentinel test
# (tests/unit/ledger/test_events.py) pins this exact tuple.
EVENT_TYPES: Final[tuple[str, ...]] = (
    NODE_LAUNCHED,
    NODE_SETTLED,
    NODE_FAILED,
    NODE_RETIRED,
    NODE_RESUMED,
    NODE_BLOCKED,
    NODE_ABANDONED,
    NODE_HANDLED,
    PHASE_CHANGE,
    PHASE_TIMEOUT,
    MAIL_SENT,
    MAIL_DELIVERED,
    MAIL_BOUNCED,
    BUDGET_REFUSED,
    ORPHAN_DETECTED,
    TREE_FINALIZED,
)
EVENT_TYPE_SET: Final = frozenset(EVENT_TYPES)

NODE_STATUSES: Final[tuple[str, ...]] = ("starting", "running", "blocked", "settled", "failed", "retired")
LIVE_STATUSES: Final[tuple[str, ...]] = ("starting", "running", "blocked")
NODE_KINDS: Final[tuple[str, ...]] = ("native", "pi")
NODE_SLUG_PATTERN: Final = r"[a-z][a-z0-9_-]{0,31}"
NODE_SLUG_RE: Final = re.compile(NODE_SLUG_PATTERN)
# the phases every phase machine ends in (ordered: a machine adds them as edges in this order)
# the ledger row (and caller id) that stands for the operator: a mail sender, the caller of operator actions
OPERATOR_NODE: Final = "@operator"
TERMINAL_PHASES: Final[tuple[str, ...]] = ("done", "failed", "aborted")


class Delivery(IntEnum):
    """messages.delivered: the 5-value delivery domain (docs/spec-conformance.md §6.3)."""

    PENDING = 0
    ACCEPTED = 1
    BOUNCED = 2
    DELIVERED = 3
    OBSOLETE = 4
    INJECTED = 1  # deprecated alias of ACCEPTED


LEGAL_DELIVERY_TRANSITIONS: Final = frozenset(
    {
        (Delivery.PENDING, Delivery.ACCEPTED),
        (Delivery.PENDING, Delivery.BOUNCED),
        (Delivery.PENDING, Delivery.OBSOLETE),
        (Delivery.ACCEPTED, Delivery.DELIVERED),
        (Delivery.ACCEPTED, Delivery.OBSOLETE),
    }
)

MAIL_KINDS: Final = ("question", "report", "handoff", "notice")
MAIL_URGENCIES: Final = ("info", "action-needed")
MAIL_SUBJECT_MAX_BYTES: Final = 256
MAIL_BODY_SOFT_BYTES: Final = 4 * 1024
MAIL_BODY_HARD_BYTES: Final = 32 * 1024
MAIL_RATE_PER_5_MIN: Final = 10
MAIL_RATE_WINDOW_MS: Final = 5 * 60 * 1000
MAIL_DELIVERY_CLAIM_LEASE_MS: Final = 60_000

ORPHAN_STALE_MS: Final = 90_000
# a completion notice held (its parent's run still going) longer than this counts once toward the run's
# `heldOverCap` health signal; it sends nothing (docs/spec-conformance.md §6.7)
MAX_PENDING_AGE_MS: Final = 80_000
RETENTION_DAYS: Final = 14
