"""The e2e tests' project directories are short (a run's ipc sockets must fit the 107-byte Unix limit); two
local OpenAI-compatible stub servers for the provider tests; `ledger_url`, which runs a test on each backend."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from openai_stub import OpenAIStub


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="lt-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def stubs() -> AsyncIterator[tuple[OpenAIStub, OpenAIStub]]:
    """Two stub servers (a root's and a child's, or two providers), closed after the test."""
    first, second = await OpenAIStub().start(), await OpenAIStub().start()
    yield first, second
    await first.close()
    await second.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest) -> str | None:
    """Where the test's run records: None for its own legion.db (SQLite), else a fresh PostgreSQL database's URL
    (`legion run --ledger URL`); a test that takes it runs on both backends."""
    if request.param == "sqlite":
        return None
    return str(request.getfixturevalue("pg_url"))
