"""HeldWriter: an rpc worker's ledger writer, opened only for a write its session's settle cannot carry."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from legion.ledger import Ledger, LedgerWriter, open_ledger
from legion.workers.held_writer import HeldWriter

pytestmark = pytest.mark.timeout(30)


def _usage(tokens: int) -> object:
    return lambda led: led.upsert_usage("n", tokens, 1, 0.0)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    led = open_ledger(tmp_path / "legion.db")
    led.insert_node(id="n", name="n", role="worker", depth=1)
    yield led
    led.close()


def _opener(tmp_path: Path, opened: list[LedgerWriter]) -> object:
    def opener() -> LedgerWriter:
        opened.append(LedgerWriter(tmp_path / "legion.db"))
        return opened[-1]
    return opener


async def test_carried_writes_never_open_a_writer(tmp_path: Path, ledger: Ledger) -> None:
    opened: list[LedgerWriter] = []
    held = HeldWriter(_opener(tmp_path, opened), 0.05)  # type: ignore[arg-type]
    first = held.submit_latest(("usage", "n"), _usage(1))
    assert held.submit_latest(("usage", "n"), _usage(2)) is first  # coalesced while held
    assert held.carry([("usage", "n"), ("sync", "elsewhere")]) and first.cancelled()
    await asyncio.sleep(0.15)  # past the hold: nothing was left to open a writer for
    assert opened == [] and not held.opened and held.pending == 0
    assert await held.aclose(5.0) and opened == [] and ledger.get_usage("n") is None


async def test_a_write_that_outlives_the_hold_opens_the_writer_and_lands(tmp_path: Path, ledger: Ledger) -> None:
    opened: list[LedgerWriter] = []
    held = HeldWriter(_opener(tmp_path, opened), 0.02)  # type: ignore[arg-type]
    future = held.submit_latest(("usage", "n"), _usage(7))
    assert await asyncio.wait_for(asyncio.wrap_future(future), 10) is None
    assert len(opened) == 1 and held.opened
    assert not held.carry([("usage", "n")])  # opened: nothing is carried any more
    later = held.submit_latest(("usage", "n"), _usage(9))
    await asyncio.wait_for(asyncio.wrap_future(later), 10)
    assert ledger.get_usage("n")["tokens_in"] == 9
    assert await held.aclose(5.0)


async def test_hurry_opens_at_once_and_close_lands_what_is_held(tmp_path: Path, ledger: Ledger) -> None:
    opened: list[LedgerWriter] = []
    held = HeldWriter(_opener(tmp_path, opened), 60.0)
    future = held.submit_latest(("usage", "n"), _usage(3))
    held.hurry()  # a legion tool call waits on it: no 60 s hold
    await asyncio.wait_for(asyncio.wrap_future(future), 10)
    assert ledger.get_usage("n")["tokens_in"] == 3
    assert await held.aclose(5.0)

    again = HeldWriter(_opener(tmp_path, opened), 60.0)
    pending = again.submit_latest(("usage", "n"), _usage(4))
    assert await again.aclose(5.0) and pending.done() and ledger.get_usage("n")["tokens_in"] == 4
    with pytest.raises(Exception, match="closed"):
        again.submit_latest(("usage", "n"), _usage(5))


async def test_a_ledger_that_cannot_be_opened_fails_the_held_writes_and_a_later_write_tries_again(
        tmp_path: Path, ledger: Ledger) -> None:
    attempts: list[int] = []

    def opener() -> LedgerWriter:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("the ledger's disk went away")
        return LedgerWriter(tmp_path / "legion.db")

    held = HeldWriter(opener, 0.01)
    failed = held.submit_latest(("usage", "n"), _usage(1))
    with pytest.raises(OSError, match="went away"):
        await asyncio.wait_for(asyncio.wrap_future(failed), 10)
    landed = held.submit_latest(("usage", "n"), _usage(2))
    await asyncio.wait_for(asyncio.wrap_future(landed), 10)
    assert len(attempts) == 2 and ledger.get_usage("n")["tokens_in"] == 2
    assert await held.aclose(5.0)
