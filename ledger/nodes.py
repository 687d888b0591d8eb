"""The nodes table: insert/update/heartbeat, the slug rule, six statuses, and subtree by recursive CTE."""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy import ColumnElement, Select, bindparam, literal, select

from legion.ledger.base import LedgerBase
from legion.ledger.constants import (
    DEFAULT_SUBTREE_MAX_DEPTH,
    LIVE_STATUSES,
    NODE_KINDS,
    NODE_SLUG_PATTERN,
    NODE_SLUG_RE,
    NODE_STATUSES,
)
from legion.ledger.errors import InvalidNodeError, NodeNotFoundError
from legion.ledger.schema import NODE_COLUMNS, Tables
from legion.ledger.sql import RUN, IntegrityViolation, Sql, constraint_kind, plain_text

_UPDATABLE = frozenset(NODE_COLUMNS) - {"id", "created_at", "updated_at"}
_MAX_ID_CHARS = 256
_SUBTREE_HARD_CAP = 1024

_LIVE_IN = "status IN (" + ", ".join(f"'{status}'" for status in LIVE_STATUSES) + ")"
_COUNT_LIVE_SQL = Sql(  # idx_nodes_status alone (a covering count)
    f"SELECT count(*) FROM nodes WHERE {_LIVE_IN}",
    f"SELECT count(*) FROM nodes WHERE run = {RUN} AND {_LIVE_IN}",
)
_COUNT_LIVE_CHILDREN_SQL = Sql(  # idx_nodes_parent
    f"SELECT count(*) FROM nodes WHERE parent_id = ? AND {_LIVE_IN}",
    f"SELECT count(*) FROM nodes WHERE run = {RUN} AND parent_id = %s AND {_LIVE_IN}",
)
_HEARTBEAT_SQL = Sql(
    "UPDATE nodes SET updated_at = ? WHERE id = ?",
    f"UPDATE nodes SET updated_at = %s WHERE run = {RUN} AND id = %s",
)
_INSERT_COLUMNS = ("id, parent_id, name, role, kind, depth, run_id, session_file, worktree_path, model, "
                   "team, status, phase, phase_since, rework_count, task_summary, created_at, updated_at")
_INSERT_SQL = Sql(
    f"INSERT INTO nodes ({_INSERT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,0,?,?,?)",
    f"INSERT INTO nodes (run, {_INSERT_COLUMNS}) VALUES ({RUN}, {', '.join(['%s'] * 14)}, 0, %s, %s, %s)",
)


def _update_sql(columns: list[str]) -> Sql:
    return Sql(
        "UPDATE nodes SET " + ", ".join(f"{column} = ?" for column in columns) + " WHERE id = ?",
        "UPDATE nodes SET " + ", ".join(f"{column} = %s" for column in columns) + f" WHERE run = {RUN} AND id = %s",
    )


def validate_slug(name: object) -> str:
    """A node name must match NODE_SLUG_PATTERN exactly."""
    if not isinstance(name, str) or NODE_SLUG_RE.fullmatch(name) is None:
        raise InvalidNodeError(
            f"node name {name!r} does not match {NODE_SLUG_PATTERN} "
            "(lower-case letter first, then up to 31 of a-z 0-9 _ -)"
        )
    return name


def validate_status(status: object) -> str:
    if status not in NODE_STATUSES:
        raise InvalidNodeError(f"node status {status!r} is not one of {', '.join(NODE_STATUSES)}")
    return str(status)


def validate_kind(kind: object) -> str:
    if kind not in NODE_KINDS:
        raise InvalidNodeError(f"node kind {kind!r} is not one of {', '.join(NODE_KINDS)}")
    return str(kind)


def validate_node_id(node_id: object, what: str = "node id") -> str:
    if not isinstance(node_id, str) or not node_id or len(node_id) > _MAX_ID_CHARS or "\x00" in node_id:
        raise InvalidNodeError(f"{what} {node_id!r} must be a non-empty string of at most {_MAX_ID_CHARS} chars without NUL")
    return node_id


def _validate_field(column: str, value: Any) -> Any:
    if column == "status":
        return validate_status(value)
    if column == "name":
        return validate_slug(value)
    if column == "kind":
        return validate_kind(value)
    if column == "parent_id" and value is not None:
        return validate_node_id(value, "parent id")
    if column in ("depth", "rework_count") and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise InvalidNodeError(f"node {column} must be a non-negative int, got {value!r}")
    if column in ("role",) and (not isinstance(value, str) or not value):
        raise InvalidNodeError(f"node {column} must be a non-empty string, got {value!r}")
    return plain_text(value)  # free text: a NUL is stored as U+FFFD on both backends (sql.py)


def _get_node(t: Tables) -> Select[Any]:
    return select(*t.cols(t.nodes)).where(*t.scope(t.nodes), t.nodes.c.id == bindparam("id"))


def _subtree_query(t: Tables) -> Select[Any]:
    """Recursive CTE: the root (level 0) and descendants while level < :max_depth."""
    nodes = t.nodes
    base = select(nodes.c.id, literal(0).label("level")).where(*t.scope(nodes), nodes.c.id == bindparam("root"))
    tree = base.cte("tree", recursive=True)
    step = select(nodes.c.id, (tree.c.level + 1).label("level")).where(
        *t.scope(nodes), nodes.c.parent_id == tree.c.id, tree.c.level < bindparam("max_depth")
    )
    tree = tree.union_all(step)
    return (
        select(*t.cols(nodes), tree.c.level)
        .join(tree, tree.c.id == nodes.c.id)
        .where(*t.scope(nodes))
        .order_by(tree.c.level, nodes.c.created_at, nodes.c.id)
    )


class NodesMixin(LedgerBase):
    """Node rows: one per supervised session (root, teams, workers)."""

    def insert_node(
        self,
        *,
        id: str,
        name: str,
        role: str,
        depth: int,
        parent_id: str | None = None,
        kind: str = "native",
        status: str = "starting",
        run_id: str | None = None,
        session_file: str | None = None,
        worktree_path: str | None = None,
        model: str | None = None,
        team: str | None = None,
        phase: str | None = None,
        task_summary: str | None = None,
    ) -> None:
        """Insert a node; the parent (if any) must exist; phase_since starts now if a phase is given."""
        validate_node_id(id)
        for column, value in (("name", name), ("role", role), ("depth", depth), ("status", status), ("kind", kind)):
            _validate_field(column, value)
        if parent_id is not None:
            validate_node_id(parent_id, "parent id")
        now = self._now()
        text = (plain_text(v) for v in (role, run_id, session_file, worktree_path, model, team, phase, task_summary))
        role_, run_, session_, worktree_, model_, team_, phase_, summary_ = text
        row = (id, parent_id, name, role_, kind, depth, run_, session_, worktree_, model_, team_,
               status, phase_, now if phase is not None else None, summary_, now, now)
        try:
            with self._db.write() as raw:
                raw.execute(_INSERT_SQL, row)
        except (sqlite3.IntegrityError, IntegrityViolation) as exc:
            kind = constraint_kind(exc)
            if kind == "unique":
                raise InvalidNodeError(f"node id {id!r} already exists; node ids are unique per ledger") from exc
            if kind == "foreign key":
                raise NodeNotFoundError(str(parent_id)) from exc
            raise InvalidNodeError(f"node {id!r} rejected by the schema: {exc}") from exc

    def update_node(self, node_id: str, **fields: Any) -> None:
        """Set any nodes columns except id/created_at; updated_at is bumped.

        phase_since is never implied: a caller starting a phase stint (or reviving one, docs/spec-conformance.md §10 item 17)
        passes phase_since explicitly, so re-asserting the same phase does not move it.
        """
        unknown = set(fields) - _UPDATABLE
        if unknown:
            raise InvalidNodeError(
                f"update_node({node_id!r}): unknown or read-only column(s) {sorted(unknown)}; "
                f"updatable: {sorted(_UPDATABLE)}"
            )
        values = {column: _validate_field(column, value) for column, value in fields.items()}
        values["updated_at"] = self._now()
        try:
            with self._db.write() as raw:
                cur = raw.execute(_update_sql(list(values)), (*values.values(), node_id))
        except (sqlite3.IntegrityError, IntegrityViolation) as exc:
            raise InvalidNodeError(f"update_node({node_id!r}) rejected by the schema: {exc}") from exc
        if cur.rowcount == 0:
            raise NodeNotFoundError(node_id)

    def set_status(self, node_id: str, status: str) -> None:
        """Set one of the six statuses."""
        self.update_node(node_id, status=status)

    def heartbeat(self, node_id: str) -> None:
        """updated_at = now (the liveness stamp hygiene reads)."""
        with self._db.write_row() as raw:
            cur = raw.execute(_HEARTBEAT_SQL, (self._now(), node_id))
        if cur.rowcount == 0:
            raise NodeNotFoundError(node_id)

    def get_node(self, node_id: str) -> dict[str, Any] | None:
        with self._db.read():
            rows = self._db.select(_get_node, {"id": node_id}, key="get_node")
        return rows[0] if rows else None

    def list_nodes(self, *, statuses: tuple[str, ...] | None = None, run_id: str | None = None) -> list[dict[str, Any]]:
        """All nodes (optionally filtered), oldest first."""
        t = self._db.tables
        nodes = t.nodes
        criteria: list[ColumnElement[bool]] = list(t.scope(nodes))
        if statuses is not None:
            criteria.append(nodes.c.status.in_([validate_status(s) for s in statuses]))
        if run_id is not None:
            criteria.append(nodes.c.run_id == run_id)
        stmt = select(*t.cols(nodes)).where(*criteria)
        with self._db.read():
            return self._db.select(stmt.order_by(nodes.c.created_at, nodes.c.id))

    def live_counts(self, parent_id: str | None = None) -> tuple[int, int]:
        """(live nodes in the ledger, live children of `parent_id`): two counts SQLite answers from the status
        and parent indexes, without reading a row into Python (the budgets of every launch; docs/architecture.md
        §7)."""
        with self._db.read() as raw:
            live = raw.execute(_COUNT_LIVE_SQL).fetchone()[0]
            children = raw.execute(_COUNT_LIVE_CHILDREN_SQL, (parent_id,)).fetchone()[0] if parent_id is not None else 0
        return int(live), int(children)

    def subtree(self, root_id: str, max_depth: int = DEFAULT_SUBTREE_MAX_DEPTH) -> list[dict[str, Any]]:
        """The root and its descendants down to max_depth levels, each row with its `level`."""
        if not isinstance(max_depth, int) or max_depth < 0 or max_depth > _SUBTREE_HARD_CAP:
            raise InvalidNodeError(f"subtree max_depth must be an int in 0..{_SUBTREE_HARD_CAP}, got {max_depth!r}")
        with self._db.read():
            return self._db.select(_subtree_query, {"root": root_id, "max_depth": max_depth}, key="subtree")
