"""The usage an rpc session's `agent_settled` event carries (`usage`), checked before the root records it.

An rpc worker that never opened its ledger writer sends its session's settle-time usage snapshot in the
settle event (`legion.workers.held_writer`); the root records it with the round's artifact. The event is a
frame from another process, so the snapshot is checked here, with the ledger's own checks: a malformed one is
dropped with a warning (the transcript keeps the usage, and the session's next write, or a resumed one, writes
it again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from loguru import logger

from legion.ledger.errors import LedgerError
from legion.ledger.usage import check_usage

if TYPE_CHECKING:
    from legion.ledger import Ledger


class CarriedUsage(NamedTuple):
    tokens_in: int
    tokens_out: int
    cost_usd: float
    unknown_cost_tokens: int
    at: int  # epoch ms the worker took the snapshot at (an older one never replaces a newer row)

    def record(self, led: Ledger, node_id: str) -> None:
        led.upsert_usage(node_id, self.tokens_in, self.tokens_out, self.cost_usd, self.unknown_cost_tokens,
                         taken_at=self.at)


def carried_usage(body: dict[str, Any]) -> CarriedUsage | None:
    """The event's `usage`, or None when it has none or it is malformed (logged)."""
    raw: Any = body.get("usage")
    if raw is None:
        return None
    try:
        if not isinstance(raw, dict):
            raise LedgerError("not an object")
        values: list[Any] = [raw.get(k) for k in CarriedUsage._fields]
        tokens_in, tokens_out, cost, unknown, at = values
        check_usage(tokens_in, tokens_out, cost, unknown, taken_at=at)
        if at is None:
            raise LedgerError("upsert_usage: taken_at must be a positive epoch-ms int, got None")
    except LedgerError as exc:
        logger.warning("agent_settled of {}: malformed usage {!r} ignored ({})", body.get("nodeId"), str(raw)[:200],
                       str(exc).removeprefix("upsert_usage: "))
        return None
    return CarriedUsage(tokens_in, tokens_out, float(cost), unknown, at)
