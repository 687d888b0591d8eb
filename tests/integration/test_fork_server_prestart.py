"""A fork server started ahead of its spawner (`EarlyForkServer`, `legion run`'s head start): adopted by the spawner
it is handed to when it fits, stopped otherwise, and never left behind by a process that did not use it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from legion.supervision.spawn import DEFAULT_PRELOAD, EarlyForkServer, WorkerSpawner, WorkerStart
from legion.workers.fixture_worker import ENTRY
from tests.support import poller

pytestmark = pytest.mark.timeout(60)
PRELOAD = (*DEFAULT_PRELOAD, "legion.workers.fixture_worker")
_until = poller(20.0, 0.01)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def spawners() -> Iterator[list[WorkerSpawner]]:
    made: list[WorkerSpawner] = []
    yield made
    for sp in made:
        sp.close()


async def test_the_spawner_it_fits_adopts_it_and_spawns_from_it(spawners: list[WorkerSpawner],
                                                                 tmp_path: Path) -> None:
    early = EarlyForkServer.start(PRELOAD)
    sp = WorkerSpawner(None, preload=PRELOAD, early=early)
    spawners.append(sp)
    sp.start()
    assert sp.zygote_pid == early.proc.pid
    assert sp.run_cgroup is early.run_cgroup and sp.preload_failed == {}
    ready = tmp_path / "ready"
    worker = sp.spawn(WorkerStart("w-early", ENTRY, {"ready_file": str(ready)}))
    try:
        await _until(ready.exists, 20, "the worker of the adopted fork server is ready")
        assert worker.is_alive()
    finally:
        worker.close_lifeline()
        assert await worker.wait(10) == 0
        worker.close()
    early.discard()  # handed over: a late discard (the process's exit) leaves the spawner's fork server alone
    assert not _gone(early.proc.pid)


@pytest.mark.parametrize("change", ["preload", "environment"])
async def test_a_spawner_it_does_not_fit_stops_it_and_starts_its_own(spawners: list[WorkerSpawner],
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      change: str) -> None:
    early = EarlyForkServer.start(PRELOAD)
    preload = PRELOAD
    if change == "preload":
        preload = DEFAULT_PRELOAD
    else:  # e.g. the ledger's password set after the early start: the workers must inherit it
        monkeypatch.setenv("LEGION_EARLY_TEST", "1")
    sp = WorkerSpawner(None, preload=preload, early=early)
    spawners.append(sp)
    sp.start()
    assert sp.zygote_pid is not None and sp.zygote_pid != early.proc.pid
    assert _gone(early.proc.pid), "the unused fork server was stopped before the spawner went on"
    if early.run_cgroup is not None:
        assert not early.run_cgroup.path.exists(), "the unused fork server's run cgroup was removed"
        assert sp.run_cgroup is not None and sp.run_cgroup.path != early.run_cgroup.path


def test_a_spawner_closed_before_it_starts_stops_it(spawners: list[WorkerSpawner]) -> None:
    early = EarlyForkServer.start(PRELOAD)
    WorkerSpawner(None, preload=PRELOAD, early=early).close()
    assert _gone(early.proc.pid)


@pytest.mark.parametrize("ready", [False, True])
def test_a_process_that_never_hands_it_over_leaves_nothing_behind(ready: bool) -> None:
    """Exiting while the fork server still imports, or once it is ready and has forked its intermediate ahead:
    no process, no cgroup and no traceback is left."""
    code = ("import time, psutil\n"
            "from legion.supervision.spawn import EarlyForkServer\n"
            "early = EarlyForkServer.start()\n"
            "deadline = time.monotonic() + 30\n"
            f"while {ready} and not psutil.Process(early.proc.pid).children() and time.monotonic() < deadline:\n"
            "    time.sleep(0.01)\n"
            "kids = [c.pid for c in psutil.Process(early.proc.pid).children(recursive=True)]\n"
            "print(early.proc.pid, early.run_cgroup and early.run_cgroup.path, *kids)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    pid, cgroup, *kids = out.stdout.split()
    assert len(kids) == int(ready), "the ready fork server had forked its intermediate ahead"
    for left in (pid, *kids):
        assert _gone(int(left))
    assert cgroup == "None" or not Path(cgroup).exists()
