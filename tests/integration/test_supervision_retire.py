"""The retire ladder against every naughty fixture behaviour: no survivor, by pid and by marker scan.

Every test runs on both containments: `cgroup` (each worker in its own cgroup; skipped where the
machine does not allow it) and `pgid` (the pid/pgid ladder, `cgroups=False`)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest

from legion.procs import (
    RETIRE_FAILED,
    Cgroup,
    ProcRef,
    RetireFailed,
    RetireTimeouts,
    alive,
    containment,
    retire_worker,
)
from legion.procs import ladder as retire_mod
from legion.procs import sweeper as proc_sweep
from legion.supervision.spawn import DEFAULT_PRELOAD, WorkerProcess, WorkerSpawner, WorkerStart
from legion.workers.fixture_worker import ENTRY, find_marked, fork_name
from tests.support import until

pytestmark = pytest.mark.timeout(30)
FAST = RetireTimeouts(retire=3.0, signal=0.3, kill=1.0)


CGROUPS = containment({}).cgroups


@pytest.fixture(scope="module", params=["cgroup", "pgid"])
def spawner(request: pytest.FixtureRequest) -> Iterator[WorkerSpawner]:
    if request.param == "cgroup" and not CGROUPS:
        pytest.skip(f"no cgroup containment here: {containment({}).reason}")
    sp = WorkerSpawner(None, preload=(*DEFAULT_PRELOAD, "legion.workers.fixture_worker"),
                       cgroups=request.param == "cgroup")  # fmt: skip
    sp.start()
    assert (sp.run_cgroup is not None) == (request.param == "cgroup")
    yield sp
    sp.close()


def _pgid_only(spawner: WorkerSpawner) -> None:
    if spawner.run_cgroup is not None:
        pytest.skip("a mechanism of the pid/pgid ladder (the cgroup ladder has no group signal and no freeze)")


@pytest.fixture
def marker() -> Iterator[str]:
    mark = f"retire-{uuid.uuid4().hex}"
    yield mark
    for pid in find_marked(mark):  # never leave anything behind, even when a test failed
        os.kill(pid, signal.SIGKILL)


async def _start(spawner: WorkerSpawner, tmp_path: Path, marker: str, **args: Any) -> tuple[WorkerProcess, dict[str, Any]]:
    rf = tmp_path / f"ready-{uuid.uuid4().hex[:6]}"
    w = spawner.spawn(WorkerStart(f"w-{uuid.uuid4().hex[:6]}", ENTRY, {"ready_file": str(rf), "marker": marker, **args}))
    await until(rf.exists, 10, "the fixture worker ready", interval=0.005)
    body: dict[str, Any] = orjson.loads(rf.read_bytes())
    return w, body


async def _expect_descendants(marker: str, n: int) -> None:
    await until(lambda: len(find_marked(marker)) == n, 5, f"exactly {n} marked descendants", interval=0.01)


def _zombie_children() -> set[int]:
    return {c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE}


# behaviour args -> (graceful?, step that must end the worker)
NAUGHTY: list[tuple[str, dict[str, Any], bool, str]] = [
    ("serve", {}, True, "graceful"),
    ("ignore-term-graceful", {"ignore_term": True}, True, "graceful"),  # EOF still works
    ("force-serve", {}, False, "term"),
    ("force-ignore-term", {"ignore_term": True}, False, "kill"),
    ("busy-gil", {"mode": "busy"}, True, "term"),
    ("busy-gil-ignore-term", {"mode": "busy", "ignore_term": True}, True, "kill"),
    ("block-loop", {"mode": "block"}, True, "term"),
    ("grandchildren", {"children": 5}, True, "graceful"),
    ("grandchildren-ignore-term", {"children": 3, "ignore_term": True, "mode": "block"}, True, "kill"),
    ("setsid-escapees", {"setsid_children": 3, "children": 1}, True, "graceful"),
    ("double-fork-daemons", {"daemons": 2}, True, "graceful"),
    ("everything-forced", {"children": 2, "setsid_children": 2, "daemons": 2, "ignore_term": True}, False, "kill"),
]


@pytest.mark.parametrize(("name", "args", "graceful", "step"), NAUGHTY, ids=[n[0] for n in NAUGHTY])
async def test_naughty_worker_is_retired_without_survivors(
    spawner: WorkerSpawner, tmp_path: Path, marker: str, name: str, args: dict[str, Any], graceful: bool, step: str
) -> None:
    n = args.get("children", 0) + args.get("setsid_children", 0) + args.get("daemons", 0)
    zombies_before = _zombie_children()
    w, _ = await _start(spawner, tmp_path, marker, **args)
    await _expect_descendants(marker, n)
    timeouts = RetireTimeouts(retire=0.5, signal=0.3, kill=1.0) if step != "graceful" else FAST
    report = await retire_worker(w, graceful=graceful, timeouts=timeouts)
    assert report.step == step
    assert report.descendants == n  # snapshot taken before anything was signalled
    assert report.survivors == []
    assert not w.is_alive()
    assert alive([w.ref]) == []
    assert find_marked(marker) == []  # the process table agrees: nothing carries our marker
    assert _zombie_children() - zombies_before == set()  # orphans that re-parented to us were reaped
    if not graceful:
        assert "graceful" not in report.timings  # --force skips the lifeline step


async def test_escapees_spawned_during_the_graceful_wait_are_swept(spawner: WorkerSpawner, tmp_path: Path,
                                                                   marker: str) -> None:  # fmt: skip
    w, _ = await _start(spawner, tmp_path, marker, mode="block", late_setsid_children=2, late_after=0.05)
    assert find_marked(marker) == []  # nothing exists at the ladder's first snapshot
    task = asyncio.ensure_future(retire_worker(w, timeouts=RetireTimeouts(retire=1.0, signal=0.3, kill=1.0)))
    await _expect_descendants(marker, 2)
    assert not task.done()  # they appeared during the graceful wait, after the first snapshot
    report = await task
    assert report.step == "term" and report.descendants == 2 and report.survivors == []
    assert find_marked(marker) == []


async def test_slow_starting_worker_retires_gracefully(spawner: WorkerSpawner, marker: str) -> None:
    w = spawner.spawn(WorkerStart("w-slow", ENTRY, {"start_delay": 30, "marker": marker}))
    report = await retire_worker(w, timeouts=FAST)
    assert report.step == "graceful" and report.exit_code == 0


async def test_a_killed_workers_group_is_still_swept(spawner: WorkerSpawner, tmp_path: Path, marker: str) -> None:
    w, _ = await _start(spawner, tmp_path, marker, children=3)
    w.signal(signal.SIGKILL)  # no chance to take its tree down itself
    assert await w.wait(5) == -signal.SIGKILL
    assert len(find_marked(marker)) == 3  # orphans left in the worker's process group
    report = await retire_worker(w, timeouts=FAST)
    assert report.step == "already_exited" and report.exit_code == -signal.SIGKILL
    assert find_marked(marker) == []


@pytest.mark.parametrize("mode", ["exit", "crash"])
async def test_an_exiting_worker_takes_its_own_tree_down(spawner: WorkerSpawner, tmp_path: Path, marker: str,
                                                         mode: str) -> None:  # fmt: skip
    w, _ = await _start(spawner, tmp_path, marker, mode=mode, exit_after=0.2, children=2, setsid_children=1,
                        daemons=1, ignore_term=True)  # fmt: skip
    assert await w.wait(5) == (0 if mode == "exit" else 1)
    assert find_marked(marker) == []  # it swept its descendants (daemons included: it is a subreaper)


async def test_an_exiting_worker_also_takes_down_what_its_sweep_provoked(spawner: WorkerSpawner, tmp_path: Path,
                                                                       marker: str) -> None:  # fmt: skip
    """Descendants that answer the worker's own exit sweep by starting another process (a shell's
    `setsid sleep`, a pure fork's pure fork): those re-parent to the worker, which sweeps again."""
    w, _ = await _start(spawner, tmp_path, marker, mode="exit", exit_after=1.0, term_spawners=1, term_forkers=2)  # its tree is up (a loaded machine)
    assert await w.wait(5) == 0
    # a process killed by the last round may still be leaving the table
    await until(lambda: not find_marked(marker), 5, "no survivor of the exit sweep")


async def test_an_exiting_worker_sweeps_a_chain_of_escapes_to_its_end(spawner: WorkerSpawner, tmp_path: Path,
                                                                     marker: str) -> None:  # fmt: skip
    """A descendant whose TERM handler forks the next one, six generations deep: every generation re-parents to
    the worker, which sweeps until none is left (a sweep bounded by a round count left the last ones behind)."""
    w, _ = await _start(spawner, tmp_path, marker, mode="exit", exit_after=1.0, term_chain=6)
    assert await w.wait(10) == 0
    # a process killed by the last round may still be leaving the table
    await until(lambda: not find_marked(marker), 5, "no survivor of the exit sweep")


async def test_own_pgid_is_never_signalled(spawner: WorkerSpawner, tmp_path: Path, marker: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    groups: list[int] = []
    real_killpg = os.killpg

    def spy(pgid: int, sig: int) -> None:
        groups.append(pgid)
        real_killpg(pgid, sig)

    _pgid_only(spawner)
    monkeypatch.setattr(proc_sweep.os, "killpg", spy)
    w, _ = await _start(spawner, tmp_path, marker, children=2, setsid_children=1, mode="busy")
    await retire_worker(w, timeouts=RetireTimeouts(retire=0.2, signal=0.3, kill=1.0))
    assert groups, "the sweep signalled no group at all"
    assert os.getpgrp() not in groups
    assert find_marked(marker) == []


async def test_retire_failed_when_a_descendant_survives(spawner: WorkerSpawner, tmp_path: Path, marker: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Root can kill anything here: an unkillable process is simulated by dropping its signals."""
    _pgid_only(spawner)
    w, body = await _start(spawner, tmp_path, marker, setsid_children=1)
    deaf_pid = body["children"][0]
    real = proc_sweep._signal_all

    def deaf(fds: dict[ProcRef, int], sig: int, own_pgid: int) -> None:
        real({r: fd for r, fd in fds.items() if r.pid != deaf_pid}, sig, own_pgid)

    monkeypatch.setattr(proc_sweep, "_signal_all", deaf)
    with pytest.raises(RetireFailed) as info:
        # forced: SIGTERM ends the worker before it can sweep its own tree, so the root's sweep must
        await retire_worker(w, graceful=False, timeouts=RetireTimeouts(retire=2.0, signal=0.5, kill=0.05))
    assert [p.pid for p in info.value.survivors] == [deaf_pid]
    assert info.value.code == RETIRE_FAILED and RETIRE_FAILED in str(info.value)
    assert info.value.report.step == "term"  # the worker itself did go
    assert not w.is_alive()
    monkeypatch.undo()
    os.kill(deaf_pid, signal.SIGKILL)


async def test_cancelled_retire_still_finishes_the_ladder(spawner: WorkerSpawner, tmp_path: Path, marker: str) -> None:
    w, _ = await _start(spawner, tmp_path, marker, mode="busy", ignore_term=True, children=2, setsid_children=1)
    task = asyncio.ensure_future(retire_worker(w, timeouts=RetireTimeouts(retire=5.0, signal=1.0, kill=1.0)))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not w.is_alive()
    assert find_marked(marker) == []


def test_timeouts_are_validated() -> None:
    with pytest.raises(ValueError, match="signal"):
        RetireTimeouts(signal=-1).validate()
    assert retire_mod.RetireTimeouts() == RetireTimeouts(retire=5.0, signal=1.0, kill=1.0)


async def test_stopped_worker_is_continued_so_term_acts(spawner: WorkerSpawner, tmp_path: Path, marker: str) -> None:
    w, _ = await _start(spawner, tmp_path, marker, children=2)
    w.signal(signal.SIGSTOP)
    report = await retire_worker(w, timeouts=RetireTimeouts(retire=0.3, signal=2.0, kill=1.0))
    assert report.step == "term" and report.exit_code == -signal.SIGTERM
    assert find_marked(marker) == []


@pytest.mark.parametrize("graceful", [True, False])
async def test_a_term_ignorer_spawning_escapees_throughout_the_ladder_leaves_nothing(
    spawner: WorkerSpawner, tmp_path: Path, marker: str, graceful: bool
) -> None:
    """Escapees born between the last snapshot and SIGKILL re-parent to the root: the ladder must still find them."""
    for _ in range(3):  # the race is per run; several rounds make a miss near-certain without the fix
        w, _ = await _start(spawner, tmp_path, marker, mode="block", ignore_term=True, spawn_forever=0.001)
        await _until_marked(marker, 5)
        report = await retire_worker(w, graceful=graceful, timeouts=RetireTimeouts(retire=0.1, signal=0.1, kill=1.0))
        assert report.step == "kill" and report.survivors == []
        await asyncio.sleep(0.05)  # anything still being born would show up now
        assert find_marked(marker) == []


async def _until_marked(marker: str, n: int) -> None:
    await until(lambda: len(find_marked(marker)) >= n, 10, f"the worker to spawn its {n} escapees", interval=0.01)


async def test_a_retire_cancelled_while_freezing_still_sweeps_the_frozen_tree(
    spawner: WorkerSpawner, tmp_path: Path, marker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loop shutdown during the freeze: nothing may be left behind, not even stopped."""
    _pgid_only(spawner)
    real = retire_mod.freeze_tree

    def slow_freeze(worker: ProcRef, timeout: float) -> list[ProcRef]:
        frozen = real(worker, timeout)
        time.sleep(0.3)  # the cancellation arrives while the freeze is still in its thread
        return frozen

    monkeypatch.setattr(retire_mod, "freeze_tree", slow_freeze)
    w, _ = await _start(spawner, tmp_path, marker, mode="block", ignore_term=True, spawn_forever=0.002)
    await _until_marked(marker, 3)
    task = asyncio.ensure_future(retire_worker(w, graceful=False, timeouts=RetireTimeouts(signal=0.1, kill=1.0)))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not w.is_alive()
    assert find_marked(marker) == []


@pytest.mark.parametrize("graceful", [True, False])
async def test_escapees_started_in_answer_to_the_sweeps_term_are_swept(
    spawner: WorkerSpawner, tmp_path: Path, marker: str, graceful: bool
) -> None:
    """A descendant that answers TERM by starting a `setsid` process and exiting: its orphan re-parents to the root."""
    zombies_before = _zombie_children()
    w, _ = await _start(spawner, tmp_path, marker, mode="block", term_spawners=3)
    # at least the 3 shells: each also runs short `sleep 0.02`s (marked too), more of them on a loaded machine
    await _until_marked(marker, 3)
    report = await retire_worker(w, graceful=graceful, timeouts=RetireTimeouts(retire=0.1, signal=0.5, kill=1.0))
    assert report.survivors == []
    assert _zombie_children() - zombies_before == set()  # the strays were ours to reap, and were reaped
    await asyncio.sleep(0.1)  # an escapee still being started would show up now
    assert find_marked(marker) == []


async def test_the_stray_sweep_never_touches_a_neighbour_workers_tree(spawner: WorkerSpawner, tmp_path: Path,
                                                                     marker: str) -> None:  # fmt: skip
    """The neighbour starts later and its orphans are our children too: only the lineage mark tells them apart."""
    w, _ = await _start(spawner, tmp_path, marker, mode="block", term_spawners=2)
    neighbour_mark = f"{marker}-neighbour"
    try:
        neighbour, _ = await _start(spawner, tmp_path, neighbour_mark, children=1, setsid_children=1, daemons=1)
        await _until_marked(marker, 2)  # its 2 shells (their short sleeps are marked too)
        await _expect_descendants(neighbour_mark, 3)
        neighbour.signal(signal.SIGKILL)  # its tree re-parents to us, started after `w`
        assert await neighbour.wait(5) == -signal.SIGKILL
        report = await retire_worker(w, graceful=False, timeouts=RetireTimeouts(signal=0.5, kill=1.0))
        assert report.survivors == [] and find_marked(marker) == []
        assert len(find_marked(neighbour_mark)) == 3
        # and a dead worker's retire finds its own escapees (setsid, daemons) by the same mark
        report = await retire_worker(neighbour, timeouts=FAST)
        assert report.step == "already_exited" and report.survivors == []
        assert find_marked(neighbour_mark) == []
    finally:
        for pid in find_marked(neighbour_mark):
            os.kill(pid, signal.SIGKILL)


# Every way out of a worker's tree: setsid, double fork, a pure fork() that never execs, and processes
# started from a TERM handler during the sweep (a shell's `setsid sleep`, and a pure fork's pure fork).
ZOO = {"setsid_children": 2, "daemons": 2, "fork_children": 2, "term_spawners": 2, "term_forkers": 2}
ZOO_SIZE = sum(ZOO.values())


@pytest.mark.parametrize("graceful", [True, False])
async def test_the_escape_zoo(spawner: WorkerSpawner, tmp_path: Path, marker: str, graceful: bool) -> None:
    """With cgroups nothing escapes. The pid/pgid ladder (documented hole): a pure fork that a descendant
    starts from its TERM handler during the sweep carries no lineage mark, re-parents to us outside every
    snapshot and group, and survives — at most one per such descendant; everything else is swept."""
    zombies_before = _zombie_children()
    w, _ = await _start(spawner, tmp_path, marker, mode="block", **ZOO)
    await _until_marked(marker, ZOO_SIZE)  # at least: the shells' own `sleep 0.02` come and go
    report = await retire_worker(w, graceful=graceful, timeouts=RetireTimeouts(retire=0.2, signal=0.5, kill=1.0))
    assert report.survivors == []
    await asyncio.sleep(0.1)  # an escapee still being started would show up now
    left = find_marked(marker)
    if spawner.run_cgroup is not None:
        assert left == []
        assert report.containment == "cgroup" and report.descendants >= ZOO_SIZE
        assert w.cgroup is not None and not w.cgroup.path.exists()  # an emptied cgroup is removed
        assert _zombie_children() - zombies_before == set()
    else:
        assert len(left) <= ZOO["term_forkers"], left
        assert all(psutil.Process(pid).name() == fork_name(marker) for pid in left)  # only pure forks remain


async def test_cgroup_retire_failed_when_a_member_survives(spawner: WorkerSpawner, tmp_path: Path, marker: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """cgroup.kill cannot fail for root: an unkillable member is simulated by sparing it from every signal."""
    if spawner.run_cgroup is None:
        pytest.skip("the cgroup ladder (the pid/pgid one has test_retire_failed_when_a_descendant_survives)")
    w, body = await _start(spawner, tmp_path, marker, setsid_children=2)
    deaf_pid = body["children"][0]
    real_pinned = retire_mod.pinned_members

    def spare_pinned(cgroup: Cgroup, exclude: set[int]) -> dict[int, int]:
        return real_pinned(cgroup, exclude | {deaf_pid})

    def spare_kill(cgroup: Cgroup) -> None:
        for pid in cgroup.procs(recursive=True):
            if pid != deaf_pid:
                os.kill(pid, signal.SIGKILL)

    monkeypatch.setattr(retire_mod, "pinned_members", spare_pinned)
    monkeypatch.setattr(Cgroup, "kill", spare_kill)
    with pytest.raises(RetireFailed) as info:
        await retire_worker(w, graceful=False, timeouts=RetireTimeouts(signal=0.2, kill=0.2))
    assert [p.pid for p in info.value.survivors] == [deaf_pid]
    assert info.value.code == RETIRE_FAILED and info.value.report.containment == "cgroup"
    assert w.cgroup is not None and w.cgroup.path.exists()  # a populated cgroup is never removed
    monkeypatch.undo()
    os.kill(deaf_pid, signal.SIGKILL)
    assert w.cgroup.kill_and_remove(5.0)
