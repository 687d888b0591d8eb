"""Every one of the 19 rejection reasons of docs/spec-conformance.md §5.4, each produced by a real `legion_phase` request
(or the supervisor's own request) in a real run, recorded as a `phase_change` event with its exact text."""

from __future__ import annotations

from pathlib import Path

from legion.ledger import open_ledger
from legion.orchestration.phase_machine import REASONS
from tests.e2e.harness import messages, text_of, tool_results
from tests.e2e.teams_support import (
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

BETA = {"start": "work", "phases": [
    {"id": "work", "next": ["verifying"]},
    {"id": "verifying", "next": [{"to": "done", "when": ["verification_passed"], "actorRole": "centurion"},
                                 {"to": "work", "when": ["verification_failed"], "rework": True}]}]}
GAMMA = {"start": "work", "maxRework": 0, "phases": [
    {"id": "work", "next": [{"to": "again", "rework": True}, "done"]},
    {"id": "again", "next": ["work"]}]}


def alpha() -> dict:
    return {"turns": [
        phase("shipping"), phase("planning"), phase("reviewing"), phase("done"), phase("aborted"),
        phase("failed"), phase("implementing"),
        write_contract(["sleep 2"]),
        launch(("planner", "p1", "plan", "hang")),
        phase("implementing"),
        call("subagent", action="stop", name="p1", force=True),
        phase("implementing", evidence="CONTRACT.md"),
        phase("reviewing"),
        launch(("worker", "w1", "fail", "wfail")), wait("w1"),
        phase("reviewing"),
        launch(("worker", "w2", "write b", "wok")), wait("w2"),
        phase("failed", reason="give up"),
        phase("reviewing"),
        phase("reviewing", supersedes="w1"),
        phase("verifying"),
        launch(("reviewer", "r1", "review", "rok")), wait("r1"),
        phase("implementing"),
        launch(("reviewer", "r2", "review", "rno")), wait("r2"),
        phase("verifying"),
        phase("implementing"),
        phase("reviewing"),
        launch(("reviewer", "r3", "review", "rok")), wait("r3"),
        phase("verifying"),
        phase("done"),
        phase("implementing"),
        {"text": "alpha waits for verification"},
        phase("reviewing"),
        {"text": "alpha done"},
    ], "default": {"text": "alpha: nothing more"}}


def beta() -> dict:
    return {"turns": [write_contract([]), phase("verifying"), {"text": "beta waits"}, phase("done"), {"text": "beta done"}],
            "default": {"text": "beta: nothing more"}}


def gamma() -> dict:
    return {"turns": [phase("again"), phase("work"), {"text": "gamma gave up"}],
            "default": {"text": "gamma: nothing more"}}


def root() -> dict:
    def team(name: str, machine: object) -> dict:
        return call("subagent", action="launch", agent="centurion", name=name, task=name, model=model(name),
                    phases=machine)

    return {"turns": [team("alpha", "default"), team("beta", BETA), team("gamma", GAMMA), {"text": "root launched"}],
            "default": {"text": "root: noted"}}


def test_all_nineteen_rejection_reasons(short_tmp: Path) -> None:
    scripts = {"root": root(), "alpha": alpha(), "beta": beta(), "gamma": gamma(), "hang": {"turns": [{"hang": True}]},
               "wfail": failing_worker(), "wok": worker_script("b.txt", "B"), "rok": reviewer_script(True),
               "rno": reviewer_script(False)}
    proj = project(short_tmp, scripts)
    result = run(proj, timeout=90)
    assert result.status in ("settled", "failed"), result.detail
    with open_ledger(result.run_dir / "legion.db") as led:
        rejected, exhausted = {}, []
        for e in led.events_after(0, limit=100_000):
            if e.type == "phase_change" and "rejected" in e.data:
                rejected.setdefault(e.data["rejected"], []).append((e.node_id, e.data))
            elif e.type == "phase_change" and e.data.get("terminalReason") == "rework_exhausted":
                exhausted.append((e.node_id, e.data))
    # the forced failure records the rework attempt that exceeded the limit (gamma: maxRework 0, attempt 1)
    assert [(n, d["to"], d.get("rework"), d.get("maxRework")) for n, d in exhausted] == [("gamma", "failed", 1, 0)]
    assert set(rejected) == set(REASONS), sorted(set(REASONS) - set(rejected))
    texts = {reason: hits[0][1]["message"] for reason, hits in rejected.items()}
    for reason, text in EXACT.items():
        assert texts[reason] == text, reason
    assert texts["contract_path_required"].startswith("contract_path_required: no contract: CONTRACT.md does not "
                                                      "exist or is empty in ")
    assert rejected["children_not_terminal"][0][1].get("alarm") is True  # an invariant raised an alarm
    assert rejected["rework_limit_exceeded"][0][0] == "gamma" and rejected["centurion_required"][0][0] == "beta"
    assert rejected["centurion_required"][0][1]["actor"] == "supervisor"


EXACT = {
    "actor_not_permitted": "actor_not_permitted: 'aborted' is decided by the parent (it retires the team), not by "
                           "the team; request 'failed' with a reason to give up",
    "all_children_not_failed": "all_children_not_failed: not every worker failed (w2): this edge is for a team "
                               "whose members all failed",
    "all_workers_failed": "all_workers_failed: every worker failed (w1): re-dispatch the work, or request 'failed' "
                          "with a reason",
    "centurion_required": "centurion_required: the edge 'verifying' → 'done' is the centurion's own decision",
    "children_not_terminal": "children_not_terminal: invariant: no planner may run during implementing, and p1 is "
                             "running; wait for it or retire it first",
    "condition_not_met": "condition_not_met: children_present: the team has no workers yet (planners, scouts and "
                         "reviewers do not count); dispatch the work first",
    "injected_done_is_supervisor_only": "injected_done_is_supervisor_only: your machine has no such edge "
                                        "('planning' → done); only the supervisor may complete a team through the "
                                        "injected edge",
    "invalid_phase": "invalid_phase: 'shipping' is not a phase of this machine; its phases: planning, implementing, "
                     "reviewing, verifying, done, failed, aborted",
    "invalid_transition": "invalid_transition: 'planning' has no edge to 'reviewing'; legal from 'planning': "
                          "implementing, failed, aborted, done",
    "review_verdict_not_accepted": "review_verdict_not_accepted: the latest verdict is ok: false (no); rework first",
    "review_verdict_not_rejected": "review_verdict_not_rejected: the latest verdict is ok: true (looks right); no "
                                   "rework is due",
    "reviewer_not_settled": "reviewer_not_settled: no reviewer has settled yet: a verdict counts only after a "
                            "reviewer settled",
    "rework_limit_exceeded": "rework_limit_exceeded: 0 of 0 rework(s) used: the team fails (rework_exhausted)",
    "same_phase": "same_phase: the team is already in 'planning'",
    "terminal_phase": "terminal_phase: the team is in terminal phase 'failed'; nothing can follow it",
    "terminal_reason_required": "terminal_reason_required: 'failed' needs a reason: say why the team gives up",
    "verification_not_failed": "verification_not_failed: verification is not run yet in this stint: there is "
                               "nothing to rework",
    "verification_not_passed": "verification_not_passed: verification is not run yet in this stint; the "
                               "supervisor moves the team when it is green",
}


def test_a_team_in_a_terminal_phase_is_not_steerable(short_tmp: Path) -> None:
    """Issue 21 item 4: SUBAGENT_NOT_STEERABLE is kept for a child in a terminal phase, its text naming the
    state (docs/spec-conformance.md §3.3); the steer starts nothing."""
    def root_turns() -> dict:
        return {"turns": [call("subagent", action="launch", agent="centurion", name="gamma", task="gamma",
                               model=model("gamma"), phases=GAMMA),
                          wait("gamma"),
                          call("subagent", action="steer", name="gamma", message="try again"),
                          {"text": "root done"}], "default": {"text": "root: noted"}}

    proj = project(short_tmp, {"root": root_turns(), "gamma": gamma()})
    result = run(proj, timeout=90)
    assert result.status in ("settled", "failed"), result.detail
    with open_ledger(result.run_dir / "legion.db") as led:
        assert led.get_node("gamma")["phase"] == "failed"
    steer = tool_results(result.run_dir / "root.jsonl", "subagent")[2]
    assert steer.startswith("SUBAGENT_NOT_STEERABLE"), steer
    assert "terminal phase 'failed'" in steer and "launch a new node" in steer, steer
    users = [text_of(m) for m in messages(result.run_dir / "gamma.jsonl") if m["role"] == "user"]
    assert "try again" not in users, users
