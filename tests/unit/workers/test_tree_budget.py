"""The tree-wide budget: known cost plus unknown-price tokens at the configured rate; its spec round trip."""

from __future__ import annotations

import pytest

from legion.agents.settings import build_settings
from legion.orchestration.run import tree_budget
from legion.workers.session_spec import SpecError, _tree_budget
from legion.workers.tree_budget import UNKNOWN_COST_USD_PER_MTOK, TreeBudget

pytestmark = pytest.mark.timeout(10)


def totals(cost: float = 0.0, unknown: int = 0, tokens_in: int = 0, tokens_out: int = 0) -> dict[str, float]:
    return {"cost_usd": cost, "unknown_cost_tokens": unknown, "tokens_in": tokens_in, "tokens_out": tokens_out}


def test_unknown_price_tokens_are_charged_at_the_rate() -> None:
    budget = TreeBudget(max_cost_usd=1.0, unknown_usd_per_mtok=20.0)
    assert budget.charged_usd(totals(0.25)) == pytest.approx(0.25)
    assert budget.charged_usd(totals(0.25, unknown=30_000)) == pytest.approx(0.25 + 0.6)
    assert budget.refusal(totals(0.25, unknown=30_000, tokens_in=30_000)) is None


def test_a_run_of_an_unpriced_model_is_stopped_by_its_tokens() -> None:
    """Known cost 0 (the model has no price): without the unknown-price count the budget would never stop it."""
    budget = TreeBudget(max_cost_usd=1.0, unknown_usd_per_mtok=20.0)
    why = budget.refusal(totals(0.0, unknown=50_000, tokens_in=45_000, tokens_out=5_000))
    assert why is not None and why.startswith("budget: the run's tree-wide cost budget is spent ($1.0000 of $1.0000")
    assert "50000 tokens at unknown prices counted at $20/Mtok" in why
    assert "legion.budget.unknownCostPerMTokUsd" in why


def test_a_zero_rate_lets_a_free_local_model_run_and_the_token_budget_still_counts() -> None:
    budget = TreeBudget(max_cost_usd=1.0, max_tokens=100_000, unknown_usd_per_mtok=0.0)
    assert budget.refusal(totals(0.0, unknown=90_000, tokens_in=90_000)) is None
    why = budget.refusal(totals(0.0, unknown=100_000, tokens_in=100_000))
    assert why is not None and "token budget is spent (100000 of 100000)" in why


def test_the_spec_round_trip_and_its_validation() -> None:
    budget = TreeBudget(max_cost_usd=2.5, unknown_usd_per_mtok=3.0)
    assert budget.spec() == {"maxCostUsd": 2.5, "unknownCostPerMTokUsd": 3.0}
    assert _tree_budget(budget.spec()) == budget
    assert _tree_budget({"maxTokens": 10}) == TreeBudget(None, 10, UNKNOWN_COST_USD_PER_MTOK)
    for bad, words in (({"unknownCostPerMTokUsd": -1}, "finite number ≥ 0"),
                       ({"unknownCostPerMTokUsd": "5"}, "must be int or float"),
                       ({"maxCost": 1}, "maxCost")):
        with pytest.raises(SpecError, match=words):
            _tree_budget(bad)


def test_the_runs_budget_from_settings_and_the_flag() -> None:
    assert tree_budget(build_settings([{}]), None) is None
    only_rate = build_settings([{"legion": {"budget": {"unknownCostPerMTokUsd": 1}}}])
    assert tree_budget(only_rate, None) is None  # a rate alone limits nothing
    assert tree_budget(only_rate, 0.5) == TreeBudget(0.5, None, 1.0)
    full = build_settings([{"legion": {"budget": {"maxCostUsd": 3, "maxTokens": 1000}}}])
    assert tree_budget(full, 0.5) == TreeBudget(0.5, 1000, UNKNOWN_COST_USD_PER_MTOK)  # --max-cost wins
