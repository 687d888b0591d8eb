"""Tree-scale benchmark (issue 22, item 1): scripted trees of 30 to 1,000 nodes, in-process and with rpc children.

The tree: root → 10 `lead` nodes (a project card: native, `maxSubagentDepth: 2`) → workers, each lead
launching its workers in `tasks[]` batches of 8 back to back, then one `wait`; every worker makes one 2 s model
call (`delay_ms: 2000`). A size is the node count: root + 10 leads + (size − 11) workers, dealt round-robin.
The limits that would cap such a tree (`maxChildrenPerNode`, `maxActiveNodes`, `inprocess.maxActive`, the
launch queue) are raised so the tree is limited by orchestration only. `--backend rpc` sets
`supervision.forceRpc` (every child its own worker process).

The critical path (cp) is measured in the same invocation, right before each tree: a 3-node chain
root → lead → one worker with the same scripts. wall and cp both run from the
root's first model call to the root's last `agent_settled` (startup and shutdown are measured apart). Each tree
and each chain runs `legion.orchestration.run.execute` in a fresh interpreter (`--one`, the root), so peak RSS
and CPU are the run's own; its monitor stream is tapped where the root publishes it.

Per size and backend (one entry of `runs`):
- `wall_over_cp`; `wall_s`, `cp_s`;
- `launch_window_s`: first child `starting` → the last worker's first model call;
- `shutdown_s`: the root's last `agent_settled` → `execute` returned (every worker retired and swept);
- `startup_s`: `execute` called → the root's first model call;
- `peak_rss_mb`: the root (`ru_maxrss`), the pool and the fork server (`VmHWM`, sampled every 0.1 s);
- `rpc_worker_uss_mb`: median and max USS of rpc workers, the root node's own worker included
  (`/proc/PID/smaps_rollup` Private_*: the fields psutil's `memory_full_info().uss` sums, read without its
  per-mapping walk), read once per worker after each `agent_settled` of its node: a settled worker idles until it gives its process back (`supervision.rpcIdleGraceMs`, 3 s), so this is idle USS (rpc only). A
  worker not settled yet is read every `USS_EVERY_S` (the root's and the leads' live the whole run), the last read
  kept. Reading every worker every 2 s instead made the sampler the bench's largest thread (2.8 s of CPU at 1,000
  rpc nodes: smaps_rollup walks a 54 MB address space in the kernel), stolen from the run it measures;
- `cpu_over_cp`: the tree's CPU (all processes) over the cp chain's;
- `cpu_ms_per_node`: all processes (the root's `RUSAGE_SELF` + `RUSAGE_CHILDREN`: the root is a child subreaper
  and reaps every worker, the pool and the fork server, so their times roll up, exited ones included, which a
  psutil or /proc sweep of live processes would miss) and the root alone, from `execute` on (the interpreter's
  start and imports are in `startup_s`), less the CPU of the bench's own sampling thread (`cpu_sampler_s`);
- `fsyncs_per_node`: fsync, fdatasync, syncfs and sync calls of the whole process tree (a ledger writer's
  group commit makes its files durable with one syncfs: it counts as one), counted by
  `strace -f -c --seccomp-bpf -e trace=fsync,fdatasync,syncfs,sync` around the run's interpreter (every process it
  forks is followed), in a second run of the same tree after the timed one: `-f` stops every traced process
  at each fork, clone and exit, and with 300 rpc workers on a loaded 2-core machine that slowed heartbeats
  until workers were declared hung and the run failed (every such traced run here), so no timed figure comes from a traced
  run. A traced run that fails, or outlasts 60 s + 6 × the timed run, leaves `fsyncs_per_node` null and says
  why in `fsync_error`. /proc/PID/io has
  no fsync counter (`syscw` counts every write), and an LD_PRELOAD shim needs a wrapper per libc entry point;
  with `--seccomp-bpf` only the counted syscalls stop. `null` where strace is missing (`--fsync off`);
- `ledger_bytes`: legion.db + its -wal and -shm after the run.

`growth_exponent` fits, per backend over the sizes, the exponent k of cost ∝ nodes^k (least squares in log-log)
for wall, wall − cp (the time past the critical path: orchestration's own, without the model's 2 s floor that
flattens wall's fit), all-process CPU, the launch window and shutdown (1.0 = linear).

Targets. Each run's `targets` holds every issue 22 acceptance target that applies to it (`target`, `met`) and,
beside it, `ci_gate`: what today's code holds on a loaded 2-core machine with headroom, so a regression fails CI
while issue 22's work is still to do. Issue targets: wall/cp ≤ 1.3 in-process / ≤ 2.0 rpc at 300 nodes,
≤ 1.6 / ≤ 3.0 at 1,000; root CPU ≤ 4 ms per node (in-process); shutdown of 300 rpc workers ≤ 1 s; idle USS per
rpc worker ≤ 6 MB; peak RSS at 1,000 nodes root ≤ 100 MB, pool ≤ 150 MB; fsyncs per node ≤ 4 (half of ~8).
CI gates (measured here with a load average of 4–12 on 2 cores: in-process 300 at 1.9–5.0 wall/cp and 4.0–6.1
cpu/cp, rpc 300 at 6.6–13.5 and 21.6–33.6): `cpu_over_cp` (the tree's CPU, all processes, over the cp
chain's: load and machine speed move it little) ≤ 10 in-process at 300 / ≤ 35 at 1,000, ≤ 50 rpc at 300;
wall/cp (it moves with the load) ≤ 8 in-process at 300 / ≤ 20 at 1,000, ≤ 25 rpc at 300; rpc worker USS
≤ 20 MB (13.3 measured); fsyncs per node ≤ 4 in-process / ≤ 6 rpc from 300 nodes on (1.2–1.7 / 2.9 measured:
a count, which load moves only through how many writes share a commit); and `complete` (every node in the
ledger, every worker called). rpc at 1,000 has no CI gate (not measured here). By default the CI gates are gated and the rest reported; `--strict` gates every issue target
instead (and the CI gates without one). The JSON names both lists (`gated`, `reported`), what missed a gate
(`missed_gated`) and every issue target still missed (`missed_targets`).

Prints one JSON object (a per-size list in `runs`); exit 1 when a gated target is missed or a run failed (its
entry carries `error`; a failed run's project directory, with its legion.log, is kept under /tmp and named in
the error). CI: `bench/tree.py --sizes 300 --backend inprocess`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

LEADS = 10
BATCH = 8
WORKER_CALL_MS = 2000
# issue 22's acceptance targets (gated with --strict) and, beside each, the CI gate: what today's code holds on a
# loaded 2-core machine with headroom (None: reported only). The CI gates catch a regression; the issue
# targets are what the work of issue 22 must reach.
WALL_OVER_CP = {"inprocess": {300: 1.3, 1000: 1.6}, "rpc": {300: 2.0, 1000: 3.0}}
CI_WALL_OVER_CP = {"inprocess": {300: 8.0, 1000: 20.0}, "rpc": {300: 25.0}}
CI_CPU_OVER_CP = {"inprocess": {300: 10.0, 1000: 35.0}, "rpc": {300: 50.0}}
TARGET_ROOT_CPU_MS_PER_NODE = 4.0
TARGET_RPC_SHUTDOWN_300_S = 1.0
TARGET_RPC_USS_MB = 6.0
CI_RPC_USS_MB = 20.0
TARGET_PEAK_RSS_1000_MB = {"root": 100.0, "pool": 150.0}
TARGET_FSYNCS_PER_NODE = 4.0
CI_FSYNCS_PER_NODE = {"inprocess": 4.0, "rpc": 6.0}  # from 300 nodes on: below, the fixed fsyncs dominate
HERE = Path(__file__).resolve()


# ----- one run (the child interpreter: it is the root) -------------------------------------------------

def _launch(tasks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": [{"name": "subagent", "arguments": {"action": "launch", "tasks": tasks}}]}


WAIT = {"tool_calls": [{"name": "subagent", "arguments": {"action": "wait", "timeoutMs": 3_600_000}}]}


def _batches(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [_launch(tasks[i:i + BATCH]) for i in range(0, len(tasks), BATCH)]


def build_project(proj: Path, size: int, rpc: bool) -> None:
    """Scripts, the lead card and the settings of a `size`-node tree (3 = the cp chain)."""
    (proj / ".legion" / "agents").mkdir(parents=True)
    (proj / "scripts").mkdir()
    (proj / ".legion" / "settings.json").write_text(json.dumps({
        "legion": {"maxChildrenPerNode": 1000, "maxActiveNodes": 10_000, "maxDepth": 4},
        "inprocess": {"maxActive": 10_000, "maxQueuedLaunches": 100_000},
        "supervision": {"forceRpc": rpc},
    }))
    front = {"name": "lead", "description": "bench lead", "kind": "native", "tools": ["read", "subagent"],
             "allowNestedSubagents": True, "maxSubagentDepth": 2, "restart": "transient"}
    (proj / ".legion" / "agents" / "lead.md").write_text(f"---\n{yaml.safe_dump(front)}---\nbench lead\n")

    def script(name: str, turns: list[Any]) -> str:
        body = {"turns": turns, "default": {"text": f"{name} noted"}}
        (proj / "scripts" / f"{name}.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
        return f"scripted/scripts/{name}.yaml"

    worker_model = script("worker", [{"text": "worker done", "delay_ms": WORKER_CALL_MS}])
    leads = 1 if size == 3 else LEADS
    members: list[list[dict[str, Any]]] = [[] for _ in range(leads)]
    for w in range(size - 1 - leads):
        members[w % leads].append({"name": f"w{w}", "agent": "worker", "task": f"bench w{w}", "model": worker_model})
    lead_tasks = []
    for i in range(leads):
        model = script(f"lead{i}", [*_batches(members[i]), WAIT, {"text": f"lead{i} done"}])
        lead_tasks.append({"name": f"lead{i}", "agent": "lead", "task": "lead a squad", "model": model})
    script("root", [*_batches(lead_tasks), WAIT, {"text": "root done"}])


def _read_kb(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(field.encode()):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _uss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            return sum(int(line.split()[1]) for line in fh if line.startswith(b"Private_"))
    except (OSError, ValueError):
        return None


SAMPLE_EVERY_S = 0.1
USS_EVERY_S = 4.0  # a worker that has not settled yet (the root's, a lead's): its USS grows with its session


class Sampler(threading.Thread):
    """Peak RSS of the pool and the fork server, and each rpc worker's last USS, read from /proc; `cpu_s` is
    this thread's own CPU, which `one_run` takes out of the root's."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.root: Any = None
        self.stop = threading.Event()
        self.hwm_kb: dict[str, int] = {"pool": 0, "zygote": 0}
        self.uss_kb: dict[str, int] = {}
        self.uss_at: dict[str, float] = {}
        self.settled_at: dict[str, float] = {}  # node id → its last `agent_settled` (monotonic), from `one_run`'s tee
        self.cpu_s = 0.0

    def run(self) -> None:
        try:
            self._sample()
        finally:
            self.cpu_s = time.thread_time()

    def _sample(self) -> None:
        while not self.stop.wait(SAMPLE_EVERY_S):
            root = self.root
            if root is None:
                continue
            try:
                workers = [(c.id, c.pid) for c in list(root.registry.workers()) if c.pid is not None]
            except RuntimeError:  # the registry changed under us (it lives on the root's loop): next round
                continue
            spawner = getattr(root, "_spawner", None)
            zygote = spawner.zygote_pid if spawner is not None else None
            if zygote:
                self.hwm_kb["zygote"] = max(self.hwm_kb["zygote"], _read_kb(zygote, "VmHWM") or 0)
            for wid, pid in workers:
                if wid == "pool":
                    self.hwm_kb["pool"] = max(self.hwm_kb["pool"], _read_kb(pid, "VmHWM") or 0)
                elif self._uss_due(wid):
                    self.uss_at[wid] = time.monotonic()
                    uss = _uss_kb(pid)
                    if uss:
                        self.uss_kb[wid] = uss

    def _uss_due(self, wid: str) -> bool:
        """Once after the node's latest settle (idle from then on: the next round, as the tree's last workers settle
        moments before the root does and the run retires them); every `USS_EVERY_S` before it settles (the first
        `USS_EVERY_S` after it is first seen)."""
        now = time.monotonic()
        read = self.uss_at.setdefault(wid, now)  # first seen: its first read, unsettled, is USS_EVERY_S later
        settled = self.settled_at.get(wid)
        if settled is not None:
            return wid not in self.uss_kb or read < settled
        return now - read >= USS_EVERY_S


async def one_run(size: int, backend: str) -> dict[str, Any]:
    from loguru import logger

    from legion.orchestration.run import RunOptions, execute, prepare_run

    logger.remove()
    proj = Path(tempfile.mkdtemp(prefix="ltr", dir="/tmp"))
    failed = True
    try:
        build_project(proj, size, backend == "rpc")
        events: list[tuple[float, str, dict[str, Any]]] = []
        sampler = Sampler()

        def attach(root: Any) -> None:
            publish = root.monitor.publish

            def tee(type_: str, body: dict[str, Any]) -> int:
                events.append((time.perf_counter(), type_, body))
                if type_ == "agent_settled":
                    sampler.settled_at[str(body.get("node_id"))] = time.monotonic()
                return publish(type_, body)

            root.monitor.publish = tee
            sampler.root = root

        prepared = prepare_run(RunOptions(task="bench tree", cwd=proj, model="scripted/scripts/root.yaml",
                                          env=dict(os.environ), timeout=1800))
        sampler.start()
        self_0 = resource.getrusage(resource.RUSAGE_SELF)
        kids_0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t_exec = time.perf_counter()
        result = await execute(prepared, on_root=attach, install_signals=False)
        t_end = time.perf_counter()
        sampler.stop.set()
        sampler.join()
        self_ru = resource.getrusage(resource.RUSAGE_SELF)
        kids_ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        if result.exit_code != 0:
            raise RuntimeError(f"tree run failed: {result.status} {result.detail} (kept: {result.run_dir}/legion.log)")
        nodes = [n for n in result.nodes if n.get("role") != "pool" and n.get("id") != "pool"]

        def first(type_: str, pred: Any = lambda b: True) -> float:
            return min(t for t, ty, b in events if ty == type_ and pred(b))

        def last(type_: str, pred: Any = lambda b: True) -> float:
            return max(t for t, ty, b in events if ty == type_ and pred(b))

        root_start = first("turn_start", lambda b: b.get("node_id") == "root")
        root_settled = last("agent_settled", lambda b: b.get("node_id") == "root")
        first_call: dict[str, float] = {}  # each worker's first model call (one pass: 1,000 workers × their events)
        for t, ty, b in events:
            if ty == "turn_start" and str(b.get("node_id", "")).startswith("w"):
                first_call.setdefault(str(b.get("node_id")), t)
        workers = set(first_call)
        first_start = first("node_status", lambda b: b.get("status") == "starting" and b.get("node_id") not in ("root", "pool"))
        last_worker_call = max(first_call.values())
        ledger = sum(p.stat().st_size for p in result.run_dir.glob("legion.db*"))
        out = {
            "size": size, "backend": backend, "nodes_in_ledger": len(nodes), "workers_called": len(workers),
            "wall_s": root_settled - root_start,
            "startup_s": root_start - t_exec,
            "launch_window_s": last_worker_call - first_start,
            "shutdown_s": t_end - root_settled,
            "peak_rss_kb": {"root": self_ru.ru_maxrss, **sampler.hwm_kb},
            "rpc_worker_uss_kb": sorted(sampler.uss_kb.values()),
            # from `execute` on: the interpreter's own start and imports are startup, not per-node cost
            "cpu_root_s": self_ru.ru_utime + self_ru.ru_stime - self_0.ru_utime - self_0.ru_stime - sampler.cpu_s,
            "cpu_sampler_s": sampler.cpu_s,
            "cpu_children_s": kids_ru.ru_utime + kids_ru.ru_stime - kids_0.ru_utime - kids_0.ru_stime,
            "ledger_bytes": ledger,
        }
        failed = False
        return out
    finally:
        if not failed:  # a failed run's project and run directory stay, for its legion.log
            shutil.rmtree(proj, ignore_errors=True)


# ----- the driver ---------------------------------------------------------------------------------------

STRACE = shutil.which("strace")
FSYNC_CALLS = ("fsync", "fdatasync", "syncfs", "sync")


def _parse_strace_c(text: str) -> int:
    """Calls of the counted syscalls in an `strace -c` table."""
    total = 0
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[-1] in FSYNC_CALLS and len(parts) >= 5:
            total += int(parts[3])
    return total


def child(size: int, backend: str, fsync: bool, timeout: float) -> dict[str, Any]:
    """One run in a fresh interpreter (under strace when `fsync`); its figures."""
    cmd = [sys.executable, str(HERE), "--one", str(size), "--backend", backend]
    trace_file = None
    if fsync:
        fd, trace_file = tempfile.mkstemp(prefix="ltr-strace-", dir="/tmp")
        os.close(fd)
        cmd = [STRACE or "strace", "-f", "-qq", "-c", "--seccomp-bpf", "-e", f"trace={','.join(FSYNC_CALLS)}",
               "-o", trace_file, *cmd]
    try:
        # its own process group: on a timeout the tracer and the run's root go together (a killed tracer alone
        # would leave its tracees running); the workers follow the root through their lifelines
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"{backend} size {size} exited {proc.returncode}: {stderr[-3000:]}")
        out: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
        out["fsyncs"] = _parse_strace_c(Path(trace_file).read_text()) if trace_file else None
        return out
    finally:
        if trace_file:
            Path(trace_file).unlink(missing_ok=True)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def figures(tree: dict[str, Any], chain: dict[str, Any]) -> dict[str, Any]:
    size, backend = tree["size"], tree["backend"]
    cpu_all = tree["cpu_root_s"] + tree["cpu_children_s"]
    cp_cpu = chain["cpu_root_s"] + chain["cpu_children_s"]
    uss = tree["rpc_worker_uss_kb"]
    return {
        "size": size, "backend": backend,
        "wall_over_cp": round(tree["wall_s"] / chain["wall_s"], 3),
        "wall_s": round(tree["wall_s"], 3), "cp_s": round(chain["wall_s"], 3),
        "launch_window_s": round(tree["launch_window_s"], 3),
        "shutdown_s": round(tree["shutdown_s"], 3),
        "startup_s": round(tree["startup_s"], 3),
        "peak_rss_mb": {k: round(v / 1024, 1) for k, v in tree["peak_rss_kb"].items()},
        "rpc_worker_uss_mb": ({"median": round(_median(uss) / 1024, 2), "max": round(max(uss) / 1024, 2),
                               "n": len(uss)} if uss else None),
        "cpu_s": {"all": round(cpu_all, 3), "root": round(tree["cpu_root_s"], 3), "cp_all": round(cp_cpu, 3),
                  "bench_sampler": round(tree["cpu_sampler_s"], 3)},
        "cpu_over_cp": round(cpu_all / cp_cpu, 2) if cp_cpu > 0 else None,
        "cpu_ms_per_node": {"all": round(cpu_all * 1000 / size, 2), "root": round(tree["cpu_root_s"] * 1000 / size, 2)},
        "fsyncs": tree["fsyncs"],
        "fsyncs_per_node": None if tree["fsyncs"] is None else round(tree["fsyncs"] / size, 2),
        **({"fsync_error": tree["fsync_error"]} if "fsync_error" in tree else {}),
        "ledger_bytes": tree["ledger_bytes"],
        "nodes_in_ledger": tree["nodes_in_ledger"], "workers_called": tree["workers_called"],
    }


def exponent(points: list[tuple[int, float]]) -> float | None:
    """k of y ∝ x^k, least squares in log-log; None with fewer than 2 usable points."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return round(sum((p[0] - mx) * (p[1] - my) for p in pts) / den, 3) if den else None


def targets_for(fig: dict[str, Any], strict: bool) -> dict[str, dict[str, Any]]:
    """Each target that applies to this run: {name: {target, ci_gate, value, met, gated, passed}}.

    `target` is issue 22's, `met` compares to it; `ci_gate` is today's gate with headroom (None: none). Gated:
    the CI gates, or with `strict` every issue target in its place; `passed` compares a gated value to its gate."""
    size, backend = fig["size"], fig["backend"]
    out: dict[str, dict[str, Any]] = {}

    def add(name: str, target: float | None, value: float | None, ci_gate: float | None = None) -> None:
        gate = target if strict and target is not None else ci_gate
        out[name] = {"target": target, "ci_gate": ci_gate, "value": value,
                     "met": None if target is None else value is not None and value <= target,
                     "gated": gate is not None,
                     "passed": None if gate is None else value is not None and value <= gate}

    # correctness, always gated: every node in the ledger and every worker made its model call
    out["complete"] = {"target": fig["size"], "ci_gate": fig["size"], "value": fig["nodes_in_ledger"],
                       "met": fig["nodes_in_ledger"] == size and fig["workers_called"] == size - 1 - LEADS,
                       "gated": True}
    out["complete"]["passed"] = out["complete"]["met"]
    # CPU time, unlike wall, hardly moves with the machine's load; as a ratio to the chain's it does not move
    # with the machine's speed either: the CI gate against a per-node cost regression
    add("cpu_over_cp", None, fig["cpu_over_cp"], CI_CPU_OVER_CP[backend].get(size))
    ratio = WALL_OVER_CP[backend].get(size)
    if ratio is not None:
        add("wall_over_cp", ratio, fig["wall_over_cp"], CI_WALL_OVER_CP[backend].get(size))
    if backend == "inprocess":
        add("root_cpu_ms_per_node", TARGET_ROOT_CPU_MS_PER_NODE, fig["cpu_ms_per_node"]["root"])
    if backend == "rpc" and size == 300:
        add("shutdown_s", TARGET_RPC_SHUTDOWN_300_S, fig["shutdown_s"])
    if backend == "rpc" and fig["rpc_worker_uss_mb"]:
        add("rpc_worker_uss_mb_median", TARGET_RPC_USS_MB, fig["rpc_worker_uss_mb"]["median"], CI_RPC_USS_MB)
    if size == 1000:
        for role, mb in TARGET_PEAK_RSS_1000_MB.items():
            add(f"peak_rss_{role}_mb", mb, fig["peak_rss_mb"].get(role))
    if fig["fsyncs_per_node"] is not None:
        add("fsyncs_per_node", TARGET_FSYNCS_PER_NODE, fig["fsyncs_per_node"],
            CI_FSYNCS_PER_NODE[backend] if size >= 300 else None)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="30,100,300", help="comma-separated node counts (≥ 12; CI: 300)")
    parser.add_argument("--backend", choices=("inprocess", "rpc", "both"), default="both")
    parser.add_argument("--fsync", choices=("strace", "off"), default="strace" if STRACE else "off",
                        help="count fsyncs with strace (default where strace exists)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("--strict", action="store_true",
                        help="gate issue 22's acceptance targets (default: gate the CI gates, report the targets)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one run in this interpreter
    opts = parser.parse_args()
    if opts.one is not None:
        print(json.dumps(asyncio.run(one_run(opts.one, opts.backend))))
        return 0
    sizes = sorted({int(s) for s in opts.sizes.split(",") if s.strip()})
    if any(s < LEADS + 2 for s in sizes):
        parser.error(f"every size must be at least {LEADS + 2} (root + {LEADS} leads + a worker)")
    backends = ("inprocess", "rpc") if opts.backend == "both" else (opts.backend,)
    fsync = opts.fsync == "strace"
    if fsync and STRACE is None:
        parser.error("--fsync strace: strace is not installed (apt-get install strace, or --fsync off)")
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    for backend in backends:
        for size in sizes:
            try:
                chain = child(3, backend, False, opts.timeout)
                tree = child(size, backend, False, opts.timeout)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:  # reported; the other sizes still run
                runs.append({"size": size, "backend": backend, "error": str(exc)[-2000:], "targets": {}})
                continue
            if fsync:  # a second run of the same tree, traced: strace -f slows every process it follows
                took = tree["startup_s"] + tree["wall_s"] + tree["shutdown_s"]
                try:  # a traced 300-node rpc run has stalled here for minutes: bounded by the timed run's length
                    tree["fsyncs"] = child(size, backend, True, min(opts.timeout, 60 + 6 * took))["fsyncs"]
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    tree["fsync_error"] = str(exc)[-2000:]
            fig = figures(tree, chain)
            fig["targets"] = targets_for(fig, opts.strict)
            runs.append(fig)
    growth = {}
    for backend in backends:
        mine = [r for r in runs if r["backend"] == backend and "error" not in r]
        growth[backend] = {
            "wall": exponent([(r["size"], r["wall_s"]) for r in mine]),
            # wall holds the model's 2 s floor, which flattens its fit; past the cp is orchestration's own time
            "wall_minus_cp": exponent([(r["size"], r["wall_s"] - r["cp_s"]) for r in mine]),
            "cpu_all": exponent([(r["size"], r["cpu_s"]["all"]) for r in mine]),
            "launch_window": exponent([(r["size"], r["launch_window_s"]) for r in mine]),
            "shutdown": exponent([(r["size"], r["shutdown_s"]) for r in mine]),
        }
    missed = [f"{r['backend']}@{r['size']}:{name}" for r in runs for name, t in r["targets"].items()
              if t["gated"] and not t["passed"]] + [f"{r['backend']}@{r['size']}:failed" for r in runs if "error" in r]
    result = {
        "bench": "tree",
        "shape": f"root → {LEADS} leads → workers in tasks[] batches of {BATCH}, one {WORKER_CALL_MS} ms model "
                 "call each; cp = root → lead → worker in the same invocation",
        "runs": runs,
        "growth_exponent": growth,
        "fsync_counter": f"strace -f -c --seccomp-bpf ({', '.join(FSYNC_CALLS)})" if fsync else None,
        "mode": "strict: issue 22's targets gated" if opts.strict else
                "ci: the CI gates (today's figures with headroom) gated, issue 22's targets reported",
        "gated": sorted({f"{r['backend']}@{r['size']}:{n}" for r in runs for n, t in r["targets"].items() if t["gated"]}),
        "reported": sorted({f"{r['backend']}@{r['size']}:{n}" for r in runs for n, t in r["targets"].items()
                            if not t["gated"]}),
        "missed_gated": missed,
        # every issue target missed, gated or not: the distance issue 22 still has to go
        "missed_targets": sorted(f"{r['backend']}@{r['size']}:{n}" for r in runs for n, t in r["targets"].items()
                                 if t["met"] is False),
        "ok": not missed,
        "cpus": os.cpu_count(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
