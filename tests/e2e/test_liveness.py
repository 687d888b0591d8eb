"""Liveness in the ledger: every working session's node row is stamped while it works.

docs/architecture.md §5, docs/spec-conformance.md §6.5 step 1: the heartbeat is refreshed on the 2 s tick at most
every 5 s, so `legion status`, `legion doctor` and hygiene can tell a working node from an abandoned one. The
contract a reader relies on is doctor's: a working node's stamp is never older than HEARTBEAT_STALE_S (15 s)."""

from __future__ import annotations

import signal

import pytest

from legion.cli.doctor_sections import HEARTBEAT_STALE_S
from tests.e2e.harness import kill_tree, launch, node_rows, project, subagent
from tests.support import wait_until

pytestmark = pytest.mark.timeout(90)


def test_updated_at_moves_while_a_node_works() -> None:
    with project() as proj:
        kid = {"name": "h1", "agent": "worker", "task": "work", "model": proj.script("h1", {"hang": True})}
        root = proj.script("root", launch(kid), subagent("wait"), {"text": "unreachable"})
        proc, run = proj.start("work", "--model", root)
        try:
            wait_until(lambda: node_rows(run).get("h1", {}).get("status") == "running", 30, "h1 running")
            # node_rows is {} when the ledger cannot be opened at that moment: every read here polls past it
            stamped = wait_until(lambda: node_rows(run).get("h1", {}).get("updated_at"), 10, "h1's row")
            moved = False
            try:
                # why not 6 s: a beat is written at most every 5 s, on a 2 s tick, through the writer's queue,
                # so the next one can come over 6 s after the stamp first seen (CI failed on a 6 s deadline once)
                moved = wait_until(lambda: node_rows(run).get("h1", {}).get("updated_at", stamped) > stamped,
                                   HEARTBEAT_STALE_S, "h1's heartbeat")
            finally:
                proc.send_signal(signal.SIGINT)
                proc.communicate(timeout=30)
            assert moved
        finally:
            kill_tree(proc)
