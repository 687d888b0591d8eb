"""A pure model of the agent tree, its budgets and its authority rules, written from docs/spec-conformance.md §2
(and the original's inventory it follows), not from the orchestrator's code.

It predicts, for one `subagent` call (or operator verb) from one caller, what the reply must say — accepted or
refused, with which codes — and what the tree is afterwards: each node's status, whether its session is still
hosted, its rounds (recorded results), the notices its parent is owed, the tree-wide counters. The machine in
`test_orchestrator_model.py` runs the same calls through the real orchestrator and compares.

Where the spec leaves an order open (which of several refusals that all apply is reported), the model returns
every code that applies and the reply's must be one of them. Rules, by source:

- Authority (§2.2, the module docstring of orchestration/actions.py): a node acts only on its own children
  (`NOT_YOUR_CHILD`, `UNKNOWN_CHILD` for a name that is no node); the operator acts on any node; `status` reads any.
- Budgets (§2.4): depth in generations — a child's generations are the least of the lineage cap
  (`maxDepth`, at most 4, minus its depth, plus one), its parent's minus one and its card's `maxSubagentDepth`;
  fewer than one refuses. `maxChildrenPerNode` live children per parent, `maxActiveNodes` live nodes in the run, and
  the tree-wide cost budget (spent + every launch's reservation still held + this launch's > the cap). A budget
  refusal writes one `budget_refused` and creates nothing; every refusal creates nothing (§2.3).
- Names (§2.1, §2.10): a slug; a name is taken while its node is live or its session hosted, and belongs to its
  parent's subtree; a reused name starts a new node that keeps the old one's rounds. Unnamed launches are
  `<role>-N`, N after the run's highest.
- Statuses (§2.1): a run's outcome decides its node's status (success → settled, failed|truncated → failed,
  aborted|unknown → retired); a retire or stop retires the node and its live or hosted descendants, children
  first, and a run it cut is no round (§2.9).
- Results loop (§2.9, §6.7): each ended run is one round; its parent is owed a notice until it reads the result
  (wait, collect) or is woken with it — at once when it is idle, at its own run's end otherwise. A settled child
  below the root gives its pool slot back (parked, not hosted).
- Revive (§2.2): `continue`/`steer` of a node with no run give it a run with the message; `resume` without one
  continues only a run a stop cut, else leaves it idle in its last outcome's status; `abort` cuts a run (a round,
  outcome aborted) and is `no-turn` for a node with no session.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# docs/spec-conformance.md §2.1
OUTCOME_STATUS = {"success": "settled", "failed": "failed", "truncated": "failed", "aborted": "retired",
                  "unknown": "retired"}
LIVE = frozenset({"starting", "running", "blocked"})
DEPTH_CEILING = 4  # §2.4: generations below the root at most, whatever maxDepth says
RESERVE_USD = 0.05  # a launch's hold on the tree-wide cost budget until its node first stops being live
SLUG = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
OPERATOR = "operator"

UNKNOWN_CHILD, NOT_YOUR_CHILD, INVALID_PARAMS = "UNKNOWN_CHILD", "NOT_YOUR_CHILD", "INVALID_PARAMS"
BUDGET_EXCEEDED, NAME_TAKEN, UNKNOWN_AGENT = "BUDGET_EXCEEDED", "NAME_TAKEN", "UNKNOWN_AGENT"
NOT_STEERABLE = "SUBAGENT_NOT_STEERABLE"
DECISIONS = ("extend", "steer_again", "stop", "force_stop")
SECTIONS = ("tree", "models", "errors")


@dataclass(frozen=True)
class Budgets:
    max_depth: int
    max_children: int
    max_active: int
    max_cost: float | None


@dataclass
class Node:
    name: str
    parent: str | None
    depth: int
    role: str
    generations: int
    status: str = "running"
    hosted: bool = True
    rounds: int = 0
    outcome: str | None = None  # of its last run (a run a stop cut: aborted)
    cut_by_stop: bool = False  # its last run was cut by a retire or stop: a plain resume continues it
    held: bool = True  # its launch's cost reservation is still held

    @property
    def live(self) -> bool:
        return self.status in LIVE


@dataclass
class Expected:
    """What a reply must say: ok, or one of `codes`; `details` are compared key by key where given."""

    ok: bool
    codes: frozenset[str] = frozenset()
    details: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def refused(*codes: str) -> Expected:
        return Expected(False, frozenset(codes))


class Refused(Exception):
    """A refusal inside the model: the codes that apply."""

    def __init__(self, *codes: str) -> None:
        super().__init__(", ".join(codes))
        self.codes = frozenset(codes)


class TreeModel:
    """The tree after each call (see the module docstring)."""

    def __init__(self, budgets: Budgets, cards: dict[str, int | None], run_cost: float) -> None:
        self.budgets = budgets
        self.cards = cards  # role -> its maxSubagentDepth (None: no cap of its own)
        self.run_cost = run_cost  # what each ended run spends
        self.nodes: dict[str, Node] = {}
        self.owed: dict[str, list[tuple[str, int]]] = {}  # parent -> (child, round) results it was not told of
        self.spent = 0.0
        self.transcripts = 0  # every launch starts one

    # ----- queries -------------------------------------------------------------------------------
    def live(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.live]

    def children(self, name: str) -> list[Node]:
        return [n for n in self.nodes.values() if n.parent == name]

    def subtree(self, name: str) -> list[Node]:
        found: list[Node] = []
        frontier = [name]
        while frontier:
            nxt = []
            for parent in frontier:
                for child in self.children(parent):
                    found.append(child)
                    nxt.append(child.name)
            frontier = nxt
        return found

    def running(self) -> list[str]:
        return [n.name for n in self.nodes.values() if n.status == "running"]

    def _lineage(self) -> int:
        return min(self.budgets.max_depth, DEPTH_CEILING)

    # ----- the root --------------------------------------------------------------------------------
    def launch_root(self, role: str) -> None:
        caps = [self._lineage() + 1] + ([c] if (c := self.cards[role]) is not None else [])
        self.nodes["root"] = Node("root", None, 0, role, min(caps))
        self.transcripts += 1

    # ----- authority -----------------------------------------------------------------------------
    def child_of(self, caller: str, name: Any) -> Node:
        if not isinstance(name, str) or not name:
            raise Refused(INVALID_PARAMS)
        node = self.nodes.get(name)
        if node is None:
            raise Refused(UNKNOWN_CHILD)
        if caller != OPERATOR and node.parent != caller:
            raise Refused(NOT_YOUR_CHILD)
        return node

    # ----- the actions -----------------------------------------------------------------------------
    def call(self, caller: str, args: dict[str, Any]) -> Expected:
        """One `subagent` call from `caller` (a node, or the operator for its verbs)."""
        action = args.get("action")
        handler = getattr(self, f"_{action}", None) if action in ACTIONS else None
        if handler is None:
            return Expected.refused(INVALID_PARAMS)
        try:
            return handler(caller, args)  # type: ignore[no-any-return]
        except Refused as exc:
            return Expected(False, exc.codes)

    def operator_launch(self, parent: str | None, args: dict[str, Any]) -> Expected:
        """`legion launch RUN [--parent P]`: a launch as that node (the root session by default)."""
        under = parent or "root"
        if under not in self.nodes:
            return Expected.refused(UNKNOWN_CHILD)
        return self.call(under, {**args, "action": "launch"})

    def _launch(self, caller: str, args: dict[str, Any]) -> Expected:
        tasks = args.get("tasks")
        if tasks:
            if args.get("task") not in (None, ""):
                raise Refused(INVALID_PARAMS)
            steps = []
            for step in tasks:
                agent = step.get("agent") or args.get("agent")
                if not isinstance(step.get("task"), str) or not step["task"].strip() or not agent:
                    raise Refused(INVALID_PARAMS)
                steps.append((agent, step.get("name")))
        else:
            if not isinstance(args.get("task"), str) or not args["task"].strip() or not isinstance(args.get("agent"), str):
                raise Refused(INVALID_PARAMS)
            steps = [(args["agent"], args.get("name"))]
        names = [n for _, n in steps if n]
        if len(set(names)) != len(names):
            raise Refused(INVALID_PARAMS)
        launched, refused = [], []
        for agent, name in steps:  # one after the other: each sees the ones before it
            try:
                launched.append(self._launch_one(caller, agent, name))
            except Refused as exc:
                refused.append((name, exc.codes))
        details = {"launched": launched, "refused": refused}
        if refused and not launched:
            return Expected(False, refused[0][1], details)
        return Expected(not refused, frozenset(), details)

    def _launch_one(self, caller: str, agent: str, name: str | None) -> str:
        parent = self.nodes[caller]
        codes: set[str] = set()
        previous = self.nodes.get(name) if name else None
        if previous is not None and (previous.live or previous.hosted or previous.parent != caller):
            codes.add(NAME_TAKEN)
        if name and not SLUG.match(name):
            codes.add(INVALID_PARAMS)
        if agent not in self.cards:
            raise Refused(UNKNOWN_AGENT, *codes)
        if INVALID_PARAMS in codes:
            raise Refused(*codes)
        name = name or self._free_name(agent)
        depth = parent.depth + 1
        caps = [self._lineage() - depth + 1, parent.generations - 1]
        if (card := self.cards[agent]) is not None:
            caps.append(card)
        generations = min(caps)
        over = (generations < 1
                or sum(1 for c in self.children(caller) if c.live) + 1 > self.budgets.max_children
                or len(self.live()) + 1 > self.budgets.max_active
                or (self.budgets.max_cost is not None
                    and self.spent + RESERVE_USD * sum(1 for n in self.nodes.values() if n.held) + RESERVE_USD
                    > self.budgets.max_cost))
        if over:
            codes.add(BUDGET_EXCEEDED)
        if codes:
            raise Refused(*codes)
        rounds = previous.rounds if previous is not None else 0
        self.nodes[name] = Node(name, caller, depth, agent, generations, rounds=rounds)  # (a reused name keeps its place)
        self.transcripts += 1
        return name

    def _free_name(self, role: str) -> str:
        pattern = re.compile(rf"^{re.escape(role)}-(\d+)$")
        used = [int(m.group(1)) for n in self.nodes if (m := pattern.match(n))]
        return f"{role}-{max(used, default=0) + 1}"

    def _steer(self, caller: str, args: dict[str, Any]) -> Expected:
        child, message = self._target_and_message(caller, args)
        if child.live:
            return Expected(True, details={"disposition": "queued"})
        self._revive_with(child, message)
        return Expected(True, details={"disposition": "accepted"})

    def _continue(self, caller: str, args: dict[str, Any]) -> Expected:
        codes: set[str] = set()
        try:
            child = self.child_of(caller, args.get("name"))
        except Refused as exc:
            codes |= exc.codes
            child = None
        if _message(args, "task") is None:
            codes.add(INVALID_PARAMS)
        if child is not None and child.live:
            codes.add(NOT_STEERABLE)
        if codes:
            raise Refused(*codes)
        assert child is not None
        self._revive_with(child, _message(args, "task"))
        return Expected(True)

    def _resume(self, caller: str, args: dict[str, Any]) -> Expected:
        child = self.child_of(caller, args.get("name"))
        if child.hosted and child.live:
            return Expected(True, details={"how": None})
        message = args.get("message") or args.get("task")
        if isinstance(message, str) and message:
            self._revive_with(child, message)
            return Expected(True, details={"how": "accepted"})
        if child.hosted:  # idle in its worker: nothing to continue, nothing to give it
            return Expected(True, details={"how": "idle"})
        child.hosted = True
        if child.cut_by_stop:  # a run its stop cut goes on
            child.status, child.cut_by_stop = "running", False
        else:  # idle again, in its last run's status
            child.status = OUTCOME_STATUS[child.outcome or "unknown"]
        return Expected(True, details={"how": "resumed"})

    def _abort(self, caller: str, args: dict[str, Any]) -> Expected:
        child = self.child_of(caller, args.get("name"))
        if child.status != "running":  # no turn in progress (parked, stopped, settled, idle)
            return Expected(True, details={"outcome": "no-turn", "status": child.status})
        self._run_ended(child, "aborted")
        return Expected(True, details={"outcome": "interrupted", "status": child.status})

    def _retire(self, caller: str, args: dict[str, Any]) -> Expected:
        child = self.child_of(caller, args.get("name"))
        done = self._retire_subtree(child)
        return Expected(True, details={"retired": done} if done else {})

    def _stop(self, caller: str, args: dict[str, Any]) -> Expected:
        child = self.child_of(caller, args.get("name"))
        return Expected(True, details={"stopped": self._retire_subtree(child)})

    def _status(self, caller: str, args: dict[str, Any]) -> Expected:
        name = args.get("name")
        if isinstance(name, str) and name and name not in self.nodes:
            raise Refused(UNKNOWN_CHILD)
        return Expected(True)

    def _list(self, caller: str, args: dict[str, Any]) -> Expected:
        kids = [] if caller == OPERATOR else self.children(caller)
        return Expected(True, details={"children": sorted((c.name, c.status) for c in kids)})

    def _wait(self, caller: str, args: dict[str, Any]) -> Expected:
        names = args.get("names") or ([args["name"]] if isinstance(args.get("name"), str) else None)
        if names:
            targets = [self.child_of(caller, n) for n in names]
        else:
            targets = ([n for n in self.nodes.values() if n.parent is None] if caller == OPERATOR
                       else self.children(caller))
            if not targets:
                return Expected(True, details={})
        pending = [t.name for t in targets if t.live]
        for target in targets:
            if not target.live:
                self._read(caller, target)
        if pending:
            return Expected(True, details={"timedOut": True, "pending": pending})
        return Expected(True, details={"settled": [t.name for t in targets]})

    def _collect(self, caller: str, args: dict[str, Any]) -> Expected:
        child = self.child_of(caller, args.get("name"))
        if child.live:
            return Expected(True, details={"timedOut": True})
        self._read(caller, child)
        return Expected(True, details={"status": child.status, "outcome": child.outcome, "round": child.rounds})

    def _diagnose(self, caller: str, args: dict[str, Any]) -> Expected:
        if (args.get("section") or "tree") not in SECTIONS:
            raise Refused(INVALID_PARAMS)
        return Expected(True)

    def _extend(self, caller: str, args: dict[str, Any]) -> Expected:
        decision = args.get("decision") or "extend"
        if decision not in DECISIONS:
            raise Refused(INVALID_PARAMS)
        if decision == "extend":
            return self._wait(caller, args)
        names = args.get("names") or ([args["name"]] if isinstance(args.get("name"), str) else [])
        if not names:
            raise Refused(INVALID_PARAMS)
        if decision in ("stop", "force_stop"):  # one after the other: a refused name stops the rest
            for name in names:
                self._stop(caller, {"name": name})
            return Expected(True)
        if _message(args) is None:
            raise Refused(INVALID_PARAMS)
        for name in names:
            self._steer(caller, {"name": name, "message": args["message"]})
        return self._wait(caller, {"names": names})

    # ----- what the actions share ----------------------------------------------------------------
    def _target_and_message(self, caller: str, args: dict[str, Any]) -> tuple[Node, str]:
        codes: set[str] = set()
        child: Node | None = None
        try:
            child = self.child_of(caller, args.get("name"))
        except Refused as exc:
            codes |= exc.codes
        message = _message(args)
        if message is None:
            codes.add(INVALID_PARAMS)
        if codes:
            raise Refused(*codes)
        assert child is not None and message is not None
        return child, message

    def _revive_with(self, node: Node, message: str) -> None:
        """New input for a node with no run: it runs (relaunched from its transcript first if not hosted)."""
        node.status, node.hosted, node.cut_by_stop = "running", True, False

    def _read(self, reader: str, child: Node) -> None:
        """`reader` read `child`'s results: it is owed no notice of them."""
        if reader in self.owed:
            self.owed[reader] = [(c, r) for c, r in self.owed[reader] if c != child.name]

    def _wake(self, node: Node) -> None:
        """An idle node owed results is woken with one batch of them: it runs, and is owed nothing."""
        self.owed[node.name] = []
        self._revive_with(node, "notice")

    def _run_ended(self, node: Node, outcome: str) -> None:
        """A run ended (settled, or cut by an abort): a round; its parent is told (now if idle); it is told what
        its children left it meanwhile; a settled child of a parent gives its slot back."""
        node.status, node.outcome, node.cut_by_stop, node.held = OUTCOME_STATUS[outcome], outcome, False, False
        node.rounds += 1
        if node.parent is not None:
            self.owed.setdefault(node.parent, []).append((node.name, node.rounds))
            parent = self.nodes[node.parent]
            if not parent.live:
                self._wake(parent)
        if self.owed.get(node.name):
            self._wake(node)
        if not node.live and node.parent is not None:
            node.hosted = False

    def _retire_subtree(self, node: Node) -> list[str]:
        done = []
        for each in [*reversed(self.subtree(node.name)), node]:
            if each.status == "retired" and not each.hosted:
                continue
            if each.status == "running":  # the stop cuts its run: no round, and a plain resume continues it
                each.cut_by_stop, each.outcome = True, "aborted"
            each.status, each.hosted, each.held = "retired", False, False
            done.append(each.name)
        return done

    # ----- what the host does on its own ------------------------------------------------------------
    def settle(self, name: str, outcome: str) -> None:
        """The running node `name`'s run ends with `outcome` (its model's last turn)."""
        node = self.nodes[name]
        assert node.status == "running", f"{name} is {node.status}"
        self.spent += self.run_cost
        self._run_ended(node, outcome)


ACTIONS = frozenset({"launch", "continue", "steer", "abort", "resume", "retire", "status", "collect", "list", "wait",
                     "stop", "diagnose", "extend"})


def _message(args: dict[str, Any], *alternatives: str) -> str | None:
    for key in ("message", *alternatives):
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return None
