"""Mail benchmark (issue 11 acceptance), through a real run: root supervisor, pool worker process,
orchestrator, postman, scripted sessions.

1. send → injected into an idle recipient's session: from the `legion_mail` call entering the orchestrator
   until the recipient's session answered the postman's `session.prompt` (targets p50 ≤ 20 ms, p99 ≤ 100 ms).
   Baseline measured in the same run: a bare `session.prompt` of the same text to the same idle session
   (the floor the postman adds its routing, ledger writes and lease to).
2. 30 sessions exchanging 3,000 mails (each sends 100 to its siblings): none lost, none delivered twice (each
   envelope exactly once among its recipient's user messages), and every mail confirmed DELIVERED within two
   backstop sweeps (2 s each) of the last hand-over.

Prints one JSON object with every check (`checks`) and exits non-zero when a gated one fails. Gated by default:
the exchange's correctness and the send's overhead over the bare prompt of the same run (p50 ≤ 30 ×, a ratio that
holds when the machine is slow); the absolute p50/p99 targets are reported, and gated too with `--strict`.
`--quick`: 50 sends, 10 sessions × 20 mails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import _stats
import yaml
from loguru import logger

from legion.agents import load_catalog, load_settings
from legion.ledger.constants import Delivery
from legion.orchestration.launch import LaunchRequest, RunContext
from legion.orchestration.orchestrator import POOL, Orchestrator
from legion.orchestration.postman import Postman, format_mail
from legion.supervision.root import RootSupervisor
from legion.supervision.spawn import DEFAULT_PRELOAD
from legion.workers.transcript import user_texts_last_turns

TARGET_P50_MS, TARGET_P99_MS, TARGET_SWEEPS = 20.0, 100.0, 2
TARGET_OVERHEAD_RATIO = 30.0  # send → injected p50 over a bare prompt's p50, both measured in this run
ABSOLUTE = ("send_to_inject_p50", "send_to_inject_p99")  # gated only with --strict (machine speed varies ±40 %)


@contextlib.asynccontextmanager
async def live_run(kids: int) -> AsyncIterator[tuple[Orchestrator, Postman]]:
    cwd = Path(tempfile.mkdtemp(prefix="bm", dir="/tmp"))
    run_dir = cwd / ".legion" / "runs" / "b1"
    run_dir.mkdir(parents=True)
    (cwd / ".legion" / "settings.json").write_text(json.dumps({"legion": {"mailRatePer5Min": 10_000,
                                                                          "maxChildrenPerNode": 64,
                                                                          "maxActiveNodes": 128},
                                                               "inprocess": {"maxActive": 64}}))
    launches = [{"name": "subagent", "arguments": {"action": "launch", "agent": "worker", "name": f"k{i}",
                                                    "task": "idle", "model": "scripted/idle.yaml"}}
                for i in range(kids)]
    (cwd / "root.yaml").write_text(yaml.safe_dump({"turns": [{"tool_calls": launches}], "default": {"text": "ok"}}))
    (cwd / "idle.yaml").write_text(yaml.safe_dump({"default": {"text": "ok"}}))
    env = {"HOME": str(cwd), "PATH": "/usr/bin:/bin"}
    settings = load_settings(cwd, env=env)
    root = RootSupervisor(run_dir, run_id="b1", root_node=False, preload=(*DEFAULT_PRELOAD,
                                                                        "legion.workers.session_worker"))
    await root.start()
    orch: Orchestrator | None = None
    postman: Postman | None = None
    try:
        await root.nodes.launch_pool(POOL, inprocess=dict(settings.data.get("inprocess") or {}),
                               log_path=str(run_dir / "pool.log"))
        assert root.ledger is not None
        ctx = RunContext(run_dir=run_dir, run_id="b1", cwd=cwd, settings=settings,
                         catalog=load_catalog(cwd, env=env, settings=settings), ledger=root.ledger,
                         writer=root.writer, env=env)
        orch = Orchestrator(root.nodes, ctx)
        postman = Postman(orch).start()
        await orch.launch(None, LaunchRequest(agent="root", task="bench", name="root", model="scripted/root.yaml"))
        await until(lambda: len(orch.tree) == kids + 1 and all(idle(orch, n.id) for n in orch.tree), 60.0)
        yield orch, postman
    finally:
        if postman is not None:
            await postman.close()
        if orch is not None:
            await orch.close()
        with contextlib.suppress(Exception):
            await root.stop()
        shutil.rmtree(cwd, ignore_errors=True)


def idle(orch: Orchestrator, node_id: str) -> bool:
    node = orch.tree.get(node_id)
    return node is not None and node.status == "settled" and not orch.busy(node)  # (hosted, or parked)


async def until(cond: Any, timeout: float, interval: float = 0.001) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark condition not reached")
        await asyncio.sleep(interval)


async def latency(n: int) -> dict[str, Any]:
    """Part 1: send → injected into an idle session, and the bare-prompt baseline."""
    async with live_run(2) as (orch, _):
        injected: dict[int, float] = {}
        real = orch.root.session_request

        async def spy(node_id: str, op: str, **body: Any) -> dict[str, Any]:
            reply = await real(node_id, op, **body)
            text = str(body.get("text", ""))
            if text.startswith("[legion mail #"):
                injected[int(text[len("[legion mail #"):].split("]")[0])] = time.perf_counter()
            return reply

        orch.root.session_request = spy  # type: ignore[method-assign]
        mail_ms, bare_ms = [], []
        for i in range(n):
            await until(lambda: idle(orch, "k1"), 30.0)
            t0 = time.perf_counter()
            reply = await orch.handle_tool("k0", "legion_mail", {"to": "k1", "subject": f"m{i}", "body": "ping"})
            mid = int(reply["details"]["sent"][0]["id"])
            await until(lambda mid=mid: mid in injected, 30.0)  # type: ignore[misc]
            mail_ms.append((injected[mid] - t0) * 1000)
            await until(lambda: idle(orch, "k1"), 30.0)
            t0 = time.perf_counter()
            await real("k1", "session.prompt", text=f"bare {i}")
            bare_ms.append((time.perf_counter() - t0) * 1000)
        ordered = sorted(mail_ms)
        p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        return {"mail_ms": {**_stats.summary(mail_ms, count=True), "p99": round(p99, 3)},
                "bare_prompt_ms": _stats.summary(bare_ms, count=True),
                "overhead_ratio_p50": round(statistics.median(mail_ms) / max(statistics.median(bare_ms), 1e-6), 2)}


async def exchange(kids: int, per_kid: int) -> dict[str, Any]:
    """Part 2: every session sends `per_kid` mails to random siblings; loss, duplicates, confirmation."""
    rng = random.Random(11)
    async with live_run(kids) as (orch, postman):
        ledger = orch.ctx.ledger
        names = [f"k{i}" for i in range(kids)]
        ids: list[int] = []
        started = time.monotonic()
        for r in range(per_kid):
            sends = [orch.handle_tool(k, "legion_mail", {"to": rng.choice([s for s in names if s != k]),
                                                         "subject": f"{k} round {r}", "body": f"body {k} {r}"})
                     for k in names]
            for reply in await asyncio.gather(*sends):
                assert reply["ok"], reply
                ids.extend(int(m["id"]) for m in reply["details"]["sent"])
        sent_s = time.monotonic() - started

        def count(state: Delivery) -> int:
            return len(ledger.messages_in_state(state, limit=len(ids) + 1))

        await until(lambda: count(Delivery.PENDING) == 0, 300.0, 0.05)
        handed_s = time.monotonic() - started
        sweeps_at_handover = postman.sweeps
        with contextlib.suppress(TimeoutError):
            await until(lambda: count(Delivery.DELIVERED) == len(ids), 60.0, 0.05)
        sweeps = postman.sweeps - sweeps_at_handover
        confirmed_s = time.monotonic() - started
        rows = {int(r["id"]): r for s in Delivery if s.name != "INJECTED"
                for r in ledger.messages_in_state(s, limit=len(ids) + 1)}
        seen: dict[str, list[str]] = {}
        for name in names:
            node = orch.tree.get(name)
            assert node is not None
            seen[name] = user_texts_last_turns(node.transcript, 1_000_000)
        copies = [seen[str(rows[i]["to_node"])].count(format_mail(rows[i])) for i in ids]
        return {"sessions": kids, "mails": len(ids), "send_s": round(sent_s, 2), "handed_over_s": round(handed_s, 2),
                "confirmed_s": round(confirmed_s, 2), "delivered": sum(1 for i in ids if rows[i]["delivered"] == 3),
                "lost": sum(1 for c in copies if c == 0), "duplicates": sum(1 for c in copies if c > 1),
                "sweeps_after_handover": sweeps, "postman": dict(postman.counts)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="50 sends; 10 sessions × 20 mails")
    ap.add_argument("--strict", action="store_true", help="gate the absolute latency targets too")
    args = ap.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    n, kids, per_kid = (50, 10, 20) if args.quick else (300, 30, 100)
    first = asyncio.run(latency(n))
    second = asyncio.run(exchange(kids, per_kid))
    mail = first["mail_ms"]
    checks = {"send_to_inject_p50": mail["median"] <= TARGET_P50_MS, "send_to_inject_p99": mail["p99"] <= TARGET_P99_MS,
              "none_lost": second["lost"] == 0, "none_twice": second["duplicates"] == 0,
              "all_delivered": second["delivered"] == second["mails"],
              "confirmed_within_two_sweeps": second["sweeps_after_handover"] <= TARGET_SWEEPS,
              # every hand-over in this bench can succeed: a failed one is a stale view of a recipient (one
              # parked while its mail was being claimed, or a relaunch disposed by a late park)
              "no_failed_handover": second["postman"]["handover_failed"] == 0,
              "overhead_ratio_p50": first["overhead_ratio_p50"] <= TARGET_OVERHEAD_RATIO}
    gated = sorted(checks) if args.strict else sorted(k for k in checks if k not in ABSOLUTE)
    out = {"benchmark": "mail", "quick": args.quick, "latency": first, "exchange": second,
           "targets": {"p50_ms": TARGET_P50_MS, "p99_ms": TARGET_P99_MS, "sweeps": TARGET_SWEEPS,
                       "overhead_ratio_p50_max": TARGET_OVERHEAD_RATIO},
           "checks": checks, "gated": gated, "ok": all(checks[k] for k in gated)}
    print(json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
