"""Fixtures for the ledger unit tests: a real WAL file in a temp dir and a controllable clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from legion.ledger import Ledger, open_ledger


class FakeClock:
    """Epoch-ms clock the test moves by hand."""

    def __init__(self, start: int = 1_800_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "legion.db"


@pytest.fixture
def ledger(db_path: Path, clock: FakeClock) -> Iterator[Ledger]:
    led = open_ledger(db_path, clock=clock)
    yield led
    led.close()


@pytest.fixture
def tree(ledger: Ledger) -> Ledger:
    """root -> team -> (w1, w2)."""
    ledger.insert_node(id="root", name="root", role="root", depth=0, status="running")
    ledger.insert_node(id="team", name="team-a", role="centurion", depth=1, parent_id="root")
    ledger.insert_node(id="w1", name="w1", role="worker", depth=2, parent_id="team")
    ledger.insert_node(id="w2", name="w2", role="worker", depth=2, parent_id="team")
    return ledger
