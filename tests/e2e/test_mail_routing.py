"""legion_mail routing along tree edges, delivered and confirmed DELIVERED; refusals with codes and fixes."""

from __future__ import annotations

import asyncio
import os
import sys

from legion.ledger import write_run_json
from legion.ledger.owner import owner_record
from tests.e2e.mail_harness import Run, delivered, mail_run
from tests.support import until

IDLE = {"default": {"text": "ok"}}
ROOT = {"turns": [{"tool_calls": [
    {"name": "subagent", "arguments": {"action": "launch", "agent": "lead", "name": "a", "task": "lead a",
                                       "model": "scripted/lead_a.yaml"}},
    {"name": "subagent", "arguments": {"action": "launch", "agent": "worker", "name": "b", "task": "b",
                                       "model": "scripted/idle.yaml"}},
    {"name": "subagent", "arguments": {"action": "launch", "agent": "worker", "name": "c", "task": "c",
                                       "model": "scripted/idle.yaml"}}]}],
    "default": {"text": "noted"}}
LEAD_A = {"turns": [{"tool_calls": [
    {"name": "subagent", "arguments": {"action": "launch", "agent": "worker", "name": "a1", "task": "a1",
                                       "model": "scripted/idle.yaml"}}]}],
    "default": {"text": "ok"}}
SCRIPTS = {"root.yaml": ROOT, "lead_a.yaml": LEAD_A, "idle.yaml": IDLE}


async def _tree(run: Run) -> None:
    await until(lambda: all(run.orch.tree.get(n) is not None and run.orch.tree.get(n).status == "settled"  # type: ignore[union-attr]
                            for n in ("root", "a", "b", "c", "a1")), 20.0, "the tree settled")


async def _send(run: Run, sender: str, to: str, subject: str, body: str = "hello", **extra: object) -> list[int]:
    reply = await run.tool(sender, "legion_mail", to=to, subject=subject, body=body, **extra)
    assert reply["ok"], reply
    return [int(m["id"]) for m in reply["details"]["sent"]]


async def test_every_edge_is_delivered_and_confirmed() -> None:
    async with mail_run(SCRIPTS) as run:
        await _tree(run)
        ids = []
        ids += await _send(run, "b", "parent", "child to parent")
        ids += await _send(run, "b", "c", "sibling by name")
        ids += await _send(run, "c", "b", "sibling back")
        squad = await _send(run, "b", "squad", "to my squad", kind="report")
        ids += squad
        ids += await _send(run, "a", "children", "parent to child", urgency="action-needed")
        ids += await _send(run, "a1", "parent", "child to parent, nested")
        ids += await _send(run, "a", "a1", "child by name")
        await delivered(run, ids)
        rows = {int(r["id"]): r for r in run.mail()}
        assert sorted(rows[i]["to_node"] for i in squad) == ["a", "c"]
        assert rows[ids[0]]["to_node"] == "root"
        # the recipient saw the exact envelope as a user message (the confirmation's evidence)
        from legion.orchestration.postman import format_mail
        from legion.workers.transcript import user_texts_last_turns

        assert format_mail(rows[ids[1]]) in user_texts_last_turns(run.node("c").transcript)
        events = [e.type for e in run.ledger.events_after(0, limit=10_000)]
        assert events.count("mail_sent") == len(ids) and events.count("mail_delivered") == len(ids)


async def test_refusals_name_the_code_and_the_fix_and_store_nothing() -> None:
    async with mail_run(SCRIPTS) as run:
        await _tree(run)

        async def refused(sender: str, code: str, **args: object) -> str:
            reply = await run.tool(sender, "legion_mail", **args)
            assert not reply["ok"] and reply["code"] == code, reply
            return str(reply["text"])

        text = await refused("b", "MAIL_CROSS_SUBTREE", to="a1", subject="s", body="x")
        assert "parent root" in text and "squad a, c" in text and "children (none)" in text
        text = await refused("b", "MAIL_UNKNOWN_TARGET", to="zed", subject="s", body="x")
        assert "You can reach" in text
        await refused("b", "MAIL_UNKNOWN_TARGET", to="r2-kid", subject="s", body="x")  # another run's node
        await refused("b", "MAIL_UNKNOWN_TARGET", to="b", subject="s", body="x")  # yourself
        await refused("a1", "MAIL_NO_RECIPIENT", to="children", subject="s", body="x")
        assert "file" in await refused("b", "MAIL_TOO_LARGE", to="parent", subject="s", body="x" * 40_000)
        assert "NUL" in await refused("b", "MAIL_INVALID_TEXT", to="parent", subject="s", body="a\x00b")
        await refused("b", "MAIL_TOO_LARGE", to="parent", subject="s" * 300, body="x")
        await refused("b", "MAIL_INVALID_FIELD", to="parent", subject="s", body="x", kind="instruction")
        await refused("b", "INVALID_PARAMS", to="parent", subject="", body="x")
        assert run.mail() == []
        soft = await run.tool("b", "legion_mail", to="parent", subject="long", body="y" * 5000)
        assert soft["ok"] and "soft limit" in soft["text"]
        for i in range(9):
            await _send(run, "b", "c", f"m{i}")
        text = await refused("b", "MAIL_RATE_LIMITED", to="c", subject="the 11th", body="x")
        assert "Fix:" in text
        assert len(run.mail(from_node="b")) == 10  # nothing lost, nothing extra


async def test_operator_mail_through_the_live_runs_socket() -> None:
    async with mail_run(SCRIPTS) as run:
        await _tree(run)
        write_run_json(run.run_dir, {"runId": "r1", "status": "running", "owner": owner_record()})
        legion = [sys.executable, "-m", "legion", "-C", str(run.cwd)]
        proc = await asyncio.create_subprocess_exec(
            *legion, "mail", "send", "r1", "a1", "--subject", "from the operator", "--body", "hi a1",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ})
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert "→ a1" in out.decode()
        mail = run.mail(to_node="a1")
        assert [m["from_node"] for m in mail] == ["@operator"]
        await delivered(run, [int(mail[0]["id"])])
        proc = await asyncio.create_subprocess_exec(*legion, "mail", "r1", "a1", stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        assert "DELIVERED" in out.decode() and "@operator → a1" in out.decode()
        proc = await asyncio.create_subprocess_exec(*legion, "mail", "send", "r1", "nobody", "--subject", "s",
                                                    "--body", "b", stdout=asyncio.subprocess.PIPE)
        out, _ = await proc.communicate()
        assert proc.returncode == 1 and "MAIL_UNKNOWN_TARGET" in out.decode()


async def test_the_send_itself_wakes_an_idle_recipient() -> None:
    """The backstop sweep runs every 30 s here, so a mail accepted well inside that was delivered because the send
    woke the Postman (bench/mail.py measures how fast: send → injected p50/p99)."""
    async with mail_run(SCRIPTS, interval=30.0) as run:
        await _tree(run)
        (mid,) = await _send(run, "b", "c", "quick")
        await until(lambda: run.mail(id=mid)[0]["state"] == "ACCEPTED", 15.0, "accepted before any backstop sweep")


async def test_legion_tree_scopes_are_read_only_summaries() -> None:
    async with mail_run(SCRIPTS) as run:
        await _tree(run)

        async def names(node: str, **args: object) -> list[str]:
            reply = await run.tool(node, "legion_tree", **args)
            assert reply["ok"], reply
            return sorted(n["name"] for n in reply["details"]["nodes"])

        assert await names("a") == ["a1"]
        assert await names("b", scope="squad") == ["a", "c"]
        assert await names("root", scope="subtree", depth=1) == ["a", "b", "c"]
        assert await names("a1", scope="tree") == ["a", "a1", "b", "c", "root"]
        bad = await run.tool("b", "legion_tree", scope="everything")
        assert not bad["ok"] and bad["code"] == "INVALID_PARAMS"
