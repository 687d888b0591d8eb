"""Teams end to end, the other paths of the default machine (one run, one team per path, real git):
a rework loop, rework exhausted on the third rejection, every worker failed (the marker), the centurion
declaring defeat, a red verification sent back as rework, and a parent retiring a team (aborted); on each
ledger backend (SQLite, and PostgreSQL through `legion run --ledger URL`)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import psycopg

from legion.ledger.constants import Delivery
from legion.runs import open_run_ledger
from tests.e2e.teams_support import (
    VERIFY,
    call,
    failing_worker,
    launch,
    model,
    phase,
    project,
    reviewer_script,
    run,
    wait,
    worker_script,
    write_contract,
)


def _start(team: str, verify: list[str] | None = None) -> list[dict[str, Any]]:
    """Contract, implementing, two workers (names are unique per run: prefixed by the team)."""
    return [write_contract(VERIFY if verify is None else verify), phase("implementing"),
            launch(("worker", f"{team[:3]}-a", "write a", "wa"), ("worker", f"{team[:3]}-b", "write b", "wb")),
            wait()]


def rework() -> dict[str, Any]:  # the reviewer rejects once, then another approves
    return {"turns": [*_start("rework"), phase("reviewing"), launch(("reviewer", "rv1", "review", "rno")), wait("rv1"),
                      phase("implementing", note="fix b.txt"), phase("reviewing"),
                      launch(("reviewer", "rv2", "review", "rok")), wait("rv2"), phase("verifying"),
                      {"text": "verifying"}, {"text": "rework team delivered"}],
            "default": {"text": "ok"}}


def exhausted() -> dict[str, Any]:  # three rejections: the third rework fails the team
    turns = _start("exhausted")
    for n in (1, 2, 3):
        turns += [phase("reviewing"), launch(("reviewer", f"rx{n}", "review", "rno")), wait(f"rx{n}"),
                  phase("implementing")]
    return {"turns": [*turns, {"text": "exhausted"}], "default": {"text": "ok"}}


def allfail() -> dict[str, Any]:
    return {"turns": [write_contract(VERIFY), phase("implementing"),
                      launch(("worker", "f1", "x", "wfail"), ("worker", "f2", "y", "wfail")), wait(),
                      {"text": "everyone failed"}], "default": {"text": "ok"}}


def defeat() -> dict[str, Any]:
    return {"turns": [phase("failed", reason="the task cannot be done in this repository"), {"text": "defeated"}],
            "default": {"text": "ok"}}


def red() -> dict[str, Any]:
    return {"turns": [*_start("red", ["test -f a.txt", "test -f missing.txt"]), phase("reviewing"),
                      launch(("reviewer", "rr1", "review", "rok")), wait("rr1"), phase("verifying"),
                      {"text": "verifying"}, {"text": "told: red"}], "default": {"text": "ok"}}


def replan() -> dict[str, Any]:  # the plan itself was wrong: back to planning, the superior is mailed
    return {"turns": [*_start("replan"), phase("reviewing"), phase("planning", note="the plan missed c.txt"),
                      {"text": "replanning"}], "default": {"text": "ok"}}


def empty() -> dict[str, Any]:  # an empty legion-verify block (a read-only team): straight to done
    return {"turns": [*_start("empty", []), phase("reviewing"), launch(("reviewer", "re1", "review", "rok")),
                      wait("re1"), phase("verifying"), {"text": "verifying"}, {"text": "empty delivered"}],
            "default": {"text": "ok"}}


def retired() -> dict[str, Any]:
    return {"turns": [{"hang": True}]}


TEAMS = {"rework": rework(), "exhausted": exhausted(), "allfail": allfail(), "defeat": defeat(), "red": red(),
         "replan": replan(), "empty": empty(), "retired": retired()}


def root() -> dict[str, Any]:
    turns = [call("subagent", action="launch", agent="centurion", name=name, task=name, model=model(name),
                  phases="default") for name in TEAMS]
    turns += [call("subagent", action="wait", names=[n for n in TEAMS if n != "retired"]),
              call("subagent", action="retire", name="retired", force=True), {"text": "root done"}]
    return {"turns": turns, "default": {"text": "root: noted"}}


def ended_failed(events: list[Any]) -> bool:
    """The team's last status before the run's shutdown (which retires every rpc worker) is failed: a normal
    settle did not overwrite the failed marker."""
    statuses = [e for e in events if e.type.startswith("node_") and e.data.get("reason") != "session-shutdown"]
    return statuses[-1].type == "node_failed"


def test_rework_exhausted_allfail_defeat_red_and_retire(short_tmp: Path, ledger_url: str | None) -> None:
    scripts = {"root": root(), **TEAMS, "wa": worker_script("a.txt", "A"), "wb": worker_script("b.txt", "B"),
               "wfail": failing_worker(), "rok": reviewer_script(True), "rno": reviewer_script(False)}
    result = run(project(short_tmp, scripts), timeout=90, ledger=ledger_url)
    rows = {r["id"]: r for r in result.nodes}
    assert (result.run_dir / "legion.db").exists() == (ledger_url is None)
    with contextlib.closing(open_run_ledger(result.run_dir)) as led:
        led_events = {name: led.events_after(0, limit=10_000, node_id=name) for name in TEAMS}
        mails = [m for state in Delivery for m in led.messages_in_state(state, limit=100)  # the postman delivers it
                 if m["from_node"] == "replan"]
    changes = {name: [e.data for e in evs if e.type == "phase_change"] for name, evs in led_events.items()}
    moves = {name: [(e["from"], e["to"]) for e in evs if "rejected" not in e and "verification" not in e]
             for name, evs in changes.items()}

    assert rows["rework"]["phase"] == "done" and rows["rework"]["rework_count"] == 1
    assert ("reviewing", "implementing") in moves["rework"] and moves["rework"][-1] == ("verifying", "done")

    assert rows["exhausted"]["phase"] == "failed" and rows["exhausted"]["rework_count"] == 2
    last = changes["exhausted"][-1]
    assert last["to"] == "failed" and last["terminalReason"] == "rework_exhausted"
    assert (last["rework"], last["maxRework"]) == (3, 2)  # the attempt that exceeded the limit
    assert [e["rejected"] for e in changes["exhausted"] if "rejected" in e] == ["rework_limit_exceeded"]
    assert ended_failed(led_events["exhausted"])

    assert rows["allfail"]["phase"] == "failed" and ended_failed(led_events["allfail"])
    assert changes["allfail"][-1]["terminalReason"] == "all_children_failed"

    assert rows["defeat"]["phase"] == "failed" and ended_failed(led_events["defeat"])
    assert changes["defeat"][-1]["terminalReason"] == "parent_decision"
    assert changes["defeat"][-1]["note"] == "the task cannot be done in this repository"

    assert rows["red"]["phase"] == "implementing" and rows["red"]["rework_count"] == 1
    verification = [e for e in changes["red"] if "verification" in e]
    assert verification[0]["verification"] == "failed"
    assert [c["exit"] for c in verification[0]["commands"]] == [0, 1]
    assert moves["red"][-1] == ("verifying", "implementing") and changes["red"][-1]["actor"] == "supervisor"

    assert rows["retired"]["phase"] == "aborted" and changes["retired"][-1]["terminalReason"] == "parent_retire"

    assert moves["replan"][-1] == ("reviewing", "planning") and rows["replan"]["phase"] == "planning"
    assert [(m["to_node"], m["subject"], m["kind"]) for m in mails] == [
        ("root", "Phase change: replan back to planning", "notice")]
    assert "the plan missed c.txt" in mails[0]["body"]

    assert moves["empty"][-2:] == [("reviewing", "verifying"), ("verifying", "done")]
    assert [e["commands"] for e in changes["empty"] if "verification" in e] == [[]]
    assert changes["empty"][-1]["actor"] == "supervisor"

    if ledger_url is not None:  # the same rows, read from the database itself
        _check_database(ledger_url, result.run_id)


def _check_database(url: str, run_id: str) -> None:
    """The phases, rework counts and verification events of the run as PostgreSQL holds them, under its run id."""
    with psycopg.connect(url) as conn:
        phases = dict(((n, (p, r)) for n, p, r in conn.execute(
            "SELECT id, phase, rework_count FROM nodes WHERE run = %s AND id IN ('rework', 'red', 'exhausted')",
            (run_id,)).fetchall()))
        verdicts = [row[0] for row in conn.execute(
            "SELECT data::jsonb ->> 'verification' FROM events WHERE run = %s AND node_id = 'red' "
            "AND type = 'phase_change' AND data::jsonb ? 'verification' ORDER BY id", (run_id,)).fetchall()]
        runs = {row[0] for row in conn.execute("SELECT DISTINCT run FROM nodes").fetchall()}
    assert phases == {"rework": ("done", 1), "red": ("implementing", 1), "exhausted": ("failed", 2)}
    assert verdicts[:1] == ["failed"]
    assert runs == {run_id}
