"""How the operator's reports write a cost: a known figure, and "unknown" where a model has no price.

A call whose model neither settings nor genai-prices can price has an unknown cost (never 0); the ledger counts
its tokens in `usage.unknown_cost_tokens`. Every report shows such a cost as `$x+?` and says how many tokens it
covers, so nobody reads a partial figure as the run's cost.
"""

from __future__ import annotations

from legion.workers.tree_budget import UNPRICED_HINT


def cost_text(cost_usd: float, unknown_tokens: int) -> str:
    """`$0.0123`, or `$0.0123+?` when part of the cost is unknown."""
    return f"${cost_usd:.4f}" + ("+?" if unknown_tokens > 0 else "")


def unknown_note(unknown_tokens: int) -> str:
    """The words after a total whose cost is partly unknown ('' when it is all known)."""
    if unknown_tokens <= 0:
        return ""
    return f" + unknown ({unknown_tokens} tokens of unpriced models; {UNPRICED_HINT})"
