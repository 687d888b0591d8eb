"""The fleet-wide cost budget as a session checks it before each model call (``fleetBudget`` of a session spec;
docs/servers.md "Fleet-wide budget").

What the run spent is read as the tree-wide gate reads it (every call: the run's usage totals); what the project's
other runs spent is read at most every OTHERS_REFRESH_S per worker process (one indexed query over the
project's runs, `legion.ledger.fleet_budget.fleet_others`). So overspend is bounded by one in-flight turn per live
session of each run, plus what the other runs spent in that interval. Launches are held to the exact rule
(reservations under the project's row lock): `legion.orchestration.fleet_budget`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from legion.ledger.fleet_budget import fleet_others
from legion.workers.tree_budget import TreeBudget

if TYPE_CHECKING:
    from legion.ledger import Ledger

OTHERS_REFRESH_S: Final = 2.0


@dataclass(frozen=True)
class FleetLimit:
    """The project's fleet-wide cost limit (``fleetBudget`` {maxCostUsd, project, unknownCostPerMTokUsd})."""

    max_cost_usd: float
    project: str
    charge: TreeBudget  # the unknown-price rate, charged as the tree budget charges it

    def refusal(self, spent: float) -> str | None:
        """Why the next turn may not run when the project's runs have spent `spent`, or None."""
        if spent < self.max_cost_usd:
            return None
        return (f"budget: the fleet-wide cost budget of project '{self.project}' is spent (${spent:.4f} of "
                f"${self.max_cost_usd:.4f} over the project's runs, legion.budget.fleetMaxCostUsd); the run stops here")


class OtherRuns:
    """What the project's other runs spent, charged at the limit's rate; read again after OTHERS_REFRESH_S."""

    def __init__(self, ledger: Ledger, run: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.ledger = ledger
        self.run = run
        self.clock = clock
        self._cache: dict[str, tuple[float, float]] = {}  # project -> (read at, charged)

    def charged(self, limit: FleetLimit) -> float:
        now = self.clock()
        hit = self._cache.get(limit.project)
        if hit is not None and now - hit[0] < OTHERS_REFRESH_S:
            return hit[1]
        others = fleet_others(self.ledger, limit.project, self.run, reservations=False)
        value = limit.charge.charged_usd({"cost_usd": others.cost_usd,
                                          "unknown_cost_tokens": others.unknown_cost_tokens})
        self._cache[limit.project] = (now, value)
        return value


def fleet_gate(limit: FleetLimit, run_totals: Callable[[], Mapping[str, Any]],
               others: OtherRuns) -> Callable[[], str | None]:
    """Before each model call: this run's spend (fresh) plus the other runs' (cached) against the limit."""

    def gate() -> str | None:
        return limit.refusal(limit.charge.charged_usd(run_totals()) + others.charged(limit))

    return gate
