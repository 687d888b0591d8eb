"""The chaos suite at scale: a 100-node tree under a seeded random fault schedule keeps every invariant.

Each trial (tests/chaos/scale_chaos.py) runs a scripted tree and, at seeded random moments, SIGKILLs the pool, rpc
workers, tool processes and the root (then `legion resume --all`), and SIGSTOPs a worker for longer than the
hang threshold; it then checks the invariants listed there (nodes terminal or paused, one node per launch,
transcripts whole, mail delivered or deliverable, the ledger sound and matching its artifacts, no process
outliving the run, exit status 0).

The test suite runs two trials: seed 7 (rpc: a tool process and an rpc worker SIGKILLed, then the root; in the resumed run
another tool process and rpc worker SIGKILLed and an rpc worker SIGSTOPped) and seed 12 (in-process: the pool
SIGKILLed three times, two tool processes). A failing trial names its seed and how
to replay it: `LEGION_CHAOS_SEED=<seed>` runs that trial alone (`LEGION_CHAOS_NODES` its size, 100 by default);
`LEGION_CHAOS_TRIALS=N` runs seeds 1..N. `bench/chaos_scale.py` runs many trials and reports their seeds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.scale_chaos import KINDS, build, plan, run_trial
from tests.e2e.harness import project

NODES = int(os.environ.get("LEGION_CHAOS_NODES", "100"))
CI_SEEDS = [7, 12]
_ONE, _TRIALS = os.environ.get("LEGION_CHAOS_SEED"), os.environ.get("LEGION_CHAOS_TRIALS")
SEEDS = [int(_ONE)] if _ONE else list(range(1, int(_TRIALS) + 1)) if _TRIALS else CI_SEEDS
# Product bugs the suite found and that are still open (not strict xfails: whether a kill lands in the window is
# timing): a root SIGKILLed between writing the root session's artifact file and its row left the file without a row
# (seed 6, once; not seen again in 140 trials at 100 nodes since: seeds 1-50 twice, 51-90 once).
# Fixed: mail ACCEPTED by a host that died before its transcript recorded it is handed over again when its session
# is relaunched (`Postman._recover`; it was lost in 19 of 50 trials); a run ends only when no mail is PENDING to a node
# of its tree (seed 43) and no batch of completion notices is on its way to any node (seed 46).
ROOT_ARTIFACT = "artifact file artifacts/root/"
KNOWN_BUGS = {
    ROOT_ARTIFACT: "a root killed between the root session's artifact file and its row leaves the file without a "
                   "row; legion resume recovers members' answers only",
}


def test_the_ci_seeds_cover_every_fault() -> None:
    """The two CI trials between them hit the pool, an rpc worker, a tool process and the root, and stop a worker."""
    kinds = {f.kind for seed in CI_SEEDS for f in plan(seed, 100).faults}
    assert kinds == set(KINDS), kinds


def test_a_seed_replays_its_trial() -> None:
    """The same seed gives the same tree, scripts and fault schedule (what a replay needs); another seed does not."""

    def scripts(seed: int) -> tuple[str, dict[str, str]]:
        p = plan(seed, 100)
        with project() as proj:
            build(proj, p, Path("/gate"))
            return p.describe(), {f.name: f.read_text() for f in sorted((proj.dir / "scripts").iterdir())}

    assert scripts(5) == scripts(5)
    assert scripts(5) != scripts(6)


# In the suite since the fixes above: 50 of 50 trials of seeds 1-50 and 40 of 40 of seeds 51-90 passed (100 nodes).
@pytest.mark.timeout(900 if NODES > 150 else 420)
@pytest.mark.parametrize("seed", SEEDS)
def test_a_tree_keeps_every_invariant_under_a_seeded_fault_schedule(seed: int) -> None:
    trial = run_trial(plan(seed, NODES))
    print(trial.record())  # the trial's record (pytest -s)
    known = {bug for v in trial.violations for bug in KNOWN_BUGS if bug in v}
    if trial.violations and all(any(bug in v for bug in KNOWN_BUGS) for v in trial.violations):
        pytest.xfail("known product bug(s): " + "; ".join(KNOWN_BUGS[b] for b in sorted(known)) + f"\n{trial.explain()}")
    assert not trial.violations, trial.explain()
