"""Liveness in the ledger: every working session's node row is stamped while it works.

docs/architecture.md §5, docs/spec-conformance.md §6.5 step 1: the heartbeat is refreshed every 2 s tick, so
`legion status` and hygiene can tell a working node from an abandoned one."""

from __future__ import annotations

import signal

import pytest

from tests.e2e.harness import kill_tree, launch, node_rows, project, subagent
from tests.support import wait_until

pytestmark = pytest.mark.timeout(60)


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
                moved = wait_until(lambda: node_rows(run).get("h1", {}).get("updated_at", stamped) > stamped, 6,
                                   "h1's heartbeat")
            finally:
                proc.send_signal(signal.SIGINT)
                proc.communicate(timeout=30)
            assert moved
        finally:
            kill_tree(proc)
