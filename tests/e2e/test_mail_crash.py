"""A deliverer that dies mid-delivery (another process holding leases, or the postman itself) loses no mail:
duplicates are tolerable, loss is not (docs/spec-conformance.md §6.3–§6.4)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap

from legion.orchestration.orchestrator import POOL
from legion.orchestration.postman import Postman, format_mail
from legion.workers.transcript import user_texts_last_turns
from tests.e2e.mail_harness import Run, delivered, mail_run
from tests.support import until

LEASE_MS = 1500
ROOT = {"turns": [{"tool_calls": [
    {"name": "subagent", "arguments": {"action": "launch", "agent": "worker", "name": n, "task": n,
                                       "model": "scripted/idle.yaml"}} for n in ("b", "c")]}],
    "default": {"text": "noted"}}
SCRIPTS = {"root.yaml": ROOT, "idle.yaml": {"default": {"text": "ok"}}}
SETTINGS = {"legion": {"mailRatePer5Min": 1000}}

CRASHER = textwrap.dedent("""
    import os, signal, sys
    from legion.ledger import open_ledger
    led = open_ledger(sys.argv[1], mail_rate_per_5_min=1000)
    with led.transaction():  # sent and claimed at once: the live postman cannot take these ten first
        ids = [led.send_mail("b", "c", f"from another process {i}", f"body {i}").id for i in range(30)]
        claimed = [i for i in ids[:10] if led.claim_for_delivery(i) is not None]
    print(",".join(map(str, ids)), len(claimed), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # dies holding ten leases, mid-delivery
""")


async def _ready(run: Run) -> None:
    await until(lambda: all(run.orch.tree.get(n) is not None and run.node(n).status == "settled"
                            for n in ("root", "b", "c")), 20.0, "the tree settled")


def _seen(run: Run, node: str, ids: list[int]) -> dict[int, int]:
    texts = user_texts_last_turns(run.node(node).transcript, 10_000)
    rows = {int(r["id"]): r for r in run.mail()}
    return {i: texts.count(format_mail(rows[i])) for i in ids}


async def test_a_process_killed_holding_leases_loses_nothing() -> None:
    async with mail_run(SCRIPTS, settings=SETTINGS, lease_ms=LEASE_MS) as run:
        await _ready(run)
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", CRASHER, str(run.run_dir / "legion.db"),
                                                    stdout=asyncio.subprocess.PIPE, env={**os.environ})
        out, _ = await proc.communicate()
        assert proc.returncode == -signal.SIGKILL
        raw_ids, claimed = out.decode().split()
        ids = [int(i) for i in raw_ids.split(",")]
        assert claimed == "10"
        await delivered(run, ids, timeout=30.0)  # the backstop finds them; the dead leases expire
        assert set(_seen(run, "c", ids).values()) == {1}  # each exactly once: nobody handed those ten over


async def test_a_postman_killed_mid_delivery_loses_nothing() -> None:
    async with mail_run(SCRIPTS, settings=SETTINGS, lease_ms=LEASE_MS) as run:
        await _ready(run)
        ids = []
        for i in range(20):
            reply = await run.tool("b", "legion_mail", to="c", subject=f"m{i}", body=f"body {i}")
            ids.append(int(reply["details"]["sent"][0]["id"]))
        await asyncio.sleep(0)  # its delivery tasks are under way
        await run.postman.close()  # the postman dies here, whatever it was doing
        run.postman = Postman(run.orch, interval=0.2, lease_ms=LEASE_MS).start()  # its restart
        await delivered(run, ids, timeout=30.0)
        assert min(_seen(run, "c", ids).values()) >= 1  # duplicates are tolerable, loss is not


BUSY = {"root.yaml": {"turns": [{"tool_calls": [{"name": "subagent", "arguments": {
    "action": "launch", "agent": "worker", "name": "busy", "task": "busy", "model": "scripted/busy.yaml"}}]}],
    "default": {"text": "noted"}},
    # busy until the test creates the gate file: the follow-up waits in the session's queue, in no transcript
    "busy.yaml": {"turns": [{"tool_calls": [{"name": "bash", "arguments": {
        "command": "while [ ! -e gate ]; do sleep 0.02; done"}}]}], "default": {"text": "ok"}}}


async def test_mail_accepted_by_a_host_that_died_before_recording_it_goes_in_again() -> None:
    async with mail_run(BUSY, settings=SETTINGS) as run:
        await until(lambda: run.orch.tree.get("busy") is not None and run.node("busy").live, 20.0, "busy running")
        reply = await run.tool("root", "legion_mail", to="busy", subject="fyi", body="read me after your tool")
        mid = int(reply["details"]["sent"][0]["id"])
        await until(lambda: run.mail(id=mid)[0]["state"] == "ACCEPTED", 10.0, "the follow-up handed over")
        assert f"[legion mail #{mid}]" not in run.node("busy").transcript.read_text()  # queued, not recorded
        pool = run.root.nodes.worker(POOL)
        assert pool is not None and isinstance(pool.pid, int)
        os.kill(pool.pid, signal.SIGKILL)  # its host dies with the mail in its queue
        await until(lambda: (w := run.root.nodes.worker(POOL)) is not None and w.pid != pool.pid, 20.0,
                    "the pool restarted")
        (run.cwd / "gate").touch()
        await delivered(run, [mid], timeout=30.0)  # the relaunched session got it again
        await until(lambda: run.postman.counts["recovered"] == 1, 10.0, "its recovery counted")  # (after the reply)
        assert _seen(run, "busy", [mid])[mid] == 1
