"""The `runs` table (schema v5): one row per run recorded in the database — where it runs, its state, the
endpoints an operator attaches to, its heartbeat — and the fleet-wide reads of the fleet view
(docs/servers.md, "A fleet").

- A run's root upserts its row when it starts (`register_run`), follows run.json's status with `set_run_state`
  (`ended_at` is set once the state is not a live one) and refreshes `updated_at` every heartbeat interval
  (`run_heartbeat`). Each write names only the columns it owns: `reserved_usd` belongs to the fleet budget.
- `list_runs` reads every run in the database (never scoped to one run: the table is keyed by run), filtered by
  run, host, project and state. `lost` is a derived state, never written: a live row whose heartbeat is older than
  LOST_AFTER_BEATS intervals (its host or root died without recording an end).
- `fleet_figures` and `fleet_events_after` read nodes, usage and events across runs. On PostgreSQL they group by
  the `run` column; on SQLite a file holds one run, so they read the file's rows under that run's id.

A fleet reader on PostgreSQL is a Ledger opened with `ledger.open_fleet_ledger`: its run scope is FLEET_SCOPE,
which no run has, so nothing it runs through the one-run queries can read or write a run's rows.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Final

from sqlalchemy import ColumnElement, Integer, bindparam, case, func, select

from legion.ledger.base import LedgerBase
from legion.ledger.constants import LIVE_STATUSES
from legion.ledger.errors import LedgerError
from legion.ledger.events import Event, decode_event
from legion.ledger.sql import Sql

FLEET_SCOPE: Final = ""  # the run scope of a fleet reader: run ids are 1 to 128 characters, so no run has it
LIVE_RUN_STATES: Final = ("starting", "running")  # a run's root is (or should be) up: it keeps a heartbeat
LOST: Final = "lost"
HEARTBEAT_S: Final = 5.0  # how often a run's root refreshes its row's updated_at
HEARTBEAT_ENV: Final = "LEGION_FLEET_HEARTBEAT_S"  # overrides HEARTBEAT_S, for the root and the fleet view alike
LOST_AFTER_BEATS: Final = 3

_OWN = ("project", "host", "pid", "state", "control_endpoint", "monitor_endpoint", "server_key")
_UPSERT = (f"INSERT INTO runs (run, {', '.join(_OWN)}, started_at, updated_at, ended_at) "
           f"VALUES ({{p}}, {', '.join('{p}' for _ in _OWN)}, {{p}}, {{p}}, NULL) "
           f"ON CONFLICT (run) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in _OWN)}, "
           "updated_at = excluded.updated_at, ended_at = NULL")
UPSERT_RUN_SQL = Sql(_UPSERT.replace("{p}", "?"), _UPSERT.replace("{p}", "%s"))
_SET_STATE = "UPDATE runs SET state = {p}, updated_at = {p}, ended_at = {p} WHERE run = {p}"
SET_RUN_STATE_SQL = Sql(_SET_STATE.replace("{p}", "?"), _SET_STATE.replace("{p}", "%s"))
_BEAT = "UPDATE runs SET updated_at = {p} WHERE run = {p}"
RUN_HEARTBEAT_SQL = Sql(_BEAT.replace("{p}", "?"), _BEAT.replace("{p}", "%s"))


def heartbeat_interval(env: dict[str, str] | None = None) -> float:
    """HEARTBEAT_S, or LEGION_FLEET_HEARTBEAT_S when it is a number of seconds in (0, 3600]."""
    raw = (os.environ if env is None else env).get(HEARTBEAT_ENV, "").strip()
    if not raw:
        return HEARTBEAT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= 3600:
        raise LedgerError(f"{HEARTBEAT_ENV}={raw!r} is not a number of seconds in (0, 3600]; unset it for the "
                          f"default {HEARTBEAT_S:g}")
    return value


@dataclass(frozen=True, slots=True)
class RunRow:
    """One row of `runs`; `shown` is the state to display: the stored one, or `lost`."""

    run: str
    project: str | None
    host: str | None
    pid: int | None
    state: str
    control_endpoint: str | None
    monitor_endpoint: str | None
    server_key: str | None
    reserved_usd: float
    started_at: int
    updated_at: int
    ended_at: int | None
    shown: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def shown_state(state: str, updated_at: int, now_ms: int, interval_s: float) -> str:
    """`lost` for a live state whose heartbeat is older than LOST_AFTER_BEATS intervals, else the state."""
    if state in LIVE_RUN_STATES and now_ms - updated_at > LOST_AFTER_BEATS * interval_s * 1000:
        return LOST
    return state


def _states(state: str | Iterable[str] | None) -> set[str] | None:
    if state is None:
        return None
    return {state} if isinstance(state, str) else set(state)


class RunsMixin(LedgerBase):
    """The runs table: a run's own row, and every run's rows for the fleet view."""

    def register_run(self, run_id: str, *, state: str, project: str | None = None, host: str | None = None,
                     pid: int | None = None, control_endpoint: str | None = None,
                     monitor_endpoint: str | None = None, server_key: str | None = None) -> None:
        """Upsert this run's row (a new root of a resumed run takes it over); `started_at` stays the first start's
        and `reserved_usd` is never touched."""
        now = self._now()
        values = (run_id, project, host, pid, state, control_endpoint, monitor_endpoint, server_key, now, now)
        with self._db.write_row() as raw:
            raw.execute(UPSERT_RUN_SQL, values)

    def set_run_state(self, run_id: str, state: str) -> None:
        """The run's state (run.json's status); `ended_at` is now for a state that is not a live one."""
        now = self._now()
        with self._db.write_row() as raw:
            raw.execute(SET_RUN_STATE_SQL, (state, now, None if state in LIVE_RUN_STATES else now, run_id))

    def run_heartbeat(self, run_id: str) -> None:
        """The root is alive: refresh the row's updated_at."""
        with self._db.write_row() as raw:
            raw.execute(RUN_HEARTBEAT_SQL, (self._now(), run_id))

    def list_runs(self, *, run: str | None = None, host: str | None = None, project: str | None = None,
                  state: str | Iterable[str] | None = None, heartbeat_s: float | None = None) -> list[RunRow]:
        """Every run in the database (oldest first) that matches; `state` matches the shown state (`lost` too)."""
        runs = self._db.tables.runs
        criteria: list[ColumnElement[bool]] = []
        for column, value in (("run", run), ("host", host), ("project", project)):
            if value is not None:
                criteria.append(runs.c[column] == value)
        with self._db.read():
            rows = self._db.select(select(runs).where(*criteria).order_by(runs.c.started_at, runs.c.run))
        now, interval = self._now(), heartbeat_interval() if heartbeat_s is None else heartbeat_s
        found = [RunRow(**row, shown=shown_state(row["state"], row["updated_at"], now, interval)) for row in rows]
        wanted = _states(state)
        return [r for r in found if wanted is None or r.shown in wanted]

    def fleet_figures(self, run_ids: list[str]) -> dict[str, dict[str, Any]]:
        """Per run: nodes (total, live, failed), tokens in/out and cost."""
        if not run_ids:
            return {}
        t = self._db.tables
        nodes, usage = t.nodes, t.usage
        live = func.coalesce(func.sum(case((nodes.c.status.in_(LIVE_STATUSES), 1), else_=0)), 0)
        failed = func.coalesce(func.sum(case((nodes.c.status == "failed", 1), else_=0)), 0)
        counts = select(func.count().label("nodes"), live.label("live"), failed.label("failed"))
        sums = select(func.coalesce(func.sum(usage.c.tokens_in), 0).label("tokens_in"),
                      func.coalesce(func.sum(usage.c.tokens_out), 0).label("tokens_out"),
                      func.coalesce(func.sum(usage.c.cost_usd), 0.0).label("cost_usd"))
        if t.scoped:
            counts = counts.add_columns(nodes.c.run).where(nodes.c.run.in_(run_ids)).group_by(nodes.c.run)
            sums = sums.add_columns(usage.c.run).where(usage.c.run.in_(run_ids)).group_by(usage.c.run)
        with self._db.read():
            count_rows, sum_rows = self._db.select(counts), self._db.select(sums)
        figures = {r: {"nodes": 0, "live": 0, "failed": 0, "tokens_in": 0, "tokens_out": 0, "cost_usd": 0.0}
                   for r in run_ids}
        for row in (*count_rows, *sum_rows):
            run = row.pop("run", None) if t.scoped else run_ids[0]  # SQLite: the file's one run
            if run in figures:  # PostgreSQL sums BIGINT as NUMERIC: ints and a float on both backends
                figures[run].update({k: float(v) if k == "cost_usd" else int(v) for k, v in row.items()})
        return figures

    def fleet_events_after(self, cursors: dict[str, int], limit: int = 1000) -> list[tuple[str, Event]]:
        """Each run's events after its own cursor (ids are committed in order within a run, not across runs), up
        to `limit` per run, as (run, event) in run order then id order."""
        if limit <= 0:
            raise LedgerError(f"fleet_events_after: limit must be positive, got {limit}")
        t = self._db.tables
        events = t.events
        stmt = select(*t.cols(events)).where(events.c.id > bindparam("cursor", type_=Integer))
        if t.scoped:
            stmt = stmt.where(events.c.run == bindparam("run"))
        stmt = stmt.order_by(events.c.id).limit(bindparam("limit"))
        found: list[tuple[str, Event]] = []
        with self._db.read():
            for run, cursor in cursors.items():
                rows = self._db.select(stmt, {"cursor": cursor, "run": run, "limit": limit}, key="fleet_events_after")
                found.extend((run, decode_event(row)) for row in rows)
        return found
