"""Root SIGKILL at a random moment, then `legion resume RUN --all` (issue 19 item 6's acceptance).

A tree root → leads → workers (scripted models; rpc children, or in-process children in the pool) runs until a
seeded random moment, when the root is SIGKILLed (its workers die with it). `legion resume RUN --all` must then
exit 0 with every node settled, and every worker's final answer in its lead's transcript, every lead's in the
root's: answers finished before the kill are recorded from their transcripts, nodes cut mid-call are revived.

The schedule (each worker's work time, the kill moment) comes from the seed. A failing trial names its seed;
`LEGION_CHAOS_SEED=N` replays that one seed. CI runs 5 seeds × each backend on a 7-node tree; the slow mode is
`LEGION_CHAOS_NODES=100 LEGION_CHAOS_SEEDS=10` (the 100-node tree × 10 seeds).
"""

from __future__ import annotations

import math
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.harness import Project, final_text, kill_tree, launch, node_rows, project, subagent
from tests.support import wait_until

NODES = int(os.environ.get("LEGION_CHAOS_NODES", "7"))
SEEDS = ([int(os.environ["LEGION_CHAOS_SEED"])] if os.environ.get("LEGION_CHAOS_SEED")
         else list(range(int(os.environ.get("LEGION_CHAOS_SEEDS", "5")))))
BIG = NODES > 20
TIMEOUT = 60 if not BIG else 900


@dataclass
class Tree:
    """The shape of one trial: lead name -> its workers, and each worker's work time (s)."""

    leads: dict[str, list[str]]
    work: dict[str, float]

    @property
    def parent(self) -> dict[str, str]:
        out = {lead: "root" for lead in self.leads}
        out.update({w: lead for lead, workers in self.leads.items() for w in workers})
        return out


def shape(nodes: int, rng: random.Random) -> Tree:
    """root + L leads + the rest as workers spread over them (7 → 2 × 2 workers, 100 → 9 × 10)."""
    n_leads = max(2, round(math.sqrt(nodes - 1)) - 1)
    leads: dict[str, list[str]] = {f"l{i}": [] for i in range(n_leads)}
    for j in range(nodes - 1 - n_leads):
        leads[f"l{j % n_leads}"].append(f"l{j % n_leads}w{j // n_leads}")
    workers = [w for ws in leads.values() for w in ws]
    work = {w: round(rng.uniform(0.0, 2.5), 2) for w in workers}
    work[rng.choice(workers)] = 4.0  # the run always outlasts the kill window
    return Tree(leads, work)


def write_scripts(proj: Project, tree: Tree) -> str:
    """Scripts that survive a cut anywhere: a worker works (bash) and answers; a lead launches its workers and
    waits until a result arrives (a wait reply or a notice), then answers; the root does the same for its leads."""
    for lead, workers in tree.leads.items():
        for w in workers:
            proj.script(w, {"tool_calls": [{"name": "bash", "arguments": {"command": f"sleep {tree.work[w]}"}}]},
                        default={"text": f"{w} RESULT {w}-answer"})
        kids = [{"name": w, "agent": "worker", "task": f"work {w}", "model": f"scripted/scripts/{w}.yaml"}
                for w in workers]
        proj.script(lead, launch(*kids), default=subagent("wait"),
                    rules=[{"match": "RESULT", "reply": {"text": f"{lead} RESULT {lead}-answer"}}, relaunch(kids)])
    leads = [{"name": lead, "agent": "lead", "task": f"lead {lead}", "model": f"scripted/scripts/{lead}.yaml"}
             for lead in tree.leads]
    return proj.script("root", launch(*leads), default=subagent("wait"),
                       rules=[{"match": "RESULT", "reply": {"text": "root RESULT all-answered"}}, relaunch(leads)])


def relaunch(kids: list[dict[str, Any]]) -> dict[str, Any]:
    """A call the dead root cut (its launch, perhaps before any child existed) is launched again, as a model would:
    the children that exist refuse their names (NAME_TAKEN), the missing ones start. The latest message is the cut
    call's result or, after a restart, the note that a running tool call may not have completed."""
    return {"match": "^(aborted before completion|the worker stopped while this tool call was running)|"
                     "may not have completed", "reply": launch(*kids)}


@pytest.fixture(params=["rpc", "inprocess"])
def proj(request: pytest.FixtureRequest) -> Iterator[Project]:
    with project() as p:
        p.card("lead", tools=["read", "subagent"], allowNestedSubagents=True, maxSubagentDepth=2)
        settings: dict[str, Any] = {"supervision": {"forceRpc": request.param == "rpc"}}
        if BIG:
            # the in-process admission limits too: a launch the pool's queue has no place for is refused (QUEUE_FULL),
            # and this tree's leads would then wait for a result that never comes
            settings["legion"] = {"maxActiveNodes": NODES + 10, "maxChildrenPerNode": NODES}
            settings["inprocess"] = {"maxActive": NODES + 10}
        p.settings(settings)
        p.env["LEGION_CHAOS_BACKEND"] = request.param
        yield p


def _started(run: Path) -> bool:
    try:
        return '"subagent"' in (run / "root.jsonl").read_text()
    except OSError:
        return False


def _has(path: Path, needle: bytes) -> bool:
    try:
        return needle in path.read_bytes()
    except OSError:
        return False


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie; a process that exits between the two questions is not alive."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("seed", SEEDS)
def test_root_sigkill_at_a_random_moment_then_resume_all_finishes_every_node(proj: Project, seed: int) -> None:
    backend = proj.env["LEGION_CHAOS_BACKEND"]
    replay = (f"replay: LEGION_CHAOS_SEED={seed} LEGION_CHAOS_NODES={NODES} pytest "
              f"'tests/chaos/test_resume_chaos.py' -k '{backend}'")
    rng = random.Random(seed)
    tree = shape(NODES, rng)
    kill_after = rng.uniform(0.3, 3.0 if not BIG else 8.0)
    # even seeds kill the root the moment a random worker's final answer is in its transcript (the root has
    # hardly had time to record it: the window of a finished answer the dead root never recorded), odd seeds
    # at a random time after the root's first launch
    answer_of = rng.choice([w for w, t in tree.work.items() if t < 4.0]) if seed % 2 == 0 else None
    trigger = f"{answer_of}'s answer" if answer_of else f"{kill_after:.2f}s"
    root_model = write_scripts(proj, tree)
    proc, run = proj.start("chaos tree", "--model", root_model, "--timeout", str(TIMEOUT))
    try:
        wait_until(lambda: _started(run) or proc.poll() is not None, TIMEOUT / 2, f"the root's first launch (seed {seed})")
        assert proc.poll() is None, f"seed {seed}: the run ended before the kill ({proc.returncode}); {replay}"
        if answer_of is None:
            time.sleep(kill_after)  # the seeded random moment of the fault (not a wait for a condition)
        else:
            transcript, needle = run / f"{answer_of}.jsonl", f"{answer_of} RESULT".encode()
            wait_until(lambda: _has(transcript, needle), TIMEOUT / 2, f"{answer_of} to answer; {replay}",
                       interval=0.002)
        hosts = _descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: not [h for h in hosts if _alive(h)], 30, f"every worker to die with the root (seed {seed})")
    finally:
        kill_tree(proc)
    before = {n: r["status"] for n, r in node_rows(run).items()}
    resumed = proj.cli("resume", run.name, "--all", "--timeout", str(TIMEOUT * 2 // 3), timeout=TIMEOUT)
    summary = [line for line in resumed.stdout.splitlines()
               if line.startswith(("──", "   ", "recovered", "orphan", "cannot")) and "✔" not in line]
    where = (f"seed {seed} ({backend}, {NODES} nodes, kill at {trigger}; before resume: {before}); "
             f"{replay}\nstdout (without settled nodes):\n" + "\n".join(summary)[-6000:]
             + f"\nstderr:\n{resumed.stderr[-2000:]}")
    assert resumed.returncode == 0, where
    rows = node_rows(run)
    names = ["root", *tree.parent]
    not_done = {n: rows.get(n, {}).get("status") for n in names if rows.get(n, {}).get("status") != "settled"}
    assert not not_done, f"not done: {not_done}; {where}"
    # a node launched again under its name (a lead relaunching a cut launch) has a new transcript: its row names it
    transcript = {n: Path(rows[n]["session_file"]) for n in names}
    lost = [f"{child}→{parent}" for child, parent in tree.parent.items()
            if final_text(transcript[child]) not in transcript[parent].read_text()]
    assert not lost, f"answers that never reached their lead: {lost}; {where}"
    for child in tree.parent:
        assert "RESULT" in final_text(transcript[child]), f"{child} has no final answer; {where}"
    recovered = next((line for line in resumed.stdout.splitlines() if line.startswith("recovered from")), "")
    rounds = {w: len(list((run / "artifacts" / w).glob("r*.md"))) for ws in tree.leads.values() for w in ws}
    # a recovered answer is recorded once (never on top of the dead root's record of it); a worker revived
    # mid-call that settles twice (seen at 100 rpc nodes, not from the recovery) is reported, not failed
    names = set(recovered.split(":", 1)[1].split(" (")[0].split(", ")) if recovered else set()
    # (a worker its lead launched again under its name ran a new conversation: that round is a new one)
    twice = {w: n for w, n in rounds.items() if n != 1 and w in names and transcript[w].name == f"{w}.jsonl"}
    assert not twice, f"recovered answers not recorded exactly once: {twice}; {where}"
    revived_twice = {w: n for w, n in rounds.items() if n > 1}
    print(f"seed {seed} {backend} {NODES} nodes: kill at {trigger}: "  # a trial's record (pytest -s)
          f"{recovered or 'nothing to recover'}; workers with more than one round: {revived_twice or 'none'}")
