"""Orchestration benchmark (issue 8 acceptance), through the real `legion run` composition.

Every figure comes from real runs of scripted trees: `legion.orchestration.run.prepare_run` + `execute` (what `legion run`
does after parsing its arguments) in this process, with the pool worker and rpc workers as real processes. The
run's monitor stream is tapped where the root publishes it, so every timestamp is this process's monotonic
clock at the moment the root learnt of the event (both ends of a latency pay the same bus hop).

1. `subagent launch` → the child's first model call (the child's `turn_start`, emitted right before its
   provider is called), p50: inprocess (target ≤ 5 ms) and rpc with `supervision.forceRpc` (≤ 30 ms). The root
   launches one child per tool call and waits for it before the next, so the launches do not overlap. The rpc
   figure is broken down (`launch_rpc_breakdown_ms_p50`, see `LAUNCH_PARTS`);
2. a child settles (its `agent_settled`) → its idle parent's completion notice delivered (the parent's next
   `turn_start`, the notice being its prompt), p50 ≤ 20 ms: the root dispatches staggered children and settles;
3. 8 children from one `tasks[]` call: the root's `subagent` tool call → the last of them running (its
   `node_launched`, status running) ≤ 100 ms; the last first model call is printed too;
4. a tree of 30 live nodes all running within 1 s of the root's first model call. The centurion needs phases
   and worktrees that are not built, so the tree is the root + 4 `lead` nodes (a project card: native,
   `maxSubagentDepth: 2`) + 25 leaf workers (7+6+6+6), every node alive until the count is reached;
5. `legion run` of a one-node scripted task as a subprocess, process start → exit, p50 over a few runs
   (target ≤ 1.0 s), with what dominates: the interpreter + imports (`import legion.cli, legion.cli.run` in a
   fresh interpreter) and, from an in-process run, root start (fork server preload) → pool ready → root
   session settled → shutdown.

Every figure is printed with its issue target and whether it was met (`targets_met`). The machine's speed varies
±40 % between runs, so no absolute figure gates by default (`--strict` gates all six): what gates is the 8-child
fan-out and the 30-node tree (p50) relative to one in-process launch → first model call (p50, item 1) of the same
run — the fan-out may cost at most `RATIO_MAX` × one launch — and every run finishing (exit 0). Exit 1 when a gated
check fails (`checks`, `gated`). `--quick` takes fewer samples. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _stats
import yaml

TARGET_LAUNCH_INPROCESS_MS = 5.0
TARGET_LAUNCH_RPC_MS = 30.0
TARGET_NOTICE_MS = 20.0
TARGET_FANOUT_8_MS = 100.0
TARGET_TREE_30_MS = 1000.0
TARGET_ONE_NODE_RUN_S = 1.0
# the fan-out (8 children all running) and the 30-node tree (all running), p50, over one in-process launch → first
# model call p50 of the same run: measured 3.1-6.3 and 11.9-33.7 on the 2-core machine under the acceptance test run's
# load (the tree's few runs swing with one stall: 180-780 ms)
RATIO_MAX = {"fanout_8_over_launch": 12.5, "tree_30_over_launch": 68.0}
LEGION = str(Path(sys.executable).with_name("legion"))
Event = tuple[float, str, dict[str, Any]]


def _summary(values: list[float]) -> dict[str, float]:
    s = _stats.summary(values, count=True)
    return {"p50": s["median"], "p95": s["p95"], "max": s["max"], "n": s["n"]}


class Project:
    """A scratch project directory (short: ipc socket paths) with scripts, settings and cards."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="lob", dir="/tmp"))

    def script(self, name: str, *turns: Any, default: Any = None) -> str:
        data: dict[str, Any] = {"turns": list(turns)}
        if default is not None:
            data["default"] = default
        path = self.dir / "scripts" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return f"scripted/scripts/{name}.yaml"

    def settings(self, data: dict[str, Any]) -> None:
        (self.dir / ".legion").mkdir(exist_ok=True)
        (self.dir / ".legion" / "settings.json").write_text(json.dumps(data))

    def card(self, name: str, **front: Any) -> None:
        path = self.dir / ".legion" / "agents" / f"{name}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"---\n{yaml.safe_dump({'name': name, 'description': 'bench ' + name, **front})}---\nbench\n")

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def launch(*tasks: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": [{"name": "subagent", "arguments": {"action": "launch", "tasks": list(tasks)}}]}


def action(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": "subagent", "arguments": {"action": name, **args}}]}


def leaf(proj: Project, name: str, **turn: Any) -> dict[str, Any]:
    return {"name": name, "agent": "worker", "task": f"bench {name}",
            "model": proj.script(name, {"text": f"{name} done", **turn})}


async def run_tree(proj: Project, root_model: str, task: str = "bench") -> tuple[Any, list[Event]]:
    """One run in this process; the run result and every monitor event with the time the root published it."""
    from legion.orchestration.run import RunOptions, execute, prepare_run

    prepared = prepare_run(RunOptions(task=task, cwd=proj.dir, model=root_model, env=dict(os.environ), timeout=120))
    events: list[Event] = []

    def attach(root: Any) -> None:
        root.monitor.tap(lambda type_, body: events.append((time.perf_counter(), type_, body)))

    result = await execute(prepared, on_root=attach, install_signals=False)
    if result.exit_code != 0:
        raise RuntimeError(f"bench run failed: {result.status} {result.detail} (see {result.run_dir}/legion.log)")
    return result, events


def first(events: list[Event], pred: Callable[[str, dict[str, Any]], bool], after: float = 0.0) -> float:
    for t, type_, body in events:
        if t >= after and pred(type_, body):
            return t
    raise RuntimeError("an expected event is missing from the monitor stream")


def is_(type_: str, node: str | None = None, **fields: Any) -> Callable[[str, dict[str, Any]], bool]:
    def pred(t: str, body: dict[str, Any]) -> bool:
        return t == type_ and (node is None or body.get("node_id") == node) and \
            all(body.get(k) == v for k, v in fields.items())

    return pred


# ----- 1. launch → first model call ------------------------------------------------------------------

# where an rpc launch goes, from the same monitor events: the orchestrator's plan (its tool call → the node
# reserved `starting`), then fork + worker start + session build + first event hop (→ its first model call),
# and, beside it, → `running` recorded (the worker's `ready` + the ledger write; may land after the call)
LAUNCH_PARTS = ("plan_ms", "starting_to_first_model_call_ms", "starting_to_running_recorded_ms")

async def bench_launch(n: int, rpc: bool, parts: dict[str, list[float]] | None = None) -> list[float]:
    """Launch → first model call samples (ms); with `parts`, also where each went (see `LAUNCH_PARTS`)."""
    proj = Project()
    try:
        if rpc:
            proj.settings({"supervision": {"forceRpc": True}})
        turns: list[Any] = []
        for i in range(n):
            # the child's 30 ms model delay comes after its first call (not measured); it keeps an instant
            # settle from racing its own launch record on rpc (see tests/e2e/test_rpc.py)
            turns += [launch(leaf(proj, f"c{i}", delay_ms=30)), action("wait", names=[f"c{i}"], timeoutMs=20_000)]
        root = proj.script("root", *turns, {"text": "root done"})
        _, events = await run_tree(proj, root)
        samples = []
        for i in range(n):
            name = f"c{i}"
            called = first(events, lambda t, b, name=name: t == "tool_call" and b.get("phase") == "start"  # type: ignore[misc]
                           and (b.get("args") or {}).get("tasks", [{}])[0].get("name") == name)
            # the pool's tool_call event may reach the root after the launch request it announces
            starting = first(events, is_("node_status", name, status="starting"))
            t0 = min(called, starting)
            called_model = first(events, is_("turn_start", name), t0)
            samples.append((called_model - t0) * 1000)
            if parts is not None:
                running = first(events, is_("node_launched", name, status="running"), t0)
                for key, ms in zip(LAUNCH_PARTS, (starting - t0, called_model - starting, running - starting),
                                   strict=True):
                    parts.setdefault(key, []).append(ms * 1000)
        return samples
    finally:
        proj.close()


# ----- 2. child settles → parent's notice ------------------------------------------------------------

async def bench_notice(children: int, stagger_ms: int) -> list[float]:
    proj = Project()
    try:
        kids = [leaf(proj, f"n{i}", delay_ms=stagger_ms * (i + 1)) for i in range(children)]
        root = proj.script("root", launch(*kids), {"text": "dispatched"}, default={"text": "noted"})
        _, events = await run_tree(proj, root)
        samples = []
        root_settled = first(events, is_("agent_settled", "root"))
        for i in range(children):
            t0 = first(events, is_("agent_settled", f"n{i}"))
            if t0 < root_settled:
                continue  # settled while the root was still running: batched at its boundary, not a wake-up
            woken = first(events, is_("turn_start", "root"), t0)
            later = [first(events, is_("agent_settled", f"n{j}")) for j in range(children) if j != i]
            if any(t0 < t < woken for t in later):
                continue  # another settle came first: that one's notice carried this one
            samples.append((woken - t0) * 1000)
        return samples
    finally:
        proj.close()


# ----- 3. eight children from one tasks[] -------------------------------------------------------------

async def bench_fanout(runs: int) -> dict[str, list[float]]:
    running, first_calls = [], []
    for _ in range(runs):
        proj = Project()
        try:
            names = [f"f{i}" for i in range(8)]
            root = proj.script("root", launch(*(leaf(proj, n, delay_ms=300) for n in names)), action("wait"),
                               {"text": "root done"})
            _, events = await run_tree(proj, root)
            t0 = min(first(events, lambda t, b: t == "tool_call" and b.get("phase") == "start"),
                     first(events, is_("node_status", "f0", status="starting")))
            running.append((max(first(events, is_("node_launched", n, status="running"), t0) for n in names) - t0) * 1000)
            first_calls.append((max(first(events, is_("turn_start", n), t0) for n in names) - t0) * 1000)
        finally:
            proj.close()
    return {"running": running, "first_model_call": first_calls}


# ----- 4. thirty live nodes ---------------------------------------------------------------------------

async def bench_tree30(runs: int) -> dict[str, list[float]]:
    running, first_calls = [], []
    for _ in range(runs):
        proj = Project()
        try:
            proj.card("lead", kind="native", tools=["read", "subagent"], allowNestedSubagents=True,
                      maxSubagentDepth=2, restart="transient")
            sizes = [7, 6, 6, 6]
            leads = []
            for li, size in enumerate(sizes):
                members = [leaf(proj, f"m{li}-{j}", delay_ms=2500) for j in range(size)]
                model = proj.script(f"lead{li}", launch(*members), action("wait"), {"text": f"lead{li} done"})
                leads.append({"name": f"lead{li}", "agent": "lead", "task": "lead a squad", "model": model})
            root = proj.script("root", launch(*leads), action("wait"), {"text": "root done"})
            _, events = await run_tree(proj, root)
            t0 = first(events, is_("turn_start", "root"))
            names = ["root", *(lead["name"] for lead in leads),
                     *(f"m{li}-{j}" for li, size in enumerate(sizes) for j in range(size))]
            assert len(names) == 30
            running.append((max(first(events, is_("node_launched", n, status="running")) for n in names) - t0) * 1000)
            first_calls.append((max(first(events, is_("turn_start", n)) for n in names) - t0) * 1000)
        finally:
            proj.close()
    return {"running": running, "first_model_call": first_calls}


# ----- 5. a one-node run, process start to exit -------------------------------------------------------

def bench_one_node(runs: int) -> dict[str, Any]:
    proj = Project()
    try:
        env = {**os.environ, "LEGION_LOG_LEVEL": "ERROR"}
        walls, imports = [], []
        for i in range(runs):
            t0 = time.perf_counter()
            proc = subprocess.run([LEGION, "run", "say hi", "--model", "scripted/echo", "--run-id", f"one-{i}"],
                                  cwd=proj.dir, env=env, capture_output=True, text=True, timeout=60)
            walls.append(time.perf_counter() - t0)
            if proc.returncode != 0:
                raise RuntimeError(f"one-node run exited {proc.returncode}: {proc.stderr[-2000:]}")
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import legion.cli, legion.cli.run"], check=True, env=env)
            imports.append(time.perf_counter() - t0)
        return {"wall_s": walls, "interpreter_and_imports_s": imports}
    finally:
        proj.close()


async def one_node_phases(runs: int) -> dict[str, list[float]]:
    """Where an in-process one-node run spends its time (ms, from `execute` start)."""
    out: dict[str, list[float]] = {"root_supervisor_up": [], "pool_ready": [], "root_session_running": [],
                                   "root_settled": [], "shutdown_done": []}
    for _ in range(runs):
        proj = Project()
        try:
            t0 = time.perf_counter()
            _, events = await run_tree(proj, "scripted/echo", "say hi")
            end = time.perf_counter()
            out["root_supervisor_up"].append((first(events, is_("node_status", "pool")) - t0) * 1000)
            out["pool_ready"].append((first(events, is_("node_launched", "pool")) - t0) * 1000)
            out["root_session_running"].append((first(events, is_("node_launched", "root")) - t0) * 1000)
            out["root_settled"].append((first(events, is_("agent_settled", "root")) - t0) * 1000)
            out["shutdown_done"].append((end - t0) * 1000)
        finally:
            proj.close()
    return out


def _p50(values: list[float], digits: int = 2) -> float:
    return round(statistics.median(values), digits)


async def measure(quick: bool, strict: bool) -> dict[str, Any]:
    n_launch, n_rpc, n_notice_runs, n_runs = (6, 4, 1, 2) if quick else (20, 10, 3, 5)
    launch_in = await bench_launch(n_launch, rpc=False)
    rpc_parts: dict[str, list[float]] = {}
    launch_rpc = await bench_launch(n_rpc, rpc=True, parts=rpc_parts)
    notice: list[float] = []
    for _ in range(n_notice_runs):
        notice += await bench_notice(children=6, stagger_ms=150)
    fanout = await bench_fanout(n_runs)
    tree30 = await bench_tree30(max(1, n_runs // 2))
    phases = await one_node_phases(3)
    one = bench_one_node(n_runs)
    figures: dict[str, Any] = {
        "launch_to_first_model_call_inprocess_ms": _summary(launch_in),
        "launch_to_first_model_call_rpc_ms": _summary(launch_rpc),
        "launch_rpc_breakdown_ms_p50": {k: _p50(v) for k, v in rpc_parts.items()},
        "child_settled_to_notice_delivered_ms": _summary(notice) if notice else None,
        "fanout_8_all_running_ms": _summary(fanout["running"]),
        "fanout_8_all_first_model_call_ms": _summary(fanout["first_model_call"]),
        "tree_30_all_running_ms": _summary(tree30["running"]),
        "tree_30_all_first_model_call_ms": _summary(tree30["first_model_call"]),
        "one_node_run_wall_s": _summary(one["wall_s"]),
        "one_node_run_breakdown": {
            "interpreter_and_imports_s_p50": _p50(one["interpreter_and_imports_s"], 3),
            "in_process_ms_p50": {k: _p50(v, 1) for k, v in phases.items()},
        },
    }
    met = {
        "launch_inprocess_p50": statistics.median(launch_in) <= TARGET_LAUNCH_INPROCESS_MS,
        "launch_rpc_p50": statistics.median(launch_rpc) <= TARGET_LAUNCH_RPC_MS,
        "notice_p50": bool(notice) and statistics.median(notice) <= TARGET_NOTICE_MS,
        "fanout_8_running": statistics.median(fanout["running"]) <= TARGET_FANOUT_8_MS,
        "tree_30_running": statistics.median(tree30["running"]) <= TARGET_TREE_30_MS,
        "one_node_run_p50": statistics.median(one["wall_s"]) <= TARGET_ONE_NODE_RUN_S,
    }
    launch_p50 = statistics.median(launch_in)
    ratios = {"fanout_8_over_launch": round(statistics.median(fanout["running"]) / launch_p50, 2),
              "tree_30_over_launch": round(statistics.median(tree30["running"]) / launch_p50, 2)}
    checks = {k: ratios[k] <= RATIO_MAX[k] for k in ratios}
    gated = sorted(checks) + (sorted(met) if strict else [])
    return {
        "bench": "orchestration",
        **figures,
        "targets": {"launch_inprocess_p50_ms": TARGET_LAUNCH_INPROCESS_MS, "launch_rpc_p50_ms": TARGET_LAUNCH_RPC_MS,
                    "notice_p50_ms": TARGET_NOTICE_MS, "fanout_8_running_p50_ms": TARGET_FANOUT_8_MS,
                    "tree_30_running_p50_ms": TARGET_TREE_30_MS, "one_node_run_p50_s": TARGET_ONE_NODE_RUN_S},
        "targets_met": met,
        "over_launch": ratios,
        "over_launch_max": RATIO_MAX,
        "checks": checks,
        "gated": gated,
        "tree_30_shape": "root + 4 lead (project card, maxSubagentDepth 2) + 25 workers; no centurion (phases "
                         "and worktrees are not built)",
        "cpus": os.cpu_count(),
        "ok": all({**met, **checks}[k] for k in gated),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    parser.add_argument("--strict", action="store_true", help="gate every absolute issue target too")
    opts = parser.parse_args()
    from loguru import logger

    logger.remove()  # the runs log to their own run directories; stdout carries the one JSON object
    load = os.getloadavg()[0]
    result = asyncio.run(measure(opts.quick, opts.strict))
    result["loadavg_1m_before"] = round(load, 2)
    result["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
