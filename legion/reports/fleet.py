"""The fleet view's read model: every run a ledger database holds, from its `runs` table with each run's figures
(nodes, cost), and the events of many runs (docs/servers.md, "A fleet").

`open_fleet(target)` refuses what cannot be a fleet ledger before anything is opened: a SQLite path that does not
exist (opening one would create it). `Filters` are the commands' `--run`, `--host`, `--state` and `--project`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from legion.ledger import Ledger
    from legion.ledger.fleet_runs import RunRow


class FleetError(Exception):
    """The fleet view cannot show what was asked (an unknown run, a run without a tcp monitor); the message says
    what to do."""


@dataclass(frozen=True)
class Filters:
    run: str | None = None
    host: str | None = None
    states: tuple[str, ...] | None = None
    project: str | None = None


def open_fleet(target: str) -> Ledger:
    """A reader of every run in the ledger at `target` (a postgresql:// URL, or a legion.db file)."""
    from legion.ledger import open_fleet_ledger
    from legion.ledger.target import is_url

    if not is_url(target) and not Path(target).is_file():
        raise FleetError(f"no ledger at {target}: pass a postgresql://USER@HOST:PORT/DATABASE URL (or the path of a "
                         "run's legion.db)")
    return open_fleet_ledger(target)


def select_runs(fleet: Ledger, filters: Filters) -> list[RunRow]:
    """The runs that match; an unknown `--run` is an error that names the runs there are."""
    rows = fleet.list_runs(run=filters.run, host=filters.host, project=filters.project, state=filters.states)
    if filters.run is not None and not rows and not fleet.list_runs(run=filters.run):
        known = [r.run for r in fleet.list_runs()]
        shown = ", ".join(known[-10:]) or "none"
        raise FleetError(f"no run '{filters.run}' in this ledger (runs there: {shown}{' …' if len(known) > 10 else ''})")
    return rows


def run_rows(fleet: Ledger, runs: list[RunRow]) -> list[dict[str, Any]]:
    """Each run's row with its figures and its heartbeat's age in seconds."""
    figures = fleet.fleet_figures([r.run for r in runs])
    now = time.time() * 1000
    return [{**r.as_dict(), **figures[r.run], "heartbeat_age_s": round(max(0.0, now - r.updated_at) / 1000, 1)}
            for r in runs]


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The fleet's totals over `rows`: runs by shown state, nodes, tokens, cost."""
    states: dict[str, int] = {}
    for row in rows:
        states[row["shown"]] = states.get(row["shown"], 0) + 1
    return {"runs": len(rows), "states": states,
            **{key: sum(row[key] for row in rows) for key in ("nodes", "live", "failed", "tokens_in", "tokens_out")},
            "cost_usd": round(sum(row["cost_usd"] for row in rows), 6)}
