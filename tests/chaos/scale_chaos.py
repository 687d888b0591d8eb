"""One trial of the chaos suite at scale: a seeded fault schedule over a scripted tree, then its invariants.

The tree: root → leads → workers (about √N leads; 100 nodes = root + 9 leads + 90 workers), scripted models.
Each worker runs one or two `bash` sleeps (tool processes to kill), some mail their lead (`legion_mail`), some
then wait for a gate file the trial creates after its last fault (so the tree is still at work at every fault),
and each answers. Each lead launches its workers with `tasks[]`, some mail the root, then either block in
`subagent wait` or settle and are woken by their workers' notices. The backend alternates with the seed: odd
seeds run every session in its own rpc worker (`supervision.forceRpc`), even seeds in the pool.

The faults (`KINDS`), at seeded random moments after the root runs:
- `pool`: SIGKILL the pool worker;
- `rpc`: SIGKILL a random rpc worker (rpc trials);
- `tool`: SIGKILL a random tool process (a `bash` shell a session runs);
- `stop`: SIGSTOP a worker (the pool, or an rpc worker whose node is running) for longer than the hang threshold:
  until the root judges it hung and kills it;
- `root`: SIGKILL the root supervisor, then `legion resume RUN --all`; the faults scheduled after it hit the
  resumed run.
At most `MAX_RESTARTS` of the faults that cost a restart (`pool`, `rpc`, `stop`) per trial: the default restart
intensity (3 in 60 s) allows them, so the tree deserves to finish: exit 0, every node settled.

The invariants (`check`), after the trial:
- every node is terminal or paused (none stuck live), and, as the tree deserves, settled; exit status 0;
- no launch created two nodes: the node set is exactly the tree's, each node's task reached it exactly once;
- every transcript parses (a header, no unreadable line, no torn tail, nothing quarantined), and every entry
  in any transcript just before a fault is still there at the end;
- every mail is DELIVERED, BOUNCED or OBSOLETE, or still deliverable (PENDING to a paused node, or ACCEPTED
  with its envelope in the recipient's transcript);
- `PRAGMA integrity_check` is ok; every artifact row has its file (same size) and every round file its row;
  every member's result is recorded and none is still owed to its parent;
- no process of the run (they carry the trial's environment marker) outlives the run, nor the killed root.

`plan(seed, nodes)` derives everything from the seed: the tree, the scripts and the fault schedule, and the
victim picks (which process a pick lands on also depends on which processes run at that moment).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from legion.ledger import open_ledger
from legion.ledger.constants import LIVE_STATUSES, Delivery
from legion.supervision.hang import HANG_MISSES
from legion.workers.fixture_worker import MARKER_ENV, find_marked
from legion.workers.transcript import context_messages, read_transcript, text_of
from tests.e2e.harness import (
    LEGION,
    Project,
    call,
    launch,
    node_rows,
    project,
    subagent,
    tools,
)
from tests.support import wait_until

KINDS = ("pool", "rpc", "tool", "stop", "root")
# faults that cost a restart (pool, rpc, stop): at most the default restart intensity, 3 in 60 s (README); a
# trial's faults span less than 60 s
MAX_RESTARTS = 3
HANG_LIMIT_S = 1.0 * HANG_MISSES  # the root's hang threshold at the default 1 s heartbeat
POOL = "pool"  # how a fault record names the pool
TERMINAL_OR_PAUSED = ("settled", "failed", "retired")
FINAL_MAIL = (Delivery.DELIVERED, Delivery.BOUNCED, Delivery.OBSOLETE)


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule: `at` seconds after its phase began (phase 0: `legion run`, 1: the resume)."""

    at: float
    kind: str
    phase: int = 0


@dataclass
class Plan:
    """One trial: the tree, its backend and the fault schedule, all from the seed."""

    seed: int
    nodes: int
    backend: str
    leads: dict[str, list[str]]
    faults: list[Fault]
    rng: random.Random = field(repr=False)

    @property
    def names(self) -> list[str]:
        return ["root", *self.leads, *(w for ws in self.leads.values() for w in ws)]

    @property
    def parent(self) -> dict[str, str]:
        out = {lead: "root" for lead in self.leads}
        out.update({w: lead for lead, ws in self.leads.items() for w in ws})
        return out

    def describe(self) -> str:
        faults = ", ".join(f"{f.kind}@{f.at:.1f}s" + (" (resumed run)" if f.phase else "") for f in self.faults)
        return f"seed {self.seed}: {self.nodes} nodes, {self.backend}, faults {faults}"

    def replay(self) -> str:
        return (f"replay: LEGION_CHAOS_SEED={self.seed} LEGION_CHAOS_NODES={self.nodes} "
                "pytest tests/chaos/test_scale_chaos.py")


def plan(seed: int, nodes: int = 100) -> Plan:
    """The trial of `seed` on a tree of `nodes` (≥ 7)."""
    if nodes < 7:
        raise ValueError(f"a chaos tree needs at least 7 nodes (root, 2 leads, 4 workers), got {nodes}")
    rng = random.Random(f"chaos-scale:{seed}")
    backend = "rpc" if seed % 2 else "inprocess"
    n_leads = max(2, round(math.sqrt(nodes - 1)) - 1)
    leads: dict[str, list[str]] = {f"l{i}": [] for i in range(n_leads)}
    for j in range(nodes - 1 - n_leads):
        leads[f"l{j % n_leads}"].append(f"l{j % n_leads}w{j // n_leads}")
    span = 8.0 if nodes <= 150 else 20.0  # the faults fall while the tree launches and works
    restarting = ["pool"] if backend == "inprocess" else ["rpc", "rpc", "pool"]
    stop = rng.random() < 0.5
    kinds = ["tool"] * rng.randint(1, 2) + (["stop"] if stop else [])
    kinds += [rng.choice(restarting) for _ in range(rng.randint(1, MAX_RESTARTS - stop))]
    rng.shuffle(kinds)
    times = sorted(round(rng.uniform(0.5, span), 2) for _ in kinds)
    faults = [Fault(t, k) for t, k in zip(times, kinds, strict=True)]
    if rng.random() < 0.5:  # the root dies at a random moment; the faults after it hit the resumed run
        at = round(rng.uniform(0.5, span), 2)
        faults = ([f for f in faults if f.at < at] + [Fault(at, "root")]
                  + [Fault(round(f.at - at + 0.5, 2), f.kind, 1) for f in faults if f.at >= at])
    return Plan(seed, nodes, backend, leads, faults, rng)


# ----- the tree's scripts ------------------------------------------------------------------------------

def build(proj: Project, p: Plan, gate: Path) -> str:
    """Cards and scripts of the tree; returns the root's model. Every launch request is made once (a parent whose
    launch call a fault cut goes on with its script): a second node or session for a name is the product's."""
    proj.card("cworker", tools=["bash", "legion_mail"])
    proj.card("clead", tools=["bash", "subagent", "legion_mail"], allowNestedSubagents=True, maxSubagentDepth=2)
    rng = p.rng
    gate_wait = tools(call("bash", {"command": f"until [ -f {gate} ]; do sleep 0.1; done; echo open"}))
    workers = [w for ws in p.leads.values() for w in ws]
    gated = {rng.choice(workers)} | {w for w in workers if rng.random() < 0.4}
    lead_tasks = []
    for lead, members in p.leads.items():
        kids = []
        for w in members:
            turns: list[Any] = [tools(call("bash", {"command": f"sleep {rng.uniform(0.2, 2.5):.2f}; echo worked"}))
                                for _ in range(rng.randint(1, 2))]
            if rng.random() < 0.3:
                turns.append(tools(call("legion_mail", {"to": "parent", "subject": f"{w} progress",
                                                        "body": f"{w} is half-way", "kind": "report"})))
            if w in gated:  # one gate step per fault and one more: a fault cuts at most one step of each worker
                turns += [gate_wait] * (len(p.faults) + 1)
            turns.append({"text": f"{w} RESULT {w}-answer"})
            kids.append({"name": w, "agent": "cworker", "task": task(p, w),
                         "model": proj.script(w, *turns, default={"text": f"{w} noted"})})
        turns = [launch(*kids)]
        if rng.random() < 0.5:
            turns.append(tools(call("legion_mail", {"to": "parent", "subject": f"{lead} launched",
                                                    "body": f"{lead} launched {len(kids)} workers", "kind": "report"})))
        turns += ([subagent("wait", timeoutMs=600_000), {"text": f"{lead} RESULT {lead}-answer"}]
                  if rng.random() < 0.5 else [{"text": f"{lead} RESULT settles, woken by notices"}])
        model = proj.script(lead, *turns, default={"text": f"{lead} noted"})
        lead_tasks.append({"name": lead, "agent": "clead", "task": task(p, lead), "model": model})
    return proj.script("root", launch(*lead_tasks), {"text": "root waits for its leads' notices"},
                       default={"text": "root noted"})


def task(p: Plan, name: str) -> str:
    return f"chaos task of {name} (seed {p.seed})"


# ----- processes ---------------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _table() -> dict[int, tuple[int, str]]:
    """The live processes of the machine: pid → (parent pid, name); one pass over /proc."""
    out = {}
    for proc in psutil.process_iter(["ppid", "name", "status"]):
        info = proc.info
        if info["status"] != psutil.STATUS_ZOMBIE and info["ppid"] is not None:
            out[proc.pid] = (int(info["ppid"]), str(info["name"]))
    return out


def _open_in(pid: int, run: Path) -> list[str]:
    """The names of the files of `run` (the run directory itself, not below) that `pid` holds open."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    out = []
    for fd in fds:
        with contextlib.suppress(OSError):
            target = Path(os.readlink(f"/proc/{pid}/fd/{fd}"))
            if target.parent == run:
                out.append(target.name)
    return out


class Victims:
    """The processes of the live run whose root is `root_pid` (one snapshot of the process table): its pool, its rpc
    workers, and the bash shells their sessions run as tool calls. A worker is known by the files it holds open
    (the ledger names no pid of the pool, which is no node, nor of a worker a resume revived): the pool writes
    pool.log, an rpc worker holds its node's transcript `<node>.jsonl` (or `<node>.<n>.jsonl`)."""

    def __init__(self, run: Path, root_pid: int) -> None:
        table = _table()
        self.pool: int | None = None
        self.rpc: dict[int, str] = {}
        for pid in (pid for pid, (ppid, _) in table.items() if ppid == root_pid):
            files = _open_in(pid, run)
            if "pool.log" in files:
                self.pool = pid
            elif transcripts := [f for f in files if f.endswith(".jsonl")]:
                self.rpc[pid] = transcripts[0].split(".")[0]
        kids: dict[int, list[int]] = {}
        for pid, (ppid, _) in table.items():
            kids.setdefault(ppid, []).append(pid)
        todo = [*self.rpc, *([self.pool] if self.pool else [])]
        below: list[int] = []
        while todo:
            for kid in kids.get(todo.pop(), []):
                below.append(kid)
                todo.append(kid)
        self.tools = sorted(pid for pid in below if table[pid][1] == "bash")

    def node_of(self, pid: int) -> str:
        return self.rpc.get(pid, POOL if pid == self.pool else "-")


# ----- a trial ----------------------------------------------------------------------------------------

@dataclass
class Trial:
    """What happened in one trial and what it broke."""

    plan: Plan
    run: Path
    faults: list[dict[str, Any]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    exits: list[int | None] = field(default_factory=list)
    snapshots: dict[str, set[str]] = field(default_factory=dict)  # transcript → entry ids seen before a fault
    nodes: list[str] = field(default_factory=list)  # the ledger's nodes at the end
    seconds: float = 0.0
    root_killed: bool = False
    output: str = ""  # the tails of `legion run` / `legion resume` output

    def record(self) -> dict[str, Any]:
        return {"seed": self.plan.seed, "nodes": self.plan.nodes, "backend": self.plan.backend,
                "faults": self.faults, "exits": self.exits, "seconds": round(self.seconds, 1),
                "never_launched": sorted(set(self.plan.names) - set(self.nodes)),
                "ok": not self.violations, "violations": self.violations}

    def explain(self) -> str:
        return (f"{self.plan.describe()}\n{self.plan.replay()}\nfaults applied: {json.dumps(self.faults)}\n"
                f"exit statuses: {self.exits}\nviolations:\n- " + "\n- ".join(self.violations)
                + f"\n{self.output}")


class Runner:
    """Runs one plan: `legion run`, its faults, the resume after a root kill, then the checks."""

    def __init__(self, proj: Project, p: Plan, run_timeout: float) -> None:
        self.proj, self.p, self.run_timeout = proj, p, run_timeout
        self.marker = f"cs{p.seed}-{uuid.uuid4().hex[:10]}"
        proj.env[MARKER_ENV] = self.marker
        self.gate = proj.dir / "gate"
        self.run_id = proj.next_run_id()
        self.trial = Trial(p, proj.run_path(self.run_id))
        self.proc: subprocess.Popen[bytes] | None = None
        self.root_killed = False

    # ---- processes
    def _start(self, *args: str, log: str) -> subprocess.Popen[bytes]:
        out = open(self.proj.dir / f"{log}.out", "wb")  # noqa: SIM115 - the child holds it; closed after its end
        try:
            return subprocess.Popen([LEGION, *args], cwd=self.proj.dir, env={**os.environ, **self.proj.env},
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            out.close()

    def _kill_all(self) -> None:
        """Clean-up: whatever of the run is still alive (a failed trial's leftovers)."""
        for pid in find_marked(self.marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def _ended(self) -> bool:
        return self.proc is None or self.proc.poll() is not None

    def violate(self, what: str) -> None:
        self.trial.violations.append(what)

    # ---- the trial
    def execute(self) -> Trial:
        started = time.monotonic()
        root_model = build(self.proj, self.p, self.gate)
        try:
            self.proc = self._start("run", "chaos at scale", "--run-id", self.run_id, "--model", root_model,
                                    "--timeout", str(int(self.run_timeout)), log="run")
            self._phase(0)
            if self.root_killed:
                self.proc = self._start("resume", self.run_id, "--all", "--timeout", str(int(self.run_timeout)),
                                        log="resume")
                self._phase(1)
            self.gate.write_text("")
            self.trial.exits.append(self.proc.wait(self.run_timeout + 60))
            self._no_survivors("the run ended")
        except (AssertionError, subprocess.TimeoutExpired) as exc:  # a deadline of the trial's own waits
            self.violate(f"the trial could not go on: {exc}")
        finally:
            self._kill_all()
            self.trial.seconds = time.monotonic() - started
            for name, path in (("legion run", self.proj.dir / "run.out"), ("legion resume", self.proj.dir / "resume.out"),
                               ("legion.log", self.trial.run / "legion.log")):
                with contextlib.suppress(OSError):
                    self.trial.output += f"--- {name} (tail):\n{path.read_text(errors='replace')[-2500:]}\n"
        check(self.trial, self.proj)
        return self.trial

    def _phase(self, phase: int) -> None:
        """Wait until the run (or the resumed run) is up, then apply that phase's faults at their moments."""
        assert self.proc is not None
        proc, run = self.proc, self.trial.run
        if phase == 0:
            # past `starting` (the root settles right after its launch turn: a poll can miss its `running`)
            wait_until(lambda: node_rows(run).get("root", {}).get("status") not in (None, "starting") or self._ended(),
                       120, f"the root running; {self.p.describe()}", interval=0.05)
        else:
            wait_until(lambda: Victims(run, proc.pid).pool is not None or self._ended(), 120,
                       f"the resumed run's pool; {self.p.describe()}", interval=0.05)
        t0 = time.monotonic()
        for fault in (f for f in self.p.faults if f.phase == phase):
            if self._ended() or not self._sleep_until(t0 + fault.at):
                self.violate(f"the run ended (exit {proc.returncode}) before its fault {fault.kind}@{fault.at}s "
                             f"(phase {phase}): the gate holds it open until the last fault")
                return
            self._snapshot()
            self._apply(fault)
            if fault.kind == "root":
                return

    def _sleep_until(self, when: float) -> bool:
        """Wait for the fault's seeded moment (not for a condition); False when the run ended meanwhile."""
        assert self.proc is not None
        try:
            self.proc.wait(timeout=max(0.0, when - time.monotonic()))
        except subprocess.TimeoutExpired:
            return True
        return False

    def _snapshot(self) -> None:
        """Every transcript entry on disk before the fault (its id): none may be lost."""
        for path in self.trial.run.glob("*.jsonl"):
            with contextlib.suppress(OSError):
                ids = {str(e["id"]) for e in read_transcript(path).entries if isinstance(e.get("id"), str)}
                self.trial.snapshots.setdefault(path.name, set()).update(ids)

    def _pick(self, what: str, candidates: Callable[[Victims], list[int]]) -> tuple[int, Victims] | None:
        """A seeded pick among the processes `candidates` finds in the run, waiting (up to 60 s) for one."""
        assert self.proc is not None
        proc = self.proc
        seen: list[Victims] = []

        def some() -> bool:
            seen[:] = [Victims(self.trial.run, proc.pid)]
            return bool(candidates(seen[0])) or self._ended()

        try:
            wait_until(some, 60, f"a {what} to hit", interval=0.05)
        except AssertionError as exc:
            self.violate(f"no {what} while the run was at work: {exc}")
        found = sorted(candidates(seen[0])) if seen else []
        return (self.p.rng.choice(found), seen[0]) if found else None

    def _apply(self, fault: Fault) -> None:
        assert self.proc is not None
        entry: dict[str, Any] = {"kind": fault.kind, "phase": fault.phase, "at": fault.at}
        self.trial.faults.append(entry)
        if fault.kind == "root":
            entry["pid"] = self.proc.pid
            self.proc.kill()
            self.trial.exits.append(self.proc.wait(30))
            self.root_killed = self.trial.root_killed = True
            self._no_survivors("the root was SIGKILLed")
            return
        if fault.kind == "stop":
            self._stop(entry)
            return
        pick = {"pool": lambda v: [v.pool] if v.pool else [], "rpc": lambda v: list(v.rpc), "tool": lambda v: v.tools}
        victims = self._pick(fault.kind, pick[fault.kind])
        if victims is None:
            return
        pid, v = victims
        entry.update(pid=pid, node=v.node_of(pid))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not _alive(pid), 30, f"pid {pid} gone after SIGKILL; {self.p.describe()}")

    def _stop(self, entry: dict[str, Any]) -> None:
        """SIGSTOP a worker until the root finds it hung and kills it (SIGCONT and a violation if it never does)."""
        if self.p.backend == "inprocess":
            victims = self._pick("pool to stop", lambda v: [v.pool] if v.pool else [])
        else:
            def running(v: Victims) -> list[int]:
                rows = node_rows(self.trial.run)
                return [pid for pid, node in v.rpc.items() if rows.get(node, {}).get("status") == "running"]
            victims = self._pick("running rpc worker to stop", running)
        if victims is None:
            return
        pid, v = victims
        entry.update(pid=pid, node=v.node_of(pid))
        t0 = time.monotonic()
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_until(lambda: not _alive(pid) or self._ended(), HANG_LIMIT_S + 40.0, "the stopped worker killed as hung",
                       interval=0.1)
            entry["held_s"] = round(time.monotonic() - t0, 1)
            if _alive(pid):
                raise AssertionError("the run ended with its worker stopped")
        except AssertionError as exc:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self.violate(f"worker {pid} ({entry['node']}) stopped for {time.monotonic() - t0:.0f} s, beyond the "
                         f"{HANG_LIMIT_S:.0f} s hang threshold, was never killed as hung ({exc})")

    def _no_survivors(self, when: str) -> None:
        """No process of the run is left once its root is gone (they carry the trial's marker)."""
        try:
            wait_until(lambda: not find_marked(self.marker), 15, "no process of the run left", interval=0.2)
        except AssertionError:
            left = []
            for pid in find_marked(self.marker):
                with contextlib.suppress(psutil.Error):
                    left.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:80]}")
            self.violate(f"processes of the run alive 15 s after {when}: {left}")
            for pid in find_marked(self.marker):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def run_trial(p: Plan, run_timeout: float | None = None) -> Trial:
    """Run `p` in a fresh project (removed afterwards unless LEGION_TEST_KEEP is set)."""
    timeout = run_timeout or (240.0 if p.nodes <= 150 else 600.0)
    with project() as proj:
        settings: dict[str, Any] = {
            "legion": {"maxChildrenPerNode": p.nodes, "maxActiveNodes": p.nodes + 10},
            "inprocess": {"maxActive": p.nodes + 10},
            "supervision": {"forceRpc": p.backend == "rpc"},
        }
        proj.settings(settings)
        return Runner(proj, p, timeout).execute()


# ----- the invariants ----------------------------------------------------------------------------------

def check(trial: Trial, proj: Project) -> None:
    """Append to `trial.violations` every invariant the finished run breaks."""
    p, run, bad = trial.plan, trial.run, trial.violations.append
    deserved = 0
    final = trial.exits[-1] if trial.exits else None
    if final != deserved:
        bad(f"the run ended with exit status {final}; its tree deserves {deserved} (exits: {trial.exits})")
    rows = node_rows(run)
    trial.nodes = sorted(rows)
    missing, extra = sorted(set(p.names) - set(rows)), sorted(set(rows) - set(p.names))
    if extra:
        bad(f"nodes no launch asked for (a launch made two): {extra}")
    # a root killed in the middle of a parent's `tasks[]` launch leaves the rest of it unlaunched: the parent is
    # told its call may not have completed (a model would launch them again; the scripts go on)
    cut = [n for n in missing if not trial.root_killed or n == "root"]
    if cut:
        bad(f"nodes never launched though no root kill cut their parent's launch: {cut}")
    moved = {n: r.get("parent_id") for n, r in rows.items() if n in p.parent and r.get("parent_id") != p.parent[n]}
    if moved:
        bad(f"nodes under another parent than the one that launched them: {moved}")
    stuck = {n: r["status"] for n, r in rows.items() if r["status"] not in TERMINAL_OR_PAUSED}
    if stuck:
        bad(f"nodes neither terminal nor paused (stuck live: {LIVE_STATUSES}): {stuck}")
    unsettled = {n: r["status"] for n, r in rows.items() if r["status"] != "settled" and n not in stuck}
    if unsettled:
        bad(f"nodes the tree deserves settled but are not: {unsettled}")
    _check_transcripts(trial, rows)
    _check_ledger(trial, rows)


def _check_transcripts(trial: Trial, rows: dict[str, dict[str, Any]]) -> None:
    p, run, bad = trial.plan, trial.run, trial.violations.append
    quarantined = sorted(x.name for x in run.glob("*.jsonl.*") if ".damaged-" in x.name or ".torn-" in x.name)
    if quarantined:
        bad(f"transcripts were damaged and repaired (copies kept): {quarantined}")
    for name, row in sorted(rows.items()):
        path = Path(str(row.get("session_file") or run / f"{name}.jsonl"))
        if path.name != f"{name}.jsonl":
            bad(f"{name}'s transcript is {path.name}: a second session was made for it")
        try:
            data = read_transcript(path)
        except OSError as exc:
            bad(f"{name}'s transcript cannot be read: {exc}")
            continue
        if data.header is None or data.bad_lines or data.torn_tail:
            bad(f"{name}'s transcript does not parse: header {'ok' if data.header else 'missing'}, unreadable "
                f"lines {data.bad_lines[:5]}, torn tail {data.torn_tail[:60]!r}")
        if name != "root":
            told = sum(task(p, name) in text_of(m) for m in context_messages(data.entries) if m.get("role") == "user")
            if told != 1:
                bad(f"{name} was given its task {told} times (one launch, one session)")
        ids = {str(e["id"]) for e in data.entries if isinstance(e.get("id"), str)}
        lost = trial.snapshots.get(path.name, set()) - ids
        if lost:
            bad(f"{name}'s transcript lost {len(lost)} entries it had before a fault: {sorted(lost)[:5]}")


def _check_ledger(trial: Trial, rows: dict[str, dict[str, Any]]) -> None:
    run, bad = trial.run, trial.violations.append
    db = sqlite3.connect(run / "legion.db")
    try:
        integrity = [r[0] for r in db.execute("PRAGMA integrity_check")]
        if integrity != ["ok"]:
            bad(f"PRAGMA integrity_check: {integrity[:5]}")
        mails = db.execute("SELECT id, from_node, to_node, delivered FROM messages").fetchall()
        arts = db.execute("SELECT node_id, name, round, path, bytes FROM artifacts").fetchall()
    finally:
        db.close()
    for mid, sender, to, state in mails:
        if state in FINAL_MAIL:
            continue
        status = rows.get(to, {}).get("status")
        envelope = f"[legion mail #{mid}]"
        transcript = Path(str(rows.get(to, {}).get("session_file") or run / f"{to}.jsonl"))
        if state == Delivery.PENDING and status == "retired":
            continue  # paused recipient: delivered when it is resumed
        if state == Delivery.ACCEPTED and transcript.exists() and envelope in transcript.read_text(errors="replace"):
            continue  # injected, its confirmation not yet swept
        bad(f"mail #{mid} {sender}→{to} is {Delivery(state).name} and no longer deliverable (recipient {status})")
    recorded: set[tuple[str, int]] = set()
    for node, name, rnd, rel, size in arts:
        recorded.add((name, int(rnd)))
        path = run / rel
        if not path.is_file() or path.stat().st_size != size:
            bad(f"artifact {rel} of {node}: row says {size} bytes, file "
                f"{path.stat().st_size if path.is_file() else 'missing'}")
    for path in sorted(run.glob("artifacts/*/r*.md")):
        with contextlib.suppress(ValueError):
            if (path.parent.name, int(path.stem[1:])) not in recorded:
                bad(f"artifact file {path.relative_to(run)} has no row")
    led = open_ledger(run / "legion.db")
    try:
        members = [n for n in rows if n != "root"]
        unrecorded = [n for n in members if not led.list_artifacts(node_id=n)]
        owed = {n: len(led.undelivered(n)) for n in rows if led.undelivered(n)}
    finally:
        led.close()
    if unrecorded:
        bad(f"members whose result was never recorded: {unrecorded}")
    if owed:
        bad(f"results still owed to their parent at the end: {owed}")
