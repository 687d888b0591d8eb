"""Shared pytest configuration: every test has a timeout (pyproject `timeout`), and the fixtures of a started
session root that the integration and chaos tests share (a module's own fixture of the same name wins)."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from legion.ledger import open_ledger
from legion.ledger.ledger import Ledger
from legion.ledger.pg_engine import close_pool
from legion.supervision.root import RootSupervisor
from legion.workers.fixture_worker import find_marked
from tests.pg_server import PgServer, running_server
from tests.support import make_session_root, until

# CI sets this: there a missing PostgreSQL server fails the PostgreSQL tests instead of skipping them
PG_REQUIRED_ENV = "LEGION_TEST_PG_REQUIRED"


def _cluster(*, durable: bool) -> Iterator[PgServer]:
    """A started cluster, removed afterwards; no server here: skip, or fail where PG_REQUIRED_ENV says it must be."""
    servers = running_server(durable=durable)
    try:
        server = servers.__enter__()
    except RuntimeError as exc:
        if os.environ.get(PG_REQUIRED_ENV):
            pytest.fail(f"PostgreSQL is required here ({PG_REQUIRED_ENV} is set): {exc}")
        pytest.skip(f"no PostgreSQL server for the PostgreSQL ledger tests: {exc}")
    try:
        yield server
    finally:
        servers.__exit__(None, None, None)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """This pytest process's own PostgreSQL cluster (each xdist worker starts one), removed at the end."""
    yield from _cluster(durable=False)


@pytest.fixture
def own_pg_server() -> Iterator[PgServer]:
    """A cluster of this test's own, which it may stop and restart without disturbing the other tests. Durable
    (commits synced): an immediate stop (a crash) must not take back a commit the server acknowledged."""
    yield from _cluster(durable=True)


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """The URL of a fresh, empty database on the session's cluster (over its unix socket)."""
    with pg_server.fresh_database() as name:
        url = pg_server.url(name)
        yield url
        close_pool(url)


@pytest.fixture
def base() -> Iterator[Path]:
    # ipc:// paths are limited to ~107 bytes: keep the run directory short
    path = Path(tempfile.mkdtemp(prefix="lrs", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def marker() -> str:
    return f"rs-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def root(base: Path, marker: str) -> AsyncIterator[RootSupervisor]:
    """A started session root (3 restarts in 60 s); after the test no process carrying `marker` is left."""
    sup = make_session_root(base, max_restarts=3, restart_period=60.0)
    await sup.start()
    yield sup
    if not sup._closed.is_set():
        await sup.stop(force=True)
    await until(lambda: not find_marked(marker), 5, "no marked process after the root stopped")


@pytest.fixture
def reader(root: RootSupervisor) -> Iterator[Ledger]:
    """A second ledger connection on the `root` fixture's run."""
    ledger = open_ledger(root.ledger_path)
    yield ledger
    ledger.close()
