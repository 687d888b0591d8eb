"""File tools in a helper process (issue 19 item 4): what a call costs, and that the caller's loop stays free.

1. `cold`: a session's first file-tool call (the helper process starts: fork + exec of `python -I -S`),
   over `--sessions` fresh tool contexts.
2. `warm`: `read` of a small file and `grep` over a small tree through the session's warm helper
   (a pipe round trip), `--calls` each, against `inline`: the same work called in this process
   (`fileops.serve`, what the tools did before). Target: the helper adds <= 10 ms to the median (two
   scheduler wake-ups: about 0.5 ms on a quiet machine, several ms when every core has a queue).
3. `stall`: while a `grep` that backtracks without end (`(a|aa)+$` on a 40 KB line) runs to its 1 s
   deadline and is killed, a ticker on the caller's loop measures its lag (how late each 2 ms sleep
   wakes). Target: the longest lag <= 200 ms (a frozen loop would show the whole grep), and the call
   ends within its deadline + 2 s (the kill grace, plus slack).

Prints one JSON object; exits non-zero when a target is missed. `--quick`: fewer calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _stats

from legion.workers.context import Budget, SessionContext
from legion.workers.tools.base import ToolContext, run_tool
from legion.workers.tools.catalog import all_tools
from legion.workers.tools.fileops import serve

TOOLS = all_tools()


def _ctx(base: Path, name: str, timeout_ms: int | None = None) -> ToolContext:
    budget = Budget(tool_timeout_ms=timeout_ms) if timeout_ms else Budget()
    return ToolContext(SessionContext(node_id=name, cwd=str(base), budget=budget), base / f"out-{name}")


async def _timed(name: str, args: dict[str, object], ctx: ToolContext) -> float:
    start = time.perf_counter()
    r = await run_tool(TOOLS[name], args, ctx)
    if r.is_error:
        raise RuntimeError(f"{name} failed: {r.text}")
    return (time.perf_counter() - start) * 1000


def _inline(op: str, args: dict[str, object], base: Path) -> float:
    start = time.perf_counter()
    reply = serve({"op": op, "args": args, "cwd": str(base), "seconds": 60.0})
    if not reply.get("ok"):
        raise RuntimeError(f"{op} failed: {reply}")
    return (time.perf_counter() - start) * 1000


async def run(base: Path, sessions: int, calls: int) -> dict[str, object]:
    (base / "src").mkdir()
    for i in range(20):
        (base / "src" / f"m{i}.py").write_text("".join(f"line {n} of module {i}\n" for n in range(200)))
    (base / "hay.txt").write_text("a" * 40_000 + "b\n")
    cold = []
    for i in range(sessions):
        ctx = _ctx(base, f"cold{i}")
        cold.append(await _timed("read", {"path": "src/m0.py", "limit": 5}, ctx))
        await ctx.executor.aclose()
    ctx = _ctx(base, "warm")
    await _timed("read", {"path": "src/m0.py"}, ctx)
    read_args, grep_args = {"path": "src/m1.py", "limit": 20}, {"pattern": r"line 1\d of module 7$", "path": "src"}
    read, grep, inline_read, inline_grep = [], [], [], []
    for _ in range(calls):  # interleaved: each side sees the same machine load
        read.append(await _timed("read", read_args, ctx))
        inline_read.append(_inline("read", read_args, base))
        grep.append(await _timed("grep", grep_args, ctx))
        inline_grep.append(_inline("grep", grep_args, base))
    await ctx.executor.aclose()

    ctx = _ctx(base, "stall", timeout_ms=1000)
    await _timed("ls", {}, ctx)  # a warm helper: the lag measured is the grep's, not a process start
    lags: list[float] = []
    done = False

    async def ticker() -> None:
        while not done:
            before = time.perf_counter()
            await asyncio.sleep(0.002)
            lags.append((time.perf_counter() - before - 0.002) * 1000)

    tick = asyncio.ensure_future(ticker())
    start = time.perf_counter()
    r = await run_tool(TOOLS["grep"], {"pattern": "(a|aa)+$", "path": "hay.txt"}, ctx)
    took = time.perf_counter() - start
    done = True
    await tick
    await ctx.executor.aclose()
    killed = r.is_error and "was killed" in r.text
    med = _stats.summary
    targets = {"read_helper_adds_median_ms<=10": med(read)["median"] - med(inline_read)["median"] <= 10,
               "grep_helper_adds_median_ms<=10": med(grep)["median"] - med(inline_grep)["median"] <= 10,
               "stall_max_lag_ms<=200": max(lags) <= 200,
               "grep_killed_by_deadline+2s": killed and took <= 3.0}
    return {"cold_ms": _stats.summary(cold, count=True), "warm_read_ms": _stats.summary(read, count=True),
            "warm_grep_ms": _stats.summary(grep, count=True), "inline_read_ms": _stats.summary(inline_read),
            "inline_grep_ms": _stats.summary(inline_grep),
            "stall": {"grep_seconds": round(took, 3), "killed": killed, "loop_lag_ms": _stats.summary(lags, count=True)},
            "load": os.getloadavg(), "targets": targets, "ok": all(targets.values())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="lft"))
    try:
        result = asyncio.run(run(base, sessions=5 if args.quick else 20, calls=50 if args.quick else 300))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
