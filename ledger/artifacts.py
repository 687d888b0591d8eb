"""The result ledger: immutable artifacts `artifacts/<name>/r<round>.md` and their consumptions (docs/spec-conformance.md §2.9).

DDL and the `undelivered` projection are documented in schema.py. A result leaves
`undelivered(consumer)` when the consumer has read the artifact to EOF (`read_bytes >= bytes`) or
a notice was sent (`notified_at` set, written only after a successful send). A partial paged read
does not suppress the notice. There is no rollback API: a failed send simply leaves the row owed.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

from loguru import logger
from sqlalchemy import Select, and_, bindparam, exists, or_, select

from legion.ledger.base import LedgerBase
from legion.ledger.errors import ArtifactError, NodeNotFoundError
from legion.ledger.nodes import validate_slug
from legion.ledger.schema import Tables
from legion.ledger.sql import RUN, IntegrityViolation, Sql, plain_text
from legion.procs.durable import fsync_dir, replace_file, write_synced_temp

_PARENT_SQL = Sql("SELECT parent_id FROM nodes WHERE id = ?",
                  f"SELECT parent_id FROM nodes WHERE run = {RUN} AND id = %s")
_ROUND_SQL = Sql(
    "SELECT id, node_id, bytes, parent_id FROM artifacts WHERE name = ? AND round = ?",
    f"SELECT id, node_id, bytes, parent_id FROM artifacts WHERE run = {RUN} AND name = %s AND round = %s",
)
_ROUND_RECORDED_SQL = Sql("SELECT 1 FROM artifacts WHERE name = ? AND round = ?",
                          f"SELECT 1 FROM artifacts WHERE run = {RUN} AND name = %s AND round = %s")
_ARTIFACT_COLUMNS = "node_id, parent_id, name, round, path, bytes, created_at"
_INSERT_ARTIFACT_SQL = Sql(
    f"INSERT INTO artifacts ({_ARTIFACT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
    f"INSERT INTO artifacts (run, {_ARTIFACT_COLUMNS}) VALUES ({RUN}, %s, %s, %s, %s, %s, %s, %s) RETURNING id",
)
_CONSUMPTION = ("INSERT INTO consumptions ({run}artifact_id, consumer_id, read_bytes, notified_at, updated_at) "
                "VALUES ({values}) ON CONFLICT({run}artifact_id, consumer_id) DO UPDATE SET ")
_PG_RUN = {"run": "run, "}
_READ_SQL = Sql(
    _CONSUMPTION.format(run="", values="?, ?, ?, NULL, ?")
    + "read_bytes = max(read_bytes, excluded.read_bytes), updated_at = excluded.updated_at",
    _CONSUMPTION.format(**_PG_RUN, values=f"{RUN}, %s, %s, %s, NULL, %s")
    + "read_bytes = greatest(consumptions.read_bytes, excluded.read_bytes), updated_at = excluded.updated_at",
)
_NOTIFIED_SQL = Sql(
    _CONSUMPTION.format(run="", values="?, ?, 0, ?, ?")
    + "notified_at = coalesce(notified_at, excluded.notified_at), updated_at = excluded.updated_at",
    _CONSUMPTION.format(**_PG_RUN, values=f"{RUN}, %s, %s, 0, %s, %s")
    + "notified_at = coalesce(consumptions.notified_at, excluded.notified_at), updated_at = excluded.updated_at",
)


def _get_artifact(t: Tables) -> Select[Any]:
    return select(*t.cols(t.artifacts)).where(*t.scope(t.artifacts), t.artifacts.c.id == bindparam("id"))


def _node_artifacts(t: Tables) -> Select[Any]:
    artifacts = t.artifacts
    return (select(*t.cols(artifacts)).where(*t.scope(artifacts), artifacts.c.node_id == bindparam("node"))
            .order_by(artifacts.c.id))


def _consumed_by(t: Tables, consumer: Any) -> Any:
    """The artifact's notice is settled for `consumer` (read to EOF, or notified)."""
    artifacts, consumptions = t.artifacts, t.consumptions
    return exists().where(
        *t.scope(consumptions),
        consumptions.c.artifact_id == artifacts.c.id,
        consumptions.c.consumer_id == consumer,
        or_(consumptions.c.read_bytes >= artifacts.c.bytes, consumptions.c.notified_at.is_not(None)),
    )


def _undelivered(t: Tables) -> Select[Any]:
    artifacts = t.artifacts
    return (
        select(*t.cols(artifacts))
        .where(*t.scope(artifacts), and_(artifacts.c.parent_id == bindparam("consumer"),
                                         ~_consumed_by(t, bindparam("consumer"))))
        .order_by(artifacts.c.id)
    )


def _owed(t: Tables) -> Select[Any]:
    artifacts = t.artifacts
    return (select(artifacts.c.parent_id).distinct()
            .where(*t.scope(artifacts), artifacts.c.parent_id.is_not(None),
                   ~_consumed_by(t, artifacts.c.parent_id)))


def artifact_relpath(name: str, round: int) -> str:
    """Where an artifact lives inside its run directory."""
    return f"artifacts/{name}/r{round}.md"


def _publish_exclusive(target: Path, data: bytes, *, sync: bool) -> None:
    """Write a temp file (fsynced when `sync`), then link it into place: the round appears whole or not at all.

    os.link refuses an existing target, so a concurrent writer of the same round loses cleanly; a
    failed write leaves no torn r<round>.md behind (it could never be rewritten, being immutable).
    Without `sync` the caller makes the file durable before the row that records it commits
    (`LedgerBase.make_durable`: a LedgerWriter batch syncs all its files at once).
    """
    tmp: Path | None = None
    try:
        tmp = write_synced_temp(target.parent, f".{target.name}.tmp.", data, sync=sync)
        try:
            os.link(tmp, target)
        except FileExistsError as exc:
            raise ArtifactError(f"{target} already exists; artifacts are immutable, write the next round") from exc
        if sync:
            fsync_dir(target.parent)
    except OSError as exc:
        raise ArtifactError(f"cannot write {target}: {exc}; nothing was published, retry the same round") from exc
    finally:
        if tmp is not None:
            tmp.unlink(missing_ok=True)


def _same_content(target: Path, data: bytes) -> bool:
    """`target` holds exactly `data` (a publish of this very round whose record did not land: a retried batch,
    a crash between the link and the COMMIT)."""
    try:
        return target.stat().st_size == len(data) and target.read_bytes() == data
    except OSError:
        return False


def _check_round(round: object) -> int:
    if not isinstance(round, int) or isinstance(round, bool) or round < 1:
        raise ArtifactError(f"artifact round must be an int >= 1, got {round!r}")
    return round


class ArtifactsMixin(LedgerBase):
    """Artifacts and consumptions."""

    def record_artifact(
        self,
        *,
        node_id: str,
        name: str,
        round: int,
        bytes: int,
        parent_id: str | None = None,
        path: str | None = None,
        created_at: int | None = None,
    ) -> int:
        """Record an artifact (parent defaults to the node's parent); re-recording the same facts is a no-op."""
        validate_slug(name)
        _check_round(round)
        if not isinstance(bytes, int) or isinstance(bytes, bool) or bytes < 0:
            raise ArtifactError(f"artifact bytes must be a non-negative int, got {bytes!r}")
        rel = str(plain_text(path)) if path else artifact_relpath(name, round)
        with self._db.write() as raw:
            node = raw.execute(_PARENT_SQL, (node_id,)).fetchone()
            if node is None:
                raise NodeNotFoundError(node_id)
            parent = parent_id if parent_id is not None else node[0]
            existing = raw.execute(_ROUND_SQL, (name, round)).fetchone()
            if existing is not None:
                if (existing[1], existing[2], existing[3]) == (node_id, bytes, parent):
                    return int(existing[0])
                raise ArtifactError(
                    f"artifact {rel} is already recorded (node {existing[1]!r}, {existing[2]} bytes) and "
                    "artifacts are immutable; write the next round instead"
                )
            cur = raw.execute(
                _INSERT_ARTIFACT_SQL,
                (node_id, parent, name, round, rel, bytes, created_at if created_at is not None else self._now()),
            )
            return int(cur.lastrowid or 0)

    def write_artifact(self, run_dir: str | Path, *, node_id: str, name: str, round: int, text: str) -> int:
        """Create `artifacts/<name>/r<round>.md` exclusively (never overwrite) and record it.

        The file is durable before the row commits (docs/architecture.md §5, "Durability"): synced here, or
        with the whole batch when a LedgerWriter runs this. A file of that round that no row records (a publish
        whose record did not land: a retried batch, a crash or power loss before the COMMIT) is not an artifact:
        with exactly this text it is recorded as it is, otherwise it is replaced. A recorded round is refused."""
        validate_slug(name)
        _check_round(round)
        target = Path(run_dir) / artifact_relpath(name, round)
        for folder in (target.parent.parent, target.parent):  # artifacts/ and artifacts/<name>/, private
            folder.mkdir(mode=0o700, exist_ok=True)
        data = text.encode("utf-8")
        deferred = self._deferred_sync is not None
        adopted = target.exists()
        if adopted and not _same_content(target, data):
            if self._round_recorded(name, round):
                raise ArtifactError(f"{target} already exists; artifacts are immutable, write round {round + 1}")
            logger.warning("artifact {}: replacing a file that no ledger row records (its write was cut before "
                           "its record landed)", target)
            try:
                replace_file(target, data, durable=not deferred, prefix=f".{target.name}.tmp.")
            except OSError as exc:
                raise ArtifactError(f"cannot write {target}: {exc}; retry the same round") from exc
        if not adopted:
            _publish_exclusive(target, data, sync=not deferred)
        if deferred or adopted:  # an adopted file's durability is unknown: it is synced like a new one
            self.make_durable(target)
        return self.record_artifact(node_id=node_id, name=name, round=round, bytes=len(data))

    def _round_recorded(self, name: str, round: int) -> bool:
        with self._db.read() as raw:
            return raw.execute(_ROUND_RECORDED_SQL, (name, round)).fetchone() is not None

    def get_artifact(self, artifact_id: int) -> dict[str, Any] | None:
        with self._db.read():
            rows = self._db.select(_get_artifact, {"id": artifact_id}, key="get_artifact")
        return rows[0] if rows else None

    def list_artifacts(self, *, node_id: str | None = None) -> list[dict[str, Any]]:
        """All artifacts, or one node's (a statement compiled once: the root asks at every settle), oldest first."""
        with self._db.read():
            if node_id is not None:
                return self._db.select(_node_artifacts, {"node": node_id}, key="node_artifacts")
            t = self._db.tables
            return self._db.select(select(*t.cols(t.artifacts)).where(*t.scope(t.artifacts)).order_by(t.artifacts.c.id))

    def record_consumption(self, artifact_id: int, consumer_id: str, read_bytes: int) -> None:
        """The consumer read up to read_bytes (only ever grows)."""
        if not isinstance(read_bytes, int) or isinstance(read_bytes, bool) or read_bytes < 0:
            raise ArtifactError(f"read_bytes must be a non-negative int, got {read_bytes!r}")
        now = self._now()
        self._upsert_consumption(
            _READ_SQL,
            (artifact_id, consumer_id, read_bytes, now),
        )

    def mark_notified(self, artifact_id: int, consumer_id: str) -> None:
        """A notice about the artifact was sent successfully (keeps the first stamp)."""
        now = self._now()
        self._upsert_consumption(
            _NOTIFIED_SQL,
            (artifact_id, consumer_id, now, now),
        )

    def _upsert_consumption(self, sql: Sql, params: tuple[Any, ...]) -> None:
        try:
            with self._db.write_row() as raw:
                raw.execute(sql, params)
        except (sqlite3.IntegrityError, IntegrityViolation) as exc:
            raise ArtifactError(f"no artifact with id {params[0]}") from exc

    def undelivered(self, consumer_id: str) -> list[dict[str, Any]]:
        """Artifacts that still owe `consumer_id` a notice, oldest first."""
        with self._db.read():
            return self._db.select(_undelivered, {"consumer": consumer_id}, key="undelivered")

    def owed_consumers(self) -> list[str]:
        """The nodes some artifact still owes a notice (one query for the whole run)."""
        with self._db.read():
            return [str(row["parent_id"]) for row in self._db.select(_owed, {}, key="owed_consumers")]
