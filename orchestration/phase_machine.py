"""The phase machine at runtime: normalisation, conditions, evaluation.

docs/spec-conformance.md §5, docs/architecture.md §9.3.

Pure: `machine_for(raw)` turns a launch's declaration (the spec's `phases`; the string `"default"` is the
default machine of §5.1) into a normalised `Machine` (§5.5: `done`/`failed`/`aborted` added as terminals,
every non-terminal phase given unconditional injected edges to them). `evaluate(machine, current, to,
actor, facts, reason)` decides one requested transition from a `Facts` snapshot (the team's children, its
contract, the latest reviewer verdict, the verification result, the rework count) and returns a `Decision`
with one of the 19 rejection reasons of §5.4 and its text, or the edge to take. Writing the phase is the
runtime's job (`legion.orchestration.teams`); nothing here touches the ledger.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from legion.agents.phases import DEFAULT_MAX_REWORK, PhaseDeclaration, validate_phases
from legion.agents.verdict import Verdict
from legion.ledger.constants import LIVE_STATUSES, TERMINAL_PHASES

DEFAULT_NAME: Final = "default"
DEFAULT_MACHINE: Final[dict[str, Any]] = {
    "start": "planning",
    "maxRework": DEFAULT_MAX_REWORK,
    "phases": [
        {"id": "planning", "next": [{"to": "implementing", "when": ["contract_file"]}, "failed", "aborted"]},
        {"id": "implementing", "require": ["children_settled"],
         "next": [{"to": "reviewing", "when": ["children_present", "children_none_failed"]},
                  {"to": "failed", "when": ["children_all_failed"]}, "aborted"]},
        {"id": "reviewing",
         "next": [{"to": "verifying", "when": ["children_present", "children_settled", "verdict_ok"]},
                  {"to": "implementing", "when": ["verdict_not_ok"], "rework": True},
                  {"to": "planning", "actorRole": "centurion"}, "failed", "aborted"]},
        {"id": "verifying",
         "next": [{"to": "done", "when": ["verification_passed", "children_settled"]},
                  {"to": "implementing", "when": ["verification_failed"], "rework": True}, "failed", "aborted"]},
    ],
}
CENTURION_REQUIRED: Final = "centurion_required"  # the one reason the Teams runtime gives as well
REASONS: Final = (
    "invalid_phase", "same_phase", "terminal_phase", "invalid_transition", "contract_path_required",
    "children_not_terminal", "all_workers_failed", "reviewer_not_settled", "review_verdict_not_accepted",
    "review_verdict_not_rejected", "verification_not_passed", "verification_not_failed", "rework_limit_exceeded",
    CENTURION_REQUIRED, "actor_not_permitted", "condition_not_met", "terminal_reason_required",
    "all_children_not_failed", "injected_done_is_supervisor_only",
)
TERMINAL_REASONS: Final = ("parent_decision", "all_children_failed", "rework_exhausted", "parent_retire")
ACTORS: Final = ("centurion", "supervisor", "parent")
SUPPORT_ROLES: Final = frozenset({"planner", "scout", "reviewer", "advisor"})  # not "workers" of a team
REVIEWER: Final = "reviewer"
VERDICT_CONDITIONS: Final = frozenset({"verdict_ok", "verdict_not_ok"})
PLANNER: Final = "planner"


@dataclass(frozen=True)
class MEdge:
    to: str
    when: tuple[str, ...] = ()
    rework: bool = False
    actor_role: str | None = None
    injected: bool = False


@dataclass(frozen=True)
class MPhase:
    id: str
    edges: tuple[MEdge, ...]
    require: tuple[str, ...] = ()
    timeout_ms: int | None = None
    terminal: bool = False


@dataclass(frozen=True)
class Machine:
    start: str
    phases: dict[str, MPhase]
    max_rework: int
    self_completes: bool  # some author-declared edge goes to done (§5.5 maySelfComplete)

    def edge(self, current: str, to: str) -> MEdge | None:
        phase = self.phases.get(current)
        return next((e for e in phase.edges if e.to == to), None) if phase else None

    def legal(self, current: str) -> list[str]:
        phase = self.phases.get(current)
        return [e.to for e in phase.edges] if phase else []

    def timeout_ms(self, phase: str) -> int | None:
        found = self.phases.get(phase)
        return found.timeout_ms if found else None


@dataclass(frozen=True)
class Child:
    id: str
    role: str
    status: str  # nodes.status
    settled_at: float | None = None
    final_text: str = ""
    handled: bool = False  # a failure taken over by a settled sibling (supersedes → node_handled)

    @property
    def live(self) -> bool:
        return self.status in LIVE_STATUSES

    @property
    def failed(self) -> bool:
        return self.status == "failed" and not self.handled


@dataclass
class Facts:
    children: list[Child] = field(default_factory=list)
    contract_ok: bool = False
    contract_hint: str = ""
    verdict: Verdict | None = None
    verdict_error: str | None = None  # the latest settled reviewer wrote no valid verdict
    reviewer_settled: bool = False
    verification: bool | None = None  # this stint's verification: True green, False red, None not run
    rework_count: int = 0

    @property
    def workers(self) -> list[Child]:
        return [c for c in self.children if c.role not in SUPPORT_ROLES]


@dataclass(frozen=True)
class Decision:
    ok: bool
    reason: str | None = None
    message: str = ""
    edge: MEdge | None = None
    forced: tuple[str, str] | None = None  # (to, terminal reason) the supervisor applies instead
    alarm: bool = False  # an invariant was violated


class MachineError(ValueError):
    """A declaration that cannot become a runtime machine."""


def machine_for(raw: Any) -> Machine | None:
    """The normalised machine of a launch's declaration (None: no machine)."""
    if raw is None:
        return None
    key = json.dumps(raw, sort_keys=True, default=str)
    return _cached(key)


@functools.lru_cache(maxsize=256)
def _cached(key: str) -> Machine:
    raw = json.loads(key)
    return normalize(validate_phases(resolve_declaration(raw)))


def resolve_declaration(raw: Any) -> Any:
    """`"default"` (or `["default"]`) stands for the default machine of docs/spec-conformance.md §5.1."""
    if raw == DEFAULT_NAME or raw == [DEFAULT_NAME] or raw is True:
        return DEFAULT_MACHINE
    return raw


def normalize(decl: PhaseDeclaration) -> Machine:
    """Add the terminals and one unconditional injected edge to each of them from every non-terminal phase."""
    phases: dict[str, MPhase] = {}
    declared_done = False
    for p in decl.phases:
        edges = [MEdge(e.to, e.when, e.rework, e.actor_role) for e in p.next]
        declared_done |= any(e.to == "done" for e in edges)
        if not p.terminal:
            have = {e.to for e in edges}
            edges += [MEdge(t, injected=True) for t in TERMINAL_PHASES if t not in have]
        phases[p.id] = MPhase(p.id, tuple(edges), p.require, p.timeout_ms, p.terminal)
    for t in TERMINAL_PHASES:
        phases.setdefault(t, MPhase(t, (), terminal=True))
    return Machine(decl.start, phases, decl.max_rework, declared_done)


def describe(machine: Machine) -> str:
    """The machine as a few lines for the centurion's prompt."""
    lines = [f"Your phase machine (start '{machine.start}', at most {machine.max_rework} rework(s)):"]
    for phase in machine.phases.values():
        if phase.terminal:
            continue
        outs = []
        for e in phase.edges:
            if e.injected and e.to != "failed":
                continue
            tags = [*e.when, *(["rework"] if e.rework else []), *([f"only {e.actor_role}"] if e.actor_role else [])]
            outs.append(e.to + (f" ({', '.join(tags)})" if tags else ""))
        req = f" [requires {', '.join(phase.require)}]" if phase.require else ""
        lines.append(f"- {phase.id}{req} → {', '.join(outs)}")
    lines.append("Request each move with legion_phase {to, note, evidence, reason, supersedes}; 'aborted' is the "
                 "parent's decision and 'failed' needs a reason.")
    return "\n".join(lines)


# ----- conditions -------------------------------------------------------------------------------

Check = Callable[[Facts, int], "tuple[str, str] | None"]


def _children_settled(f: Facts, _m: int) -> tuple[str, str] | None:
    live = [c.id for c in f.children if c.live]
    if live:
        return "children_not_terminal", (f"member(s) still running: {', '.join(live)}; wait for them "
                                         "(subagent wait), or stop/retire them, then retry")
    return None


def _children_present(f: Facts, _m: int) -> tuple[str, str] | None:
    if not f.workers:
        return "condition_not_met", ("children_present: the team has no workers yet (planners, scouts and "
                                     "reviewers do not count); dispatch the work first")
    return None


def _children_none_failed(f: Facts, _m: int) -> tuple[str, str] | None:
    failed = [c.id for c in f.children if c.failed]
    if not failed:
        return None
    if f.workers and all(c.status == "failed" for c in f.workers):
        return "all_workers_failed", (f"every worker failed ({', '.join(c.id for c in f.workers)}): re-dispatch "
                                      "the work, or request 'failed' with a reason")
    return "condition_not_met", (f"children_none_failed: unhandled failed member(s) {', '.join(failed)}: "
                                 "re-dispatch them, name them in 'supersedes' if a settled sibling took over "
                                 "their work, or request 'failed' with a reason")


def _contract_file(f: Facts, _m: int) -> tuple[str, str] | None:
    if f.contract_ok:
        return None
    return "contract_path_required", (f"no contract: {f.contract_hint or 'write the contract file first'}; give its "
                                      "path (relative to the worktree) as 'evidence'")


def _verdict_ok(f: Facts, _m: int) -> tuple[str, str] | None:
    if not f.reviewer_settled:
        return "reviewer_not_settled", "no reviewer has settled yet: a verdict counts only after a reviewer settled"
    if f.verdict is None:
        return "review_verdict_not_accepted", (f"the latest settled reviewer wrote no valid legion-verdict "
                                               f"({f.verdict_error}); dispatch a reviewer again")
    if not f.verdict.ok:
        return "review_verdict_not_accepted", f"the latest verdict is ok: false ({f.verdict.summary}); rework first"
    return None


def _verdict_not_ok(f: Facts, _m: int) -> tuple[str, str] | None:
    if not f.reviewer_settled:
        return "reviewer_not_settled", "no reviewer has settled yet: a verdict counts only after a reviewer settled"
    if f.verdict is not None and f.verdict.ok:
        return "review_verdict_not_rejected", f"the latest verdict is ok: true ({f.verdict.summary}); no rework is due"
    return None


def _verification_passed(f: Facts, _m: int) -> tuple[str, str] | None:
    if f.verification is True:
        return None
    state = "not run yet in this stint" if f.verification is None else "red"
    return "verification_not_passed", f"verification is {state}; the supervisor moves the team when it is green"


def _verification_failed(f: Facts, _m: int) -> tuple[str, str] | None:
    if f.verification is False:
        return None
    state = "not run yet in this stint" if f.verification is None else "green"
    return "verification_not_failed", f"verification is {state}: there is nothing to rework"


def _rework_available(f: Facts, max_rework: int) -> tuple[str, str] | None:
    if f.rework_count < max_rework:
        return None
    return "condition_not_met", f"rework_available: {f.rework_count} of {max_rework} rework(s) used"


def _children_all_failed(f: Facts, _m: int) -> tuple[str, str] | None:
    if f.workers and all(c.status == "failed" for c in f.workers):
        return None
    ok = [c.id for c in f.workers if c.status != "failed"]
    return "all_children_not_failed", (f"not every worker failed ({', '.join(ok) or 'no workers'}): this edge is "
                                       "for a team whose members all failed")


CONDITIONS: Final[dict[str, Check]] = {
    "always": lambda f, m: None,
    "contract_file": _contract_file,
    "children_settled": _children_settled,
    "children_present": _children_present,
    "children_none_failed": _children_none_failed,
    "verdict_ok": _verdict_ok,
    "verdict_not_ok": _verdict_not_ok,
    "verification_passed": _verification_passed,
    "verification_failed": _verification_failed,
    "rework_available": _rework_available,
    "children_all_failed": _children_all_failed,
}


def check_condition(name: str, facts: Facts, max_rework: int) -> tuple[str, str] | None:
    """(reason, text) when `name` does not hold; an unknown name raises (it never passes silently)."""
    try:
        fn = CONDITIONS[name]
    except KeyError:
        raise MachineError(f"unknown phase condition {name!r}; known: {', '.join(CONDITIONS)}") from None
    return fn(facts, max_rework)


# ----- evaluation -------------------------------------------------------------------------------

def _no(reason: str, message: str, **extra: Any) -> Decision:
    return Decision(False, reason, f"{reason}: {message}", **extra)


def evaluate(machine: Machine, current: str | None, to: Any, actor: str, facts: Facts,
             reason: str | None = None) -> Decision:
    """Decide one requested transition; rejections carry a §5.4 reason and how to fix it."""
    if not isinstance(to, str) or to not in machine.phases:
        known = ", ".join(machine.phases)
        return _no("invalid_phase", f"{to!r} is not a phase of this machine; its phases: {known}")
    if current is None or current not in machine.phases:
        return _no("invalid_phase", f"the team's current phase {current!r} is not part of its machine")
    if to == current:  # before the terminal check: done → done is a repeat, not an attempt to leave 'done'
        return _no("same_phase", f"the team is already in '{current}'")
    if machine.phases[current].terminal:
        return _no("terminal_phase", f"the team is in terminal phase '{current}'; nothing can follow it")
    edge = machine.edge(current, to)
    if edge is None:
        legal = ", ".join(machine.legal(current))
        return _no("invalid_transition", f"'{current}' has no edge to '{to}'; legal from '{current}': {legal}")
    if edge.injected and to == "done" and actor != "supervisor":
        return _no("injected_done_is_supervisor_only", f"your machine has no such edge ('{current}' → done); "
                   "only the supervisor may complete a team through the injected edge")
    if to == "aborted" and actor == "centurion":
        return _no("actor_not_permitted", "'aborted' is decided by the parent (it retires the team), not by the team; "
                   "request 'failed' with a reason to give up")
    if edge.actor_role is not None and edge.actor_role != actor:
        if edge.actor_role == "centurion":
            return _no(CENTURION_REQUIRED, f"the edge '{current}' → '{to}' is the centurion's own decision")
        return _no("actor_not_permitted", f"the edge '{current}' → '{to}' is reserved for {edge.actor_role}")
    if to == "failed" and (not isinstance(reason, str) or not reason.strip()):
        return _no("terminal_reason_required", "'failed' needs a reason: say why the team gives up")
    conditions = edge.when if to == "aborted" else (*machine.phases[current].require, *edge.when)
    # a review gate's own reason first: with no approving reviewer settled, the team hears reviewer_not_settled or
    # review_verdict_not_accepted, not a general condition_not_met from an earlier worker check on the same edge
    conditions = tuple(sorted(conditions, key=lambda name: name not in VERDICT_CONDITIONS))
    for name in dict.fromkeys(conditions):
        miss = check_condition(name, facts, machine.max_rework)
        if miss is not None:
            return _no(*miss)
    invariant = _invariant(to, facts)
    if invariant is not None:
        return _no("children_not_terminal", invariant, alarm=True)
    if edge.rework and facts.rework_count >= machine.max_rework:
        return _no("rework_limit_exceeded", f"{facts.rework_count} of {machine.max_rework} rework(s) used: the "
                   "team fails (rework_exhausted)", forced=("failed", "rework_exhausted"))
    return Decision(True, edge=edge, message=f"'{current}' → '{to}'")


def _invariant(to: str, facts: Facts) -> str | None:
    if to == "implementing":
        planners = [c.id for c in facts.children if c.role == PLANNER and c.live]
        if planners:
            return (f"invariant: no planner may run during implementing, and {', '.join(planners)} is running; "
                    "wait for it or retire it first")
    if to == "done":
        live = [c.id for c in facts.children if c.live]
        if live:
            return f"invariant: every member is terminal at done, and {', '.join(live)} is still running"
    return None
