"""The ledger side of a fleet-wide cost budget (`legion.budget.fleetMaxCostUsd`, docs/servers.md "Fleet-wide budget").

A fleet is every run of one project (`runs.project`) in one database. A launch checks the budget inside its
reserving transaction (on the run's ledger writer thread):

    lock_fleet(led, project)                      # the project's `fleets` row, made if missing, locked FOR UPDATE
    others = fleet_others(led, project, run)      # what the project's other runs spent and hold
    ... spent = others + this run's usage; check spent + reserved + this launch's reserve against the limit ...
    set_reserved(led, run, project, held)         # this run's `runs.reserved_usd`: what its live launches hold

The lock serialises every check of one project across runs and hosts, so two runs never both reserve the last
dollar: a run's `reserved_usd` is written in the transaction that holds the lock, and the next holder (READ
COMMITTED: each statement sees what committed before it) reads it. On SQLite the write transaction is already
exclusive and a file holds one run, so the other runs' figures are zero.

A run that died keeps its last `reserved_usd` with `ended_at` NULL; its reservation stops counting once its row
has not been refreshed for `STALE_RESERVATION_MS` (a live run's heartbeat refreshes `runs.updated_at` every few
seconds, and so does its own fleet budget while it holds anything).

Spent is read through the indexes: `runs(project)` finds the project's runs, the usage key `(run, node_id)` their
usage rows (no scan of other projects' rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from legion.ledger.sql import Sql

if TYPE_CHECKING:
    from legion.ledger.ledger import Ledger

# A run whose `runs` row was not refreshed for this long is taken for dead: what it reserved no longer counts
# (its spent usage always does). Six missed heartbeats of 5 s.
STALE_RESERVATION_MS: Final = 30_000

_INSERT_FLEET = Sql(
    "INSERT INTO fleets (project, created_at) VALUES (?, ?) ON CONFLICT (project) DO NOTHING",
    "INSERT INTO fleets (project, created_at) VALUES (%s, %s) ON CONFLICT (project) DO NOTHING",
)
_LOCK_FLEET = Sql(
    "SELECT project FROM fleets WHERE project = ?",  # the write transaction (BEGIN IMMEDIATE) is the lock
    "SELECT project FROM fleets WHERE project = %s FOR UPDATE",
)
# what the project's other runs spent (ended or not); never asked on SQLite, where a file holds one run's usage
_OTHERS_SPENT = Sql(
    "SELECT 0.0, 0, 0",
    "SELECT COALESCE(SUM(u.cost_usd), 0), COALESCE(SUM(u.unknown_cost_tokens), 0), COUNT(DISTINCT r.run) "
    "FROM runs r JOIN usage u ON u.run = r.run WHERE r.project = %s AND r.run <> %s",
)
# what the project's other live runs hold (a row refreshed since the stale bound)
_OTHERS_RESERVED = Sql(
    "SELECT COALESCE(SUM(reserved_usd), 0), COUNT(*) FROM runs "
    "WHERE project = ? AND run <> ? AND ended_at IS NULL AND updated_at >= ? AND reserved_usd > 0",
    "SELECT COALESCE(SUM(reserved_usd), 0), COUNT(*) FROM runs "
    "WHERE project = %s AND run <> %s AND ended_at IS NULL AND updated_at >= %s AND reserved_usd > 0",
)
# only reserved_usd and updated_at of an existing row: the run's other columns are the fleet view's
_UPSERT_RESERVED_SET = "DO UPDATE SET reserved_usd = excluded.reserved_usd, updated_at = excluded.updated_at"
_UPSERT_RESERVED = Sql(
    "INSERT INTO runs (run, project, state, reserved_usd, started_at, updated_at) VALUES (?, ?, 'running', ?, ?, ?) "
    f"ON CONFLICT (run) {_UPSERT_RESERVED_SET}",
    "INSERT INTO runs (run, project, state, reserved_usd, started_at, updated_at) "
    f"VALUES (%s, %s, 'running', %s, %s, %s) ON CONFLICT (run) {_UPSERT_RESERVED_SET}",
)

# a run that ended holds nothing; a run that never reserved has no row of ours to clear
_CLEAR_RESERVED = Sql(
    "UPDATE runs SET reserved_usd = 0, updated_at = ? WHERE run = ? AND reserved_usd <> 0",
    "UPDATE runs SET reserved_usd = 0, updated_at = %s WHERE run = %s AND reserved_usd <> 0",
)


@dataclass(frozen=True)
class FleetOthers:
    """The project's other runs: what they spent (known cost, unknown-price tokens) and what the live ones hold."""

    cost_usd: float = 0.0
    unknown_cost_tokens: int = 0
    spent_runs: int = 0  # other runs with usage
    reserved_usd: float = 0.0
    reserving_runs: int = 0  # other live runs holding a reservation


def lock_fleet(led: Ledger, project: str) -> None:
    """Inside a write transaction: make the project's `fleets` row if missing and lock it until the commit."""
    db = led._db
    with db.write() as raw:
        raw.execute(_INSERT_FLEET, (project, led._now()))
        raw.execute(_LOCK_FLEET, (project,)).fetchall()


def fleet_others(led: Ledger, project: str, run: str, *, reservations: bool = True) -> FleetOthers:
    """What the project's runs other than `run` spent, and (with `reservations`) what the live ones hold
    (a row not refreshed for STALE_RESERVATION_MS is a dead run's: its reservation is left out)."""
    db = led._db
    with db.read() as raw:
        cost, unknown, spent_runs = (raw.execute(_OTHERS_SPENT, (project, run)).fetchone()
                                     if db.backend == "postgresql" else (0.0, 0, 0))
        held, holders = 0.0, 0
        if reservations:
            bound = led._now() - STALE_RESERVATION_MS
            held, holders = raw.execute(_OTHERS_RESERVED, (project, run, bound)).fetchone()
    return FleetOthers(float(cost), int(unknown), int(spent_runs), float(held), int(holders))


def set_reserved(led: Ledger, run: str, project: str, usd: float) -> None:
    """This run's `runs.reserved_usd` (and `updated_at`); the row is made when the fleet view has not yet."""
    now = led._now()
    with led._db.write_row() as raw:
        raw.execute(_UPSERT_RESERVED, (run, project, max(0.0, float(usd)), now, now))


def clear_reserved(led: Ledger, run: str) -> None:
    """The run ended: its `runs.reserved_usd` is 0 (no row is made for a run that never reserved)."""
    with led._db.write_row() as raw:
        raw.execute(_CLEAR_RESERVED, (led._now(), run))
