"""Retire benchmark: the verified ladder (legion.procs.ladder.retire_worker) against real worker trees.

Figures:
- graceful retire of a ready worker (lifeline EOF -> exit observed via pidfd -> sweep check), target p50 ≤ 20 ms;
- forced retire (`stop --force`: SIGTERM, no graceful step) of a worker with 0, 10 and 100 descendants,
  a mix of same-group children, `setsid` escapees and double-forked daemons; target for 100: p50 ≤ 150 ms;
- a leak count over N spawn -> ready -> retire cycles (alternating graceful and forced, each worker with a
  same-group child, a setsid escapee, a double-forked daemon and a shell that answers the sweep's TERM
  by starting one more setsid escapee): processes left with the bench's marker (stopped ones included),
  children of the root other than the fork server (zombies included), and file descriptors of the root;
  target 0 leaked processes.
These figures are the pid/pgid ladder (`cgroups=False`), as before cgroup containment.

With cgroup containment (`"cgroup"`; skipped, with the reason, where the machine does not allow it):
- forced retire of 0, 10 and 100 descendants, target for 100: p50 ≤ 30 ms;
- the escape zoo over N retires (alternating graceful and forced): every worker has a setsid escapee,
  a double-forked daemon, a pure `fork()` that never execs, a shell and a pure fork that each answer
  the sweep's TERM by starting one more escapee; target 0 survivors;
- root SIGKILL trials with such workers live (a root in its own process): survivors 1 s after the
  root's death, target 0.
The same zoo on the pid/pgid ladder (`"pgid_zoo"`) is reported, not gated: its known hole is what a
pure fork starts from its TERM handler during the sweep (no lineage mark, outside every snapshot).

The machine's speed varies ±40 % between runs, so the latency figures gate (unless `--strict`, which gates the
absolute targets too) as ratios to bare baselines measured in the same run, sample by sample (`_bare.py`): a
graceful retire against a bare child's lifeline closed and the child reaped; a forced retire of 100 descendants
(pid/pgid and cgroup) against a plain tree of the same size (one child leading its own process group with 100
`sleep` descendants, after every other sample) killed with one SIGKILL to the group and every process reaped. The
absolute p50s are reported against their targets; the leak, zoo and root-kill counts are correctness and always
gate.

Prints one JSON object; exits non-zero when a gated check fails (`checks`, `gated`). Default = acceptance size
(`--cycles 1000`); `--quick` for a small smoke run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import _stats
import psutil
from _bare import BareForkServer

from legion.bus.control import ControlServer
from legion.bus.protocol import Message
from legion.procs import ProcRef, RetireTimeouts, alive, containment, retire_worker
from legion.supervision.spawn import DEFAULT_PRELOAD, WorkerProcess, WorkerSpawner, WorkerStart
from legion.workers.fixture_worker import ENTRY, find_marked

TARGET_GRACEFUL_P50_MS = 20.0
TARGET_FORCED_100_P50_MS = 150.0
LEAK_SETTLE_S = 5.0  # seconds a retired tree's processes may take to be reaped before they count as leaked
TARGET_LEAKS = 0
TARGET_CGROUP_FORCED_100_P50_MS = 30.0
TARGET_ROOT_KILL_SURVIVORS = 0
ROOT_KILL_LIMIT_S = 1.0
# legion's p50 over the same run's bare baseline p50; measured on the 2-core machine under the acceptance test run's
# load: graceful 5.2-7.0, forced 100 (pid/pgid) 9.1-10.4, forced 100 (cgroup) 1.4-1.8
MAX_RATIO_GRACEFUL = 14.0
MAX_RATIO_FORCED_100 = 21.0
MAX_RATIO_CGROUP_FORCED_100 = 4.0
ABSOLUTE = ("graceful_p50", "forced_100_p50", "cgroup_forced_100_p50")  # gated only with --strict
TREES = {0: {}, 10: {"children": 4, "setsid_children": 4, "daemons": 2},
         100: {"children": 40, "setsid_children": 40, "daemons": 20}}  # fmt: skip
# every kind of descendant per leak cycle: same group, setsid escapee, double-forked daemon, and a
# shell that answers the sweep's TERM by starting one more setsid escapee (a stray of the sweep)
LEAK_TREE = {"children": 1, "setsid_children": 1, "daemons": 1, "term_spawners": 1}
ZOO_TREE = {**LEAK_TREE, "fork_children": 1, "term_forkers": 1}
ROOT_KILL_WORKERS: list[dict[str, Any]] = [
    {"children": 1, "setsid_children": 1, "daemons": 1, "fork_children": 1, "term_spawners": 1, "term_forkers": 1},
    {"mode": "busy", "ignore_term": True, "fork_children": 1, "term_forkers": 1},  # cannot sweep itself
    {"mode": "block", "setsid_children": 1, "term_forkers": 1},
]
ROOT_SCRIPT = r"""
import asyncio, json, sys
from legion.bus.control import ControlServer
from legion.supervision.spawn import DEFAULT_PRELOAD, WorkerSpawner, WorkerStart
from legion.workers.fixture_worker import ENTRY

marker, run_dir, behaviours = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])

async def on_message(worker_id, msg):
    return None

async def main():
    server = ControlServer(f"ipc://{run_dir}/ctl.sock", on_message=on_message)
    spawner = WorkerSpawner(await server.start(), preload=(*DEFAULT_PRELOAD, "legion.workers.fixture_worker"))
    spawner.start()
    for i, args in enumerate(behaviours):
        spawner.spawn(WorkerStart(f"w{i}", ENTRY, {**args, "marker": marker, "ready_file": f"{run_dir}/ready{i}"}))
    print(spawner.zygote_pid, flush=True)
    await asyncio.sleep(1000)

asyncio.run(main())
"""


class Bench:
    def __init__(self, spawner: WorkerSpawner, marker: str) -> None:
        self.spawner = spawner
        self.marker = marker
        self.waiting: dict[str, asyncio.Future[None]] = {}
        self.seq = 0
        self.bare: BareForkServer | None = None

    async def bare_graceful_ms(self) -> float:
        """The baseline of a graceful retire: a bare ready child's lifeline closed, the child reaped."""
        assert self.bare is not None
        self.seq += 1
        wid = f"b{self.seq}"
        await self.bare.spawn_ms([wid])
        return await self.bare.retire_ms([wid])

    async def on_message(self, worker_id: str, msg: Message) -> dict[str, Any] | None:
        if msg.type == "ready":
            fut = self.waiting.pop(worker_id, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        return None

    async def ready_worker(self, args: dict[str, Any]) -> WorkerProcess:
        self.seq += 1
        wid = f"r{self.seq}"
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting[wid] = fut
        proc = self.spawner.spawn(WorkerStart(wid, ENTRY, {"marker": self.marker, **args}))
        await asyncio.wait_for(fut, 30)
        return proc

    async def retire_ms(self, args: dict[str, Any], *, graceful: bool, expect: int | None = None) -> float:
        proc = await self.ready_worker(args)
        if expect:  # daemons are forked by a shell that exits at once; wait until they all exist
            deadline = time.monotonic() + 10
            while len(find_marked(self.marker)) < expect:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {len(find_marked(self.marker))} of {expect} descendants appeared")
                await asyncio.sleep(0.005)
        t0 = time.perf_counter()
        report = await retire_worker(proc, graceful=graceful, timeouts=RetireTimeouts())
        ms = (time.perf_counter() - t0) * 1000
        if expect is not None and report.descendants != expect:
            raise RuntimeError(f"snapshot saw {report.descendants} descendants, expected {expect}")
        return ms


def _root_state(zygote_pid: int | None) -> tuple[int, int]:
    me = psutil.Process()
    children = [c for c in me.children() if c.pid != zygote_pid]
    return len(children), len(os.listdir("/proc/self/fd"))


async def _with_bench(cgroups: bool, body: Callable[[Bench, WorkerSpawner], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(prefix="lgr", dir="/tmp"))
    marker = f"bench-retire-{uuid.uuid4().hex}"
    spawner = WorkerSpawner(None, preload=(*DEFAULT_PRELOAD, "legion.workers.fixture_worker"), cgroups=cgroups)
    bench = Bench(spawner, marker)
    server = ControlServer(f"ipc://{run_dir}/ctl.sock", on_message=bench.on_message)
    spawner.control_endpoint = await server.start()
    spawner.start()
    bench.bare = BareForkServer(run_dir)
    try:
        await bench.bare.start()
        if (spawner.run_cgroup is not None) != cgroups:
            raise RuntimeError(f"asked for cgroups={cgroups}, got {spawner.containment_reason}")
        for _ in range(3):  # warm-up
            await bench.retire_ms({}, graceful=True)
        return await body(bench, spawner)
    finally:
        for pid in find_marked(marker):  # an honest count was taken; never leave them running
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        await bench.bare.close()
        spawner.close()
        await server.close()
        shutil.rmtree(run_dir, ignore_errors=True)


async def _forced(bench: Bench, forced_samples: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    bare: list[float] = []
    for n, tree in TREES.items():
        samples = []
        for i in range(forced_samples):
            samples.append(await bench.retire_ms(tree, graceful=False, expect=n))
            if n == 100 and i % 2 == 0:  # the same machine, right after: a plain tree of the same size
                assert bench.bare is not None
                bare.append(await bench.bare.kill_tree_ms(n))
        out[str(n)] = _stats.summary(samples, count=True)
    out["bare_100"] = _stats.summary(bare, count=True)
    out["100_over_bare_p50"] = round(out["100"]["median"] / out["bare_100"]["median"], 2)
    return out


async def _leaks(bench: Bench, spawner: WorkerSpawner, tree: dict[str, Any], cycles: int) -> dict[str, Any]:
    before = _root_state(spawner.zygote_pid)
    t0 = time.perf_counter()
    for i in range(cycles):
        await bench.retire_ms(tree, graceful=i % 2 == 0)
    elapsed = time.perf_counter() - t0
    # a leak is a process that stays: the last retire's reparented worker may still be a zombie the root has not
    # reaped on a loaded machine, so the count is polled for up to LEAK_SETTLE_S, not read once
    deadline = time.monotonic() + LEAK_SETTLE_S
    while True:
        await asyncio.sleep(0.05)
        after = _root_state(spawner.zygote_pid)
        leaked_marked = len(find_marked(bench.marker))
        if (after[0] <= before[0] and not leaked_marked) or time.monotonic() > deadline:
            break
    return {
        "cycles": cycles,
        "seconds": round(elapsed, 2),
        "leaked_processes": leaked_marked + max(0, after[0] - before[0]),
        "marked_survivors": leaked_marked,
        "extra_root_children": after[0] - before[0],
        "extra_root_fds": after[1] - before[1],
    }


async def measure(samples: int, forced_samples: int, cycles: int) -> dict[str, Any]:
    """The pid/pgid ladder's figures (as before cgroup containment existed)."""

    async def body(bench: Bench, spawner: WorkerSpawner) -> dict[str, Any]:
        out: dict[str, Any] = {}
        graceful, bare = [], []
        for _ in range(samples):
            graceful.append(await bench.retire_ms({}, graceful=True))
            bare.append(await bench.bare_graceful_ms())
        out["graceful_ms"] = _stats.summary(graceful, count=True)
        out["bare_graceful_ms"] = _stats.summary(bare, count=True)
        out["graceful_over_bare_p50"] = round(out["graceful_ms"]["median"] / out["bare_graceful_ms"]["median"], 2)
        out["graceful_target_p50_ms"] = TARGET_GRACEFUL_P50_MS
        out["forced_ms_by_descendants"] = await _forced(bench, forced_samples)
        out["forced_100_target_p50_ms"] = TARGET_FORCED_100_P50_MS
        out["leak"] = {**await _leaks(bench, spawner, LEAK_TREE, cycles), "target_leaked_processes": TARGET_LEAKS}
        return out

    return await _with_bench(False, body)


async def measure_cgroup(forced_samples: int, cycles: int, trials: int) -> dict[str, Any]:
    """Forced retires, the escape zoo and root SIGKILL trials with each worker in its own cgroup."""

    async def body(bench: Bench, spawner: WorkerSpawner) -> dict[str, Any]:
        return {
            "run_cgroup_parent": str(spawner.run_cgroup.path.parent) if spawner.run_cgroup else None,
            "forced_ms_by_descendants": await _forced(bench, forced_samples),
            "forced_100_target_p50_ms": TARGET_CGROUP_FORCED_100_P50_MS,
            "zoo": {**await _leaks(bench, spawner, ZOO_TREE, cycles), "target_leaked_processes": TARGET_LEAKS},
        }

    out = await _with_bench(True, body)
    out["root_kill"] = await asyncio.to_thread(_root_kill_trials, trials)
    return out


def _root_kill_trials(trials: int) -> dict[str, Any]:
    """SIGKILL a root with ROOT_KILL_WORKERS live; count what is alive ROOT_KILL_LIMIT_S later."""
    survivors, seconds = [], []
    keys = ("children", "setsid_children", "daemons", "fork_children", "term_spawners", "term_forkers")
    expected = sum(int(w.get(k, 0)) for w in ROOT_KILL_WORKERS for k in keys)
    for _ in range(trials):
        marker = f"bench-rootkill-{uuid.uuid4().hex}"
        run_dir = Path(tempfile.mkdtemp(prefix="lgk", dir="/tmp"))
        root = subprocess.Popen([sys.executable, "-c", ROOT_SCRIPT, marker, str(run_dir), json.dumps(ROOT_KILL_WORKERS)],
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)  # fmt: skip
        try:
            assert root.stdout is not None
            zygote = int(root.stdout.readline())
            deadline = time.monotonic() + 30
            ready = [run_dir / f"ready{i}" for i in range(len(ROOT_KILL_WORKERS))]
            while not (all(r.exists() for r in ready) and len(find_marked(marker)) >= expected):
                if root.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the root-kill trial's workers never came up: {find_marked(marker)}")
                time.sleep(0.02)
            workers = [c.pid for c in psutil.Process(root.pid).children() if c.pid != zygote]
            tracked = [r for r in (ProcRef.from_pid(p) for p in [zygote, *workers, *find_marked(marker)]) if r]
            root.kill()
            t0 = time.monotonic()
            root.wait()
            while (alive(tracked) or find_marked(marker)) and time.monotonic() - t0 < ROOT_KILL_LIMIT_S:
                time.sleep(0.005)
            seconds.append(time.monotonic() - t0)
            survivors.append(len({r.pid for r in alive(tracked)} | set(find_marked(marker))))
        finally:
            if root.poll() is None:
                root.kill()
                root.wait()
            for pid in find_marked(marker):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(run_dir, ignore_errors=True)
    return {"trials": trials, "survivors_after_1s": sum(survivors), "trials_with_survivors": sum(1 for n in survivors if n),
            "seconds_until_gone": _stats.summary(seconds, count=True),
            "target_survivors_after_1s": TARGET_ROOT_KILL_SURVIVORS}  # fmt: skip


async def measure_pgid_zoo(cycles: int) -> dict[str, Any]:
    """The same zoo on the pid/pgid ladder: reported, not gated (see the module docstring)."""

    async def body(bench: Bench, spawner: WorkerSpawner) -> dict[str, Any]:
        return await _leaks(bench, spawner, ZOO_TREE, cycles)

    return await _with_bench(False, body)


def _checks(result: dict[str, Any]) -> dict[str, bool]:
    if "error" in result:
        return {"pid_pgid_ran": False}
    forced = result["forced_ms_by_descendants"]
    checks = {
        "graceful_p50": result["graceful_ms"]["median"] <= TARGET_GRACEFUL_P50_MS,
        "graceful_over_bare": result["graceful_over_bare_p50"] <= MAX_RATIO_GRACEFUL,
        "forced_100_p50": forced["100"]["median"] <= TARGET_FORCED_100_P50_MS,
        "forced_100_over_bare": forced["100_over_bare_p50"] <= MAX_RATIO_FORCED_100,
        "no_leaked_process": result["leak"]["leaked_processes"] <= TARGET_LEAKS,
        "no_leaked_root_fd": result["leak"]["extra_root_fds"] <= 0,
    }
    cg = result.get("cgroup")
    if cg is not None and "error" in cg:
        checks["cgroup_ran"] = False
    elif cg is not None:
        cg_forced = cg["forced_ms_by_descendants"]
        checks.update({
            "cgroup_forced_100_p50": cg_forced["100"]["median"] <= TARGET_CGROUP_FORCED_100_P50_MS,
            "cgroup_forced_100_over_bare": cg_forced["100_over_bare_p50"] <= MAX_RATIO_CGROUP_FORCED_100,
            "cgroup_no_zoo_survivor": cg["zoo"]["leaked_processes"] <= TARGET_LEAKS,
            "cgroup_no_leaked_root_fd": cg["zoo"]["extra_root_fds"] <= 0,
            "cgroup_no_root_kill_survivor": cg["root_kill"]["survivors_after_1s"] <= TARGET_ROOT_KILL_SURVIVORS,
        })
    return checks


def _section(coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """Run one section; an exception becomes its `error` (with the traceback on stderr), so the JSON line that CI
    shows names what failed, and the sections after it still run."""
    try:
        return asyncio.run(coro)
    except Exception as exc:  # reported in the JSON and failed by `checks`
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100, help="graceful retire samples (default 100)")
    parser.add_argument("--forced-samples", type=int, default=20, help="forced samples per tree size (default 20)")
    parser.add_argument("--cycles", type=int, default=None, help="spawn/retire cycles for the leak count (default 1000)")
    parser.add_argument("--root-kill-trials", type=int, default=20, help="root SIGKILL trials with cgroups (default 20)")
    parser.add_argument("--quick", action="store_true",
                        help="20 graceful, 5 forced per size, 50 cycles (unless --cycles), 3 root-kill trials")  # fmt: skip
    parser.add_argument("--strict", action="store_true", help="gate the absolute p50 targets too")
    opts = parser.parse_args()
    if opts.quick:
        opts.samples, opts.forced_samples, opts.root_kill_trials = 20, 5, 3
    if opts.cycles is None:
        opts.cycles = 50 if opts.quick else 1000
    load = os.getloadavg()[0]
    result: dict[str, Any] = {"bench": "retire"}
    result.update(_section(measure(opts.samples, opts.forced_samples, opts.cycles)))
    decision = containment({})
    result["containment"] = decision.reason
    if decision.cgroups:
        result["cgroup"] = _section(measure_cgroup(opts.forced_samples, opts.cycles, opts.root_kill_trials))
    result["pgid_zoo"] = _section(measure_pgid_zoo(opts.cycles))
    result["targets"] = {"graceful_p50_ms": TARGET_GRACEFUL_P50_MS, "graceful_over_bare_max": MAX_RATIO_GRACEFUL,
                         "forced_100_p50_ms": TARGET_FORCED_100_P50_MS, "forced_100_over_bare_max": MAX_RATIO_FORCED_100,
                         "cgroup_forced_100_p50_ms": TARGET_CGROUP_FORCED_100_P50_MS,
                         "cgroup_forced_100_over_bare_max": MAX_RATIO_CGROUP_FORCED_100,
                         "leaked_processes": TARGET_LEAKS, "root_kill_survivors_after_1s": TARGET_ROOT_KILL_SURVIVORS}
    result["checks"] = checks = _checks(result)
    result["gated"] = sorted(k for k in checks if opts.strict or k not in ABSOLUTE)
    result["ok"] = all(checks[k] for k in result["gated"])
    result["loadavg_1m_before"] = round(load, 2)
    result["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    result["cpus"] = os.cpu_count()
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
