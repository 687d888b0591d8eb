"""The usage an rpc session's `agent_settled` carries: a frame from another process, checked before it is recorded."""

from __future__ import annotations

from typing import Any

import pytest
from loguru import logger

from legion.orchestration.carried_usage import CarriedUsage, carried_usage

pytestmark = pytest.mark.timeout(10)

GOOD = {"tokens_in": 110, "tokens_out": 40, "cost_usd": 0.5, "unknown_cost_tokens": 0, "at": 1_796_000_000_000}


def test_a_well_formed_snapshot_is_taken_and_none_is_nothing() -> None:
    assert carried_usage({"usage": GOOD}) == CarriedUsage(110, 40, 0.5, 0, 1_796_000_000_000)
    assert carried_usage({"usage": {**GOOD, "cost_usd": 1}}).cost_usd == 1.0  # type: ignore[union-attr]
    assert carried_usage({"outcome": "success"}) is None


@pytest.mark.parametrize("usage", [
    "110 tokens", [110, 40], {**GOOD, "tokens_in": -1}, {**GOOD, "tokens_out": True}, {**GOOD, "tokens_in": 1.5},
    {**GOOD, "cost_usd": float("nan")}, {**GOOD, "cost_usd": -0.1}, {**GOOD, "cost_usd": "0.5"},
    {**GOOD, "at": 0}, {**GOOD, "at": None}, {k: v for k, v in GOOD.items() if k != "unknown_cost_tokens"},
])
def test_a_malformed_snapshot_is_dropped_with_a_warning_naming_the_node(usage: Any) -> None:
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(m.record["message"]), level="WARNING")
    try:
        assert carried_usage({"nodeId": "w7", "usage": usage}) is None
    finally:
        logger.remove(sink)
    assert any(w.startswith("agent_settled of w7: malformed usage") for w in warnings), warnings
