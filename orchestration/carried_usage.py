"""The usage an rpc session's `agent_settled` event carries (`usage`), checked before the root records it.

An rpc worker that never opened its ledger writer sends its session's settle-time usage snapshot in the
settle event (`legion.workers.held_writer`); the root records it with the round's artifact. The event is a
frame from another process, so the snapshot is checked here: a malformed one is dropped with a warning (the
transcript keeps the usage, and the session's next write, or a resumed one, writes it again).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from loguru import logger


class CarriedUsage(NamedTuple):
    tokens_in: int
    tokens_out: int
    cost_usd: float
    unknown_cost_tokens: int
    at: int  # epoch ms the worker took the snapshot at (an older one never replaces a newer row)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def carried_usage(body: dict[str, Any]) -> CarriedUsage | None:
    """The event's `usage`, or None when it has none or it is malformed (logged)."""
    raw = body.get("usage")
    if raw is None:
        return None
    if isinstance(raw, dict):
        counts = [raw.get(k) for k in ("tokens_in", "tokens_out", "unknown_cost_tokens")]
        cost, at = raw.get("cost_usd"), raw.get("at")
        cost_ok = isinstance(cost, int | float) and not isinstance(cost, bool) and math.isfinite(cost) and cost >= 0
        if all(_count(c) for c in counts) and cost_ok and _count(at) and at:
            return CarriedUsage(counts[0], counts[1], float(cost), counts[2], at)  # type: ignore[arg-type]
    logger.warning("agent_settled of {}: malformed usage {!r} ignored (tokens_in, tokens_out, unknown_cost_tokens: "
                   "non-negative ints; cost_usd: a finite non-negative number; at: epoch ms)",
                   body.get("nodeId"), str(raw)[:200])
    return None
