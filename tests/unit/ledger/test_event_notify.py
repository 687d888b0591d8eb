"""PostgreSQL: every transaction that inserts a run's events (append_event, send_mail's mail_sent) sends NOTIFY
legion_events with the run as payload, at COMMIT; a rolled-back insert sends nothing; ids still come back."""

from __future__ import annotations

import contextlib

import psycopg
import pytest

from legion.ledger import open_ledger
from legion.ledger.events import EVENTS_CHANNEL
from tests.unit.ledger.conftest import RUN

pytestmark = pytest.mark.timeout(30)


def _heard(listener: psycopg.Connection, wait: float = 0.5) -> list[str]:
    return [n.payload for n in listener.notifies(timeout=wait) if n.channel == EVENTS_CHANNEL]


def test_event_inserts_notify_at_commit_only(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as listener, contextlib.closing(open_ledger(pg_url, run_id=RUN)) as led:
        listener.execute(f"LISTEN {EVENTS_CHANNEL}")
        led.insert_node(id="root", name="root", role="root", depth=0, status="running")
        led.insert_node(id="w1", name="w1", role="worker", depth=1, parent_id="root")
        first = led.append_event("root", "node_launched", {"n": 1})
        assert first > 0 and _heard(listener) == [RUN]
        with pytest.raises(RuntimeError), led.transaction():
            led.append_event("root", "node_launched", {"n": 2})
            raise RuntimeError("rolled back")
        assert _heard(listener, 0.3) == []
        with led.transaction():  # one transaction, many events: one notice
            second = led.append_event("root", "node_launched", {"n": 3})
            third = led.append_event("root", "node_launched", {"n": 4})
        assert third == second + 1 and second > first and _heard(listener) == [RUN]
        led.send_mail("w1", "root", "subject", "body", kind="report")
        assert _heard(listener) == [RUN]
        assert [e.data.get("n") for e in led.events_after(0)][:3] == [1, 3, 4]
