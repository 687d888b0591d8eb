"""The usage table: one row per node holding its latest token/cost snapshot (upsert).

`cost_usd` is the cost of the calls whose price is known; `unknown_cost_tokens` counts the tokens of the calls
whose price is not (schema v4). A report shows such cost as unknown, never as 0; a cost budget charges those
tokens at a configured rate (`workers.tree_budget.TreeBudget`).
"""

from __future__ import annotations

import math
import sqlite3
from typing import Any

from sqlalchemy import Select, bindparam, func, select

from legion.ledger.base import LedgerBase
from legion.ledger.errors import LedgerError, NodeNotFoundError
from legion.ledger.schema import Tables
from legion.ledger.sql import RUN, IntegrityViolation, Sql

_UPSERT_SET = (
    "DO UPDATE SET tokens_in = excluded.tokens_in, tokens_out = excluded.tokens_out, "
    "cost_usd = excluded.cost_usd, unknown_cost_tokens = excluded.unknown_cost_tokens, "
    "updated_at = excluded.updated_at"
)
UPSERT_USAGE_SQL = Sql(
    "INSERT INTO usage (node_id, tokens_in, tokens_out, cost_usd, unknown_cost_tokens, updated_at) "
    f"VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(node_id) {_UPSERT_SET}",
    "INSERT INTO usage (run, node_id, tokens_in, tokens_out, cost_usd, unknown_cost_tokens, updated_at) "
    f"VALUES ({RUN}, %s, %s, %s, %s, %s, %s) ON CONFLICT(run, node_id) {_UPSERT_SET}",
)


# a snapshot taken at a known time (`taken_at`) never replaces a row written after it: the root records an rpc
# session's settle-time snapshot, which may land after the worker itself wrote a newer one
UPSERT_USAGE_IF_NEWER_SQL = Sql(
    UPSERT_USAGE_SQL + " WHERE usage.updated_at <= excluded.updated_at",
    UPSERT_USAGE_SQL.pg + " WHERE usage.updated_at <= excluded.updated_at",
)


def _get_usage(t: Tables) -> Select[Any]:
    return select(*t.cols(t.usage)).where(*t.scope(t.usage), t.usage.c.node_id == bindparam("id"))


def check_usage(tokens_in: object, tokens_out: object, cost_usd: object, unknown: object,
                taken_at: object = None) -> None:
    """LedgerError naming the first value a usage row cannot hold (`taken_at`: None, or epoch ms)."""
    for label, value in (("tokens_in", tokens_in), ("tokens_out", tokens_out), ("unknown_cost_tokens", unknown)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise LedgerError(f"upsert_usage: {label} must be a non-negative int, got {value!r}")
    if not isinstance(cost_usd, int | float) or isinstance(cost_usd, bool) or not math.isfinite(cost_usd) or cost_usd < 0:
        raise LedgerError(f"upsert_usage: cost_usd must be a finite non-negative number, got {cost_usd!r}")
    if taken_at is not None and (not isinstance(taken_at, int) or isinstance(taken_at, bool) or taken_at <= 0):
        raise LedgerError(f"upsert_usage: taken_at must be a positive epoch-ms int, got {taken_at!r}")


class UsageMixin(LedgerBase):
    """Usage snapshots (the session engine reports cumulative totals; the last one wins)."""

    def upsert_usage(self, node_id: str, tokens_in: int, tokens_out: int, cost_usd: float,
                     unknown_cost_tokens: int = 0, *, taken_at: int | None = None) -> None:
        """Store the node's cumulative usage (`unknown_cost_tokens`: those of calls whose price is unknown).
        `taken_at` (epoch ms): when the snapshot was taken; it is then stored only if the node's row is not newer."""
        check_usage(tokens_in, tokens_out, cost_usd, unknown_cost_tokens, taken_at)
        try:
            with self._db.write_row() as raw:
                raw.execute(UPSERT_USAGE_SQL if taken_at is None else UPSERT_USAGE_IF_NEWER_SQL,
                            (node_id, tokens_in, tokens_out, float(cost_usd), unknown_cost_tokens,
                             self._now() if taken_at is None else taken_at))
        except (sqlite3.IntegrityError, IntegrityViolation) as exc:
            raise NodeNotFoundError(node_id) from exc

    def get_usage(self, node_id: str) -> dict[str, Any] | None:
        with self._db.read():
            rows = self._db.select(_get_usage, {"id": node_id}, key="get_usage")
        return rows[0] if rows else None

    def usage_totals(self, node_ids: list[str] | None = None, *,
                     excluding: list[str] | None = None) -> dict[str, Any]:
        """Sum of tokens, known cost and unknown-price tokens over the given nodes (all nodes when None), less the
        nodes `excluding` names (one statement: one snapshot, however the writes land meanwhile)."""
        t = self._db.tables
        usage = t.usage
        stmt = select(
            func.coalesce(func.sum(usage.c.tokens_in), 0).label("tokens_in"),
            func.coalesce(func.sum(usage.c.tokens_out), 0).label("tokens_out"),
            func.coalesce(func.sum(usage.c.cost_usd), 0.0).label("cost_usd"),
            func.coalesce(func.sum(usage.c.unknown_cost_tokens), 0).label("unknown_cost_tokens"),
        ).where(*t.scope(usage))
        if node_ids is not None:
            stmt = stmt.where(usage.c.node_id.in_(node_ids))
        if excluding:
            stmt = stmt.where(usage.c.node_id.not_in(excluding))
        with self._db.read():
            row = self._db.select(stmt)[0]
        # PostgreSQL sums BIGINT as NUMERIC (a Decimal); the figures are ints and a float on both backends
        return {key: float(value) if key == "cost_usd" else int(value) for key, value in row.items()}
