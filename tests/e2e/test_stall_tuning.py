"""Stall notices are tunable (issue 21, item 6; docs/spec-conformance.md §6.8), through `legion run`: the setting
`legion.loopNoticeMs` sets the L2 radius of a run, a card's `loopNoticeMs` replaces it for its role (0: no L2
notices), and `legion.silenceNoticeMs` sets the L1 silence period. The notices reach the parent as `notice` mail."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import kill_tree, launch, node_rows, project
from tests.support import wait_until

pytestmark = pytest.mark.timeout(150)


def stall_notices(run: Path) -> list[dict[str, Any]]:
    """The run's stall notices (mail of kind `notice` whose subject starts with "Stall:"), oldest first."""
    if not (run / "legion.db").exists():
        return []
    with contextlib.closing(sqlite3.connect(f"file:{run / 'legion.db'}?mode=ro", uri=True, timeout=5)) as db:
        db.row_factory = sqlite3.Row
        try:
            rows = db.execute("SELECT from_node, to_node, subject, body FROM messages WHERE kind = 'notice' "
                              "AND subject LIKE 'Stall:%' ORDER BY id").fetchall()
        except sqlite3.OperationalError:  # the ledger's schema is not created yet
            return []
    return [dict(r) for r in rows]


def of(notices: list[dict[str, Any]], child: str, what: str) -> list[dict[str, Any]]:
    """`child`'s notices of one level: `running` (L2) or `silent` (L1)."""
    return [n for n in notices if n["subject"].startswith(f"Stall: {child} {what} for ")]


def test_the_l2_radius_and_the_l1_period_come_from_the_settings_and_the_card() -> None:
    with project() as proj:
        gate = proj.dir / "gate"
        gated = proj.script("gated", {"tool_calls": [{"name": "bash", "arguments": {
            "command": f"while [ ! -e {gate} ]; do sleep 0.05; done"}}]}, default={"text": "gate opened"})
        silent = proj.script("silent", {"text": "thought for a while", "delay_ms": 6000})
        proj.settings({"legion": {"loopNoticeMs": 1000, "silenceNoticeMs": 1000}})
        proj.card("steady", loopNoticeMs=0)  # a role whose long runs are expected: no L2 notices for it
        root = proj.script(
            "root",
            launch({"name": "c1", "agent": "worker", "task": "wait for the gate", "model": gated},
                   {"name": "c2", "agent": "steady", "task": "wait for the gate", "model": gated},
                   {"name": "c3", "agent": "steady", "task": "think", "model": silent}),
            default={"text": "noted"})
        proc, run = proj.start("stalls", "--model", root, "--timeout", "120")
        try:
            # the settings' radius of 1 s: c1 gets its three L2 notices while it waits in its tool
            wait_until(lambda: len(of(stall_notices(run), "c1", "running")) >= 3, 90, "c1's three L2 notices")
            wait_until(lambda: node_rows(run).get("c3", {}).get("status") == "settled", 60, "c3 settled")
            gate.touch()
            stdout, stderr = proc.communicate(timeout=90)
        finally:
            kill_tree(proc)
        assert proc.returncode == 0, f"{stdout}\n{stderr}"
        notices = stall_notices(run)
        long_c1 = of(notices, "c1", "running")
        assert len(long_c1) == 3, notices  # at most three per window
        assert all(n["to_node"] == "root" and "in `bash` for" in n["body"] for n in long_c1), long_c1
        # the card's loopNoticeMs 0 wins over the settings' radius: c2 waited as long as c1, without an L2 notice
        assert of(notices, "c2", "running") == [] and of(notices, "c3", "running") == [], notices
        # the settings' silence period of 1 s (not the default 2 min): c3, silent in its model call, got L1
        silent_c3 = of(notices, "c3", "silent")
        assert 1 <= len(silent_c3) <= 2 and silent_c3[0]["to_node"] == "root", notices
        assert node_rows(run)["c1"]["status"] == "settled", node_rows(run)


def test_a_radius_of_zero_in_the_settings_turns_l2_notices_off() -> None:
    with project() as proj:
        gate = proj.dir / "gate"
        gated = proj.script("gated", {"tool_calls": [{"name": "bash", "arguments": {
            "command": f"while [ ! -e {gate} ]; do sleep 0.05; done"}}]}, default={"text": "gate opened"})
        proj.settings({"legion": {"loopNoticeMs": 0}})
        proj.card("ticker", loopNoticeMs=1000)  # … except for a role whose card sets its own radius
        root = proj.script(
            "root",
            launch({"name": "c1", "agent": "worker", "task": "wait", "model": gated},
                   {"name": "c2", "agent": "ticker", "task": "wait", "model": gated}),
            default={"text": "noted"})
        proc, run = proj.start("stalls", "--model", root, "--timeout", "120")
        try:
            wait_until(lambda: len(of(stall_notices(run), "c2", "running")) >= 2, 90, "c2's L2 notices")
            gate.touch()
            stdout, stderr = proc.communicate(timeout=90)
        finally:
            kill_tree(proc)
        assert proc.returncode == 0, f"{stdout}\n{stderr}"
        notices = stall_notices(run)
        assert of(notices, "c1", "running") == [], notices  # waited as long as c2, in the same tool
        assert 2 <= len(of(notices, "c2", "running")) <= 3, notices
