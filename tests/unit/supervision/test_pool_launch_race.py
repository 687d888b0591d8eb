"""A launch into a pool that dies before it answers follows the pool's restart, whichever of the two the root
processes first: the launch's failed request or the pool's exit (a seed-12 chaos trial once failed a node that
deserved to settle, because the request's failure was processed first)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from legion.ledger import open_ledger
from legion.ledger.ledger import Ledger
from legion.supervision.child_spec import ExitReason
from legion.supervision.lifecycle import Lifecycle
from legion.supervision.pool_child import RELAUNCHING, PoolSessions
from legion.supervision.supervisor import WorkerExited

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def ledger() -> Iterator[Ledger]:
    led = open_ledger(":memory:")
    yield led
    led.close()


class Pool:
    """The pool worker as the root sees it: each request's answer is scripted; `pid` is its incarnation."""

    def __init__(self) -> None:
        self.pid: int | None = 100
        self.answers: list[Any] = []
        self.asked: list[dict[str, Any]] = []

    async def request(self, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.asked.append(body)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return dict(answer)


def _sessions(ledger: Ledger, pool: Pool) -> PoolSessions:
    lifecycle = Lifecycle(ledger)
    lifecycle.ensure_root("root")
    lifecycle.reserve("w", parent_id="root", role="worker")
    return PoolSessions("pool", lifecycle, pool.request, lambda: pool.pid, lambda: False)


def _status(ledger: Ledger, node_id: str) -> str:
    row = ledger.get_node(node_id)
    assert row is not None
    return str(row["status"])


def test_a_launch_whose_pool_exits_before_the_exit_is_processed_follows_the_restart(ledger: Ledger) -> None:
    pool = Pool()
    sessions = _sessions(ledger, pool)
    pool.answers = [WorkerExited("worker 'pool' exited before it answered 'session.launch'")]

    async def scenario() -> None:
        assert await sessions.launch("w", {"nodeId": "w"}, "transient") == RELAUNCHING
        assert sessions.state("w") == "starting"  # not failed: the pool's exit decides
        pool.pid = 101  # the pool's exit, processed after the request's failure: it restarts
        sessions.pool_exited(ExitReason.abnormal("killed"), restarting=True, escalated=False)
        pool.answers = [{"ok": True, "status": "started"}]
        await sessions.relaunch_live()

    asyncio.run(scenario())
    assert sessions.state("w") == "running"
    assert _status(ledger, "w") == "running"
    assert [body["op"] for body in pool.asked] == ["session.launch", "session.launch"]


def test_a_launch_whose_pool_exits_for_good_fails_with_the_pool(ledger: Ledger) -> None:
    pool = Pool()
    sessions = _sessions(ledger, pool)
    pool.answers = [WorkerExited("worker 'pool' exited before it answered 'session.launch'")]

    async def scenario() -> None:
        assert await sessions.launch("w", {"nodeId": "w"}, "transient") == RELAUNCHING
        sessions.pool_exited(ExitReason.abnormal("killed"), restarting=False, escalated=True)

    asyncio.run(scenario())
    assert sessions.state("w") == "failed" and _status(ledger, "w") == "failed"


def test_a_launch_the_pool_did_not_answer_while_alive_still_fails_at_once(ledger: Ledger) -> None:
    pool = Pool()
    sessions = _sessions(ledger, pool)
    pool.answers = [TimeoutError("no answer in 30 s")]

    async def scenario() -> None:
        with pytest.raises(Exception, match="did not answer"):
            await sessions.launch("w", {"nodeId": "w"}, "transient")

    asyncio.run(scenario())
    assert sessions.state("w") == "failed"
