"""The fleet-wide cost budget (`legion.budget.fleetMaxCostUsd`): one limit shared by every run of a project that
records into one PostgreSQL ledger (docs/servers.md "Fleet-wide budget").

The rule is the tree-wide budget's (`launch._check_budgets`): a launch is refused (`BUDGET_EXCEEDED`, scope
`fleet-cost`, a `budget_refused` event) when spent + reserved + its own reserve > the limit, where
- spent is what every run of the project spent (known cost plus unknown-price tokens at
  `legion.budget.unknownCostPerMTokUsd`, exactly as the tree budget charges them): this run's usage and, through
  `runs.project`, the other runs' (ended ones too: the budget is the project's, not one run's);
- reserved is what this run's live launches hold and the `runs.reserved_usd` of the project's other live runs.
The check runs in the reserving transaction under the project's `fleets` row lock (`legion.ledger.fleet_budget`),
and this run's `runs.reserved_usd` is kept equal to what it holds: written there, again whenever a reservation
is released, every REFRESH_S while it holds anything (so a live run's reservation never looks stale to the
others), and 0 when the run ends.

On SQLite a ledger holds one run: the budget sees and limits this run alone (said once at run start).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from loguru import logger

from legion.agents import Settings
from legion.ledger import Ledger
from legion.ledger.fleet_budget import FleetOthers, clear_reserved, fleet_others, lock_fleet, set_reserved
from legion.ledger.writer import LedgerWriter
from legion.orchestration.refusals import BUDGET_EXCEEDED, ActionRefused
from legion.workers.tree_budget import UNKNOWN_COST_USD_PER_MTOK, TreeBudget

# how often a run holding a reservation rewrites it (refreshing runs.updated_at): well inside the bound after
# which the other runs take it for a dead run's (legion.ledger.fleet_budget.STALE_RESERVATION_MS)
REFRESH_S: Final = 5.0
SQLITE_NOTE: Final = ("legion.budget.fleetMaxCostUsd: a fleet-wide budget needs a shared PostgreSQL ledger "
                      "(legion.ledger.url); with this run's SQLite ledger it sees and limits this run alone")


@dataclass
class FleetBudget:
    """One run's share of its project's fleet-wide cost budget."""

    project: str
    max_cost_usd: float
    run_id: str
    shared: bool  # a PostgreSQL ledger (other runs visible); False: SQLite, this run alone
    charge: TreeBudget = field(default_factory=TreeBudget)  # the unknown-price rate, as the tree budget's
    _task: asyncio.Task[None] | None = None

    # ----- in the reserving transaction (the writer thread) -----------------------------------------------------
    def check(self, led: Ledger, held: float, reserve: float) -> None:
        """Lock the project's fleet row, then refuse when spent + reserved + `reserve` > the limit (`held`: what
        this run's live launches hold now)."""
        lock_fleet(led, self.project)
        others = fleet_others(led, self.project, self.run_id) if self.shared else FleetOthers()
        totals = led.usage_totals()
        mine = self.charge.charged_usd(totals)
        theirs = self.charge.charged_usd({"cost_usd": others.cost_usd,
                                          "unknown_cost_tokens": others.unknown_cost_tokens})
        spent, reserved = mine + theirs, held + others.reserved_usd
        if spent + reserved + reserve <= self.max_cost_usd:
            return
        unknown = int(totals.get("unknown_cost_tokens") or 0) + others.unknown_cost_tokens
        raise ActionRefused(
            f"the fleet-wide cost budget of project '{self.project}' would be exceeded: spent ${spent:.4f} (this "
            f"run ${mine:.4f}, {others.spent_runs} other runs ${theirs:.4f}) + reserved ${reserved:.4f} (this run "
            f"${held:.4f}, {others.reserving_runs} other live runs ${others.reserved_usd:.4f}) + this launch's "
            f"${reserve:.4f} > ${self.max_cost_usd:.4f} (legion.budget.fleetMaxCostUsd"
            f"{'' if self.shared else '; a SQLite ledger: this run alone'}"
            f"{self.charge.unknown_note({'unknown_cost_tokens': unknown})}); wait for the project's other runs, "
            "or raise legion.budget.fleetMaxCostUsd",
            BUDGET_EXCEEDED, scope="fleet-cost", project=self.project, limit=self.max_cost_usd, spent=spent,
            reserved=reserved, spent_this_run=mine, spent_other_runs=theirs, reserved_this_run=held,
            reserved_other_runs=others.reserved_usd, unknown_cost_tokens=unknown)

    def record(self, led: Ledger, held: float) -> None:
        """This run's `runs.reserved_usd` is `held` (in the caller's transaction when there is one)."""
        set_reserved(led, self.run_id, self.project, held)

    # ----- on the event loop ------------------------------------------------------------------------------------
    def publish(self, writer: LedgerWriter | None, ledger: Ledger, held: Callable[[], float]) -> None:
        """Write what the run holds now (a reservation was released): `held` is read when the write runs, on the
        writer thread after every launch reserved before it, so the row never goes back to an older figure."""
        if writer is None:
            self._record_now(ledger, held())
            return
        try:
            writer.submit_latest(("fleet-reserved", self.run_id), lambda led: self.record(led, held()),
                                 "the run's fleet-budget reservation")
        except Exception as exc:  # the writer closed (the run is ending): `ended` writes 0
            logger.debug("fleet reservation not written: {!r}", exc)

    def _record_now(self, ledger: Ledger, held: float) -> None:
        try:
            self.record(ledger, held)
        except Exception as exc:  # a stale figure is bounded by the stale-reservation rule; the run goes on
            logger.warning("fleet reservation not written: {!r}", exc)

    def start(self, writer: LedgerWriter | None, ledger: Ledger, held: Callable[[], float]) -> None:
        """Keep this run's reservation fresh while it holds anything (see REFRESH_S)."""
        if not self.shared:
            logger.warning("{}", SQLITE_NOTE)
        self._task = asyncio.ensure_future(self._refresh(writer, ledger, held))

    async def _refresh(self, writer: LedgerWriter | None, ledger: Ledger, held: Callable[[], float]) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            if held() > 0:
                self.publish(writer, ledger, held)

    async def ended(self, open_ledger: Callable[[], Ledger]) -> None:
        """The run is over (every node settled or paused, its writer closed): it holds nothing."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

        def clear() -> None:
            with contextlib.closing(open_ledger()) as led:
                clear_reserved(led, self.run_id)

        try:
            await asyncio.to_thread(clear)
        except Exception as exc:
            logger.warning("the run's fleet-budget reservation was not cleared ({!r}); the other runs stop counting "
                           "it once its runs row is stale", exc)

    def spec(self) -> dict[str, Any]:
        """The `fleetBudget` of a session spec (what a session checks before each model call)."""
        return {"maxCostUsd": self.max_cost_usd, "project": self.project,
                "unknownCostPerMTokUsd": self.charge.unknown_usd_per_mtok}


def fleet_budget(settings: Settings, project: str, run_id: str, backend: str) -> FleetBudget | None:
    """The run's fleet budget from `legion.budget.fleetMaxCostUsd` (None: unset)."""
    limit = settings.get("legion.budget.fleetMaxCostUsd")
    if not isinstance(limit, int | float) or isinstance(limit, bool):
        return None
    rate = settings.get("legion.budget.unknownCostPerMTokUsd")
    rate = float(rate) if isinstance(rate, int | float) and not isinstance(rate, bool) else UNKNOWN_COST_USD_PER_MTOK
    return FleetBudget(project, float(limit), run_id, backend == "postgresql", TreeBudget(unknown_usd_per_mtok=rate))
