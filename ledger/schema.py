"""The ledger schema: versioned DDL (the only place indexes are created) and Core table objects.

Tables and columns follow docs/spec-conformance.md §4.2 / §2.9 (schema v3, docs/architecture.md §9.1; v4 adds one usage
column, below). Times are epoch milliseconds. `nodes.kind` defaults to 'native' (docs/architecture.md §9.2:
kinds are native|pi).

The v3 result ledger (the seed leaves the DDL open, so this is the design):

- `artifacts` — one row per immutable child result file `artifacts/<name>/r<round>.md`.
  `node_id` is the producer, `parent_id` the node owed a notice, `(name, round)` is unique and a
  trigger refuses any UPDATE (an artifact is never rewritten; a new round is a new row).
  `path` is relative to the run directory, `bytes` the file size when recorded.
- `consumptions` — what a consumer has done with an artifact: `read_bytes` (how far it read;
  only ever grows) and `notified_at` (set only after a notice was really sent). Key
  `(artifact_id, consumer_id)`. `undelivered(consumer)` = artifacts whose `parent_id` is the
  consumer with no consumption row that has `read_bytes >= bytes` or `notified_at IS NOT NULL`.
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import Column, ColumnElement, Float, Integer, MetaData, Table, Text, func

# v0 -> v1: the four tables and the six named indexes.
V1_TABLES: Final[tuple[str, ...]] = (
    """CREATE TABLE IF NOT EXISTS nodes (
  id TEXT PRIMARY KEY,
  parent_id TEXT REFERENCES nodes(id),
  name TEXT NOT NULL,
  role TEXT NOT NULL,
  kind TEXT NOT NULL DEFAULT 'native',
  depth INTEGER NOT NULL,
  run_id TEXT,
  session_file TEXT,
  worktree_path TEXT,
  model TEXT,
  team TEXT,
  status TEXT NOT NULL,
  phase TEXT,
  phase_since INTEGER,
  rework_count INTEGER NOT NULL DEFAULT 0,
  contract_path TEXT,
  task_summary TEXT,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  node_id TEXT REFERENCES nodes(id),
  type TEXT NOT NULL,
  data TEXT,
  ts INTEGER NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS usage (
  node_id TEXT PRIMARY KEY REFERENCES nodes(id),
  tokens_in INTEGER NOT NULL DEFAULT 0,
  tokens_out INTEGER NOT NULL DEFAULT 0,
  cost_usd REAL NOT NULL DEFAULT 0,
  updated_at INTEGER NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS messages (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  from_node TEXT NOT NULL,
  to_node TEXT NOT NULL,
  subject TEXT NOT NULL,
  body TEXT NOT NULL,
  kind TEXT,
  urgency TEXT NOT NULL DEFAULT 'info',
  delivered INTEGER NOT NULL DEFAULT 0,
  delivered_at INTEGER,
  created_at INTEGER NOT NULL
)""",
)

V1_INDEXES: Final[tuple[str, ...]] = (
    "CREATE INDEX IF NOT EXISTS idx_nodes_parent ON nodes(parent_id)",
    "CREATE INDEX IF NOT EXISTS idx_nodes_status ON nodes(status)",
    "CREATE INDEX IF NOT EXISTS idx_events_node ON events(node_id)",
    "CREATE INDEX IF NOT EXISTS idx_events_type_ts ON events(type, ts)",
    "CREATE INDEX IF NOT EXISTS idx_messages_inbox ON messages(to_node, delivered)",
    "CREATE INDEX IF NOT EXISTS idx_messages_rate ON messages(from_node, created_at)",
)

# v2 -> v3: the result ledger.
V3_TABLES: Final[tuple[str, ...]] = (
    """CREATE TABLE IF NOT EXISTS artifacts (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  node_id TEXT REFERENCES nodes(id),
  parent_id TEXT,
  name TEXT NOT NULL,
  round INTEGER NOT NULL CHECK (round >= 1),
  path TEXT NOT NULL,
  bytes INTEGER NOT NULL CHECK (bytes >= 0),
  created_at INTEGER NOT NULL,
  UNIQUE (name, round)
)""",
    """CREATE TABLE IF NOT EXISTS consumptions (
  artifact_id INTEGER NOT NULL REFERENCES artifacts(id) ON DELETE CASCADE,
  consumer_id TEXT NOT NULL,
  read_bytes INTEGER NOT NULL DEFAULT 0 CHECK (read_bytes >= 0),
  notified_at INTEGER,
  updated_at INTEGER NOT NULL,
  PRIMARY KEY (artifact_id, consumer_id)
) WITHOUT ROWID""",
    """CREATE TRIGGER IF NOT EXISTS artifacts_immutable BEFORE UPDATE ON artifacts
BEGIN
  SELECT RAISE(ABORT, 'artifacts are immutable: record a new round instead');
END""",
)

V3_INDEXES: Final[tuple[str, ...]] = (
    "CREATE INDEX IF NOT EXISTS idx_artifacts_parent ON artifacts(parent_id)",
    "CREATE INDEX IF NOT EXISTS idx_artifacts_node ON artifacts(node_id)",
    "CREATE INDEX IF NOT EXISTS idx_consumptions_consumer ON consumptions(consumer_id)",
)

# v3 -> v4: usage records the tokens whose price is unknown (a model genai-prices does not know and settings do
# not price): their cost is "unknown", never 0, and a cost budget charges them at a configured rate.
V4_COLUMNS: Final[tuple[str, ...]] = (
    "ALTER TABLE usage ADD COLUMN unknown_cost_tokens INTEGER NOT NULL DEFAULT 0 CHECK (unknown_cost_tokens >= 0)",
)

# v4 -> v5: the fleet. `runs` has one row per run recorded in this database (on SQLite, the file's own run):
# where it runs (host, pid), its state, the endpoints an operator attaches to (and the CurveZMQ server key when
# they are tcp), its project and what its in-flight launches hold of a cost budget (`reserved_usd`).
# `fleets` has one row per project: the row a launch locks (SELECT ... FOR UPDATE) while it checks the fleet-wide
# budget, so that two runs of one project never both reserve the last dollar.
# PostgreSQL's v5 also creates `applied_requests` (ledger/pg_schema.py): the request ids that tell a writer whether a
# COMMIT cut off by a lost connection landed. SQLite has no such table: a local COMMIT's outcome is always known.
V5_TABLES: Final[tuple[str, ...]] = (
    """CREATE TABLE IF NOT EXISTS runs (
  run TEXT PRIMARY KEY,
  project TEXT,
  host TEXT,
  pid INTEGER,
  state TEXT NOT NULL,
  control_endpoint TEXT,
  monitor_endpoint TEXT,
  server_key TEXT,
  reserved_usd REAL NOT NULL DEFAULT 0 CHECK (reserved_usd >= 0),
  started_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  ended_at INTEGER
)""",
    """CREATE TABLE IF NOT EXISTS fleets (
  project TEXT PRIMARY KEY,
  created_at INTEGER NOT NULL
)""",
)

V5_INDEXES: Final[tuple[str, ...]] = (
    "CREATE INDEX IF NOT EXISTS idx_runs_project ON runs(project)",
    "CREATE INDEX IF NOT EXISTS idx_runs_host_state ON runs(host, state)",
)

NAMED_INDEXES: Final = tuple(sql.split()[5] for sql in V1_INDEXES)
ALL_INDEXES: Final = NAMED_INDEXES + tuple(sql.split()[5] for sql in V3_INDEXES + V5_INDEXES)
FLEET_TABLES: Final = ("runs", "fleets")
ALL_TABLES: Final = ("nodes", "events", "usage", "messages", "artifacts", "consumptions")

metadata = MetaData()

nodes = Table(
    "nodes",
    metadata,
    Column("id", Text, primary_key=True),
    Column("parent_id", Text),
    Column("name", Text, nullable=False),
    Column("role", Text, nullable=False),
    Column("kind", Text, nullable=False),
    Column("depth", Integer, nullable=False),
    Column("run_id", Text),
    Column("session_file", Text),
    Column("worktree_path", Text),
    Column("model", Text),
    Column("team", Text),
    Column("status", Text, nullable=False),
    Column("phase", Text),
    Column("phase_since", Integer),
    Column("rework_count", Integer, nullable=False),
    Column("contract_path", Text),
    Column("task_summary", Text),
    Column("created_at", Integer, nullable=False),
    Column("updated_at", Integer, nullable=False),
)

events = Table(
    "events",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("node_id", Text),
    Column("type", Text, nullable=False),
    Column("data", Text),
    Column("ts", Integer, nullable=False),
)

usage = Table(
    "usage",
    metadata,
    Column("node_id", Text, primary_key=True),
    Column("tokens_in", Integer),
    Column("tokens_out", Integer),
    Column("cost_usd", Float),
    Column("updated_at", Integer),
    Column("unknown_cost_tokens", Integer),
)

messages = Table(
    "messages",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("from_node", Text),
    Column("to_node", Text),
    Column("subject", Text),
    Column("body", Text),
    Column("kind", Text),
    Column("urgency", Text),
    Column("delivered", Integer),
    Column("delivered_at", Integer),
    Column("created_at", Integer),
)

artifacts = Table(
    "artifacts",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("node_id", Text),
    Column("parent_id", Text),
    Column("name", Text),
    Column("round", Integer),
    Column("path", Text),
    Column("bytes", Integer),
    Column("created_at", Integer),
)

consumptions = Table(
    "consumptions",
    metadata,
    Column("artifact_id", Integer, primary_key=True),
    Column("consumer_id", Text, primary_key=True),
    Column("read_bytes", Integer),
    Column("notified_at", Integer),
    Column("updated_at", Integer),
)

def _fleet_tables(meta: MetaData) -> None:
    """`runs` and `fleets`: keyed by run / project on both backends, so never scoped to one run."""
    Table(
        "runs",
        meta,
        Column("run", Text, primary_key=True),
        Column("project", Text),
        Column("host", Text),
        Column("pid", Integer),
        Column("state", Text, nullable=False),
        Column("control_endpoint", Text),
        Column("monitor_endpoint", Text),
        Column("server_key", Text),
        Column("reserved_usd", Float, nullable=False),
        Column("started_at", Integer, nullable=False),
        Column("updated_at", Integer, nullable=False),
        Column("ended_at", Integer),
    )
    Table("fleets", meta, Column("project", Text, primary_key=True), Column("created_at", Integer, nullable=False))


_fleet_tables(metadata)

NODE_COLUMNS: Final = tuple(c.name for c in nodes.columns)


def _scoped(table: Table, scoped_meta: MetaData) -> Table:
    """`table` with the PostgreSQL key column `run` first (every PostgreSQL table has it: many runs, one database)."""
    columns = [Column(c.name, c.type, primary_key=c.primary_key) for c in table.columns]
    return Table(table.name, scoped_meta, Column("run", Text, primary_key=True), *columns)


class Tables:
    """The Core tables one backend's queries are built from: `scope(t)` is the run criterion (none on SQLite,
    where a file is one run), `cols(t)` the columns a row reports (never PostgreSQL's `run`)."""

    def __init__(self, meta: MetaData, *, scoped: bool) -> None:
        self.scoped = scoped
        self.nodes, self.events, self.usage, self.messages, self.artifacts, self.consumptions = (
            meta.tables[name] for name in ALL_TABLES
        )
        self.runs, self.fleets = (meta.tables[name] for name in FLEET_TABLES)

    def scope(self, table: Any) -> tuple[ColumnElement[bool], ...]:
        if not self.scoped:
            return ()
        return (table.c.run == func.current_setting("legion.run"),)

    def cols(self, table: Table) -> list[Column[Any]]:
        return [c for c in table.columns if not (self.scoped and c.name == "run")]


_pg_metadata = MetaData()
for _table in (nodes, events, usage, messages, artifacts, consumptions):
    _scoped(_table, _pg_metadata)
_fleet_tables(_pg_metadata)

SQLITE_TABLES: Final = Tables(metadata, scoped=False)
PG_TABLES: Final = Tables(_pg_metadata, scoped=True)
