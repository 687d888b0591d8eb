"""Phase timeouts are notices (docs/spec-conformance.md §5.8): one `phase_timeout` event and one `Phase timeout:` notice
mail to the centurion's parent per stint, never a transition; a new stint can time out again."""

from __future__ import annotations

from pathlib import Path

import pytest

from legion.ledger import open_ledger
from legion.ledger.constants import Delivery
from legion.orchestration import teams
from tests.e2e.teams_support import call, model, project, run

MACHINE = {"start": "planning", "phases": [{"id": "planning", "timeoutMs": 300, "next": ["work"]},
                                           {"id": "work", "timeoutMs": 300, "next": ["done"]}]}


def test_one_notice_per_stint_and_no_transition(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(teams, "TICK_S", 0.05)  # many ticks per stint: dedup is what is tested
    scripts = {
        "root": {"turns": [call("subagent", action="launch", agent="centurion", name="slow", task="t",
                                model=model("slow"), phases=MACHINE),
                           # each notice mail ends a wait early (it arrives in the result, docs/spec-conformance.md §6.6)
                           call("subagent", action="wait", names=["slow"], timeoutMs=2000),
                           call("subagent", action="wait", names=["slow"], timeoutMs=2000),
                           call("subagent", action="wait", names=["slow"], timeoutMs=2000),
                           call("subagent", action="retire", name="slow", force=True), {"text": "root done"}],
                 "default": {"text": "root: noted"}},
        "slow": {"turns": [{"delay_ms": 900, "tool_calls": [{"name": "legion_phase", "arguments": {"to": "work"}}]},
                           {"hang": True}]},
    }
    result = run(project(short_tmp, scripts), timeout=60)
    # the root settles with a phase-timeout notice to it still pending; the notice goes OBSOLETE (its phase is
    # over) and the run ends then, not at --timeout
    assert (result.status, result.exit_code) == ("settled", 0), (result.status, result.detail)
    with open_ledger(result.run_dir / "legion.db") as led:
        events = led.events_after(0, limit=10_000, node_id="slow")
        mails = [m for state in Delivery for m in led.messages_in_state(state) if m["to_node"] == "root"]
    timeouts = [e.data for e in events if e.type == "phase_timeout"]
    assert [t["phase"] for t in timeouts] == ["planning", "work"]  # once per stint, over dozens of ticks
    assert len({t["phase_since"] for t in timeouts}) == 2
    assert sorted(m["subject"] for m in mails) == ["Phase timeout: slow in planning", "Phase timeout: slow in work"]
    assert {m["kind"] for m in mails} == {"notice"} and {m["from_node"] for m in mails} == {"slow"}
    moves = [(e.data["from"], e.data["to"], e.data["actor"]) for e in events
             if e.type == "phase_change" and "rejected" not in e.data]
    assert moves == [("planning", "work", "centurion"), ("work", "aborted", "supervisor")]  # no forced move


def test_a_revived_team_keeps_its_phase_and_can_time_out_again(short_tmp: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(teams, "TICK_S", 0.05)
    machine = {"start": "planning", "phases": [{"id": "planning", "timeoutMs": 300, "next": ["done"]}]}
    scripts = {
        "root": {"turns": [call("subagent", action="launch", agent="centurion", name="slow", task="t",
                                model=model("slow"), phases=machine),
                           call("subagent", action="wait", names=["slow"], timeoutMs=900),
                           call("subagent", action="abort", name="slow"),
                           call("subagent", action="wait", names=["slow"], timeoutMs=5000),  # its settle landed
                           call("subagent", action="resume", name="slow", message="go on"),
                           # (a wait right after resume can see the old status: the resumed one lands async)
                           {"delay_ms": 900, **call("subagent", action="retire", name="slow", force=True)},
                           {"text": "root done"}],
                 "default": {"text": "root: noted"}},
        "slow": {"turns": [{"hang": True}, {"hang": True}], "default": {"hang": True}},
    }
    result = run(project(short_tmp, scripts), timeout=60)
    # the root settles with a phase-timeout notice to it still pending; the notice goes OBSOLETE (its phase is
    # over) and the run ends then, not at --timeout
    assert (result.status, result.exit_code) == ("settled", 0), (result.status, result.detail)
    with open_ledger(result.run_dir / "legion.db") as led:
        events = led.events_after(0, limit=10_000, node_id="slow")
    timeouts = [e.data for e in events if e.type == "phase_timeout"]
    statuses = [(e.type, e.data.get("reason")) for e in events if e.type.startswith("node_")]
    assert ("node_retired", "aborted") in statuses, statuses  # the abort retired it; resume revived it
    # an rpc session revived for new input is recorded as a resume: no node_launched + node_retired pair first
    # (issue 21, item 1; docs/spec-conformance.md §2.2)
    assert statuses == [("node_launched", None), ("node_retired", "aborted"), ("node_resumed", None),
                        ("node_retired", "retire")], statuses
    assert [t["phase"] for t in timeouts] == ["planning", "planning"]
    assert timeouts[0]["phase_since"] < timeouts[1]["phase_since"]  # the revival started a new stint
