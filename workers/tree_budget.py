"""The run's tree-wide cost and token budget, as sessions and launches check it against the ledger's usage totals."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

# The rate a cost budget charges unknown-price tokens at unless settings say otherwise
# (legion.budget.unknownCostPerMTokUsd). Deliberately high, a frontier model's input price: an unpriced model must
# not make a cost budget blind; a free local model is given its price (0) in settings instead.
UNKNOWN_COST_USD_PER_MTOK: Final = 15.0
# How to make an unknown price known: every message about unpriced tokens ends with it.
UNPRICED_HINT: Final = "give the model a `cost` in settings (providers.<name>.models) to count it exactly"


@dataclass(frozen=True)
class TreeBudget:
    """The run's tree-wide budget (``treeBudget`` {maxCostUsd, maxTokens, unknownCostPerMTokUsd}), checked before
    every launch and every model call against the run's usage totals (the ledger's `usage_totals()`).

    Tokens of calls whose price is unknown (``unknown_cost_tokens``) are charged at ``unknown_usd_per_mtok``: an
    unpriced model must not make a cost budget blind."""

    max_cost_usd: float | None = None
    max_tokens: int | None = None
    unknown_usd_per_mtok: float = UNKNOWN_COST_USD_PER_MTOK

    def charged_usd(self, totals: Mapping[str, Any]) -> float:
        """What the cost budget counts: the known cost plus the unknown-price tokens at the configured rate."""
        unknown = int(totals.get("unknown_cost_tokens") or 0)
        return float(totals.get("cost_usd") or 0.0) + unknown * self.unknown_usd_per_mtok / 1_000_000

    def unknown_note(self, totals: Mapping[str, Any]) -> str:
        """How unknown-price tokens were charged, for a budget message ('' when there are none)."""
        unknown = int(totals.get("unknown_cost_tokens") or 0)
        if not unknown:
            return ""
        return (f"; {unknown} tokens at unknown prices counted at ${self.unknown_usd_per_mtok:g}/Mtok "
                f"(legion.budget.unknownCostPerMTokUsd; {UNPRICED_HINT})")

    def refusal(self, totals: Mapping[str, Any]) -> str | None:
        """Why the next turn may not run given the run's usage totals, or None."""
        tokens = int(totals.get("tokens_in") or 0) + int(totals.get("tokens_out") or 0)
        if self.max_cost_usd is not None:
            cost = self.charged_usd(totals)
            if cost >= self.max_cost_usd:
                return (f"budget: the run's tree-wide cost budget is spent (${cost:.4f} of ${self.max_cost_usd:.4f}"
                        f"{self.unknown_note(totals)}); the run stops here")
        if self.max_tokens is not None and tokens >= self.max_tokens:
            return f"budget: the run's tree-wide token budget is spent ({tokens} of {self.max_tokens}); the run stops here"
        return None

    def spec(self) -> dict[str, Any]:
        """The ``treeBudget`` of a session spec."""
        out: dict[str, Any] = {"unknownCostPerMTokUsd": self.unknown_usd_per_mtok}
        if self.max_cost_usd is not None:
            out["maxCostUsd"] = self.max_cost_usd
        if self.max_tokens is not None:
            out["maxTokens"] = self.max_tokens
        return out
