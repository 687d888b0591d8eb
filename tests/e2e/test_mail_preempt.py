"""Wait/collect preemption (docs/spec-conformance.md §6.6): mail for a parent blocked in `subagent wait` arrives in the tool
result, so it can answer before the child settles; a discarded result is redelivered with `Redelivered: `."""

from __future__ import annotations

import asyncio

import pytest
import yaml

from legion.orchestration.actions import _mail_hold
from tests.e2e.mail_harness import LEAD_CARD, Run, delivered, mail_run
from tests.support import until

ROOT = {
    "rules": [{"match": r"\[legion mail #\d+\] from kid", "on": "toolResult",
               "reply": {"tool_calls": [{"name": "subagent", "arguments": {
                   "action": "steer", "name": "kid", "message": "ANSWER: 42"}}]}}],
    "turns": [
        {"tool_calls": [{"name": "subagent", "arguments": {"action": "launch", "agent": "worker", "name": "kid",
                                                           "task": "ask", "model": "scripted/kid.yaml"}}]},
        {"tool_calls": [{"name": "subagent", "arguments": {"action": "wait", "timeoutMs": 60000}}]},
        "(the rule answers here)",
        {"tool_calls": [{"name": "subagent", "arguments": {"action": "wait", "timeoutMs": 60000}}]},
    ],
    "default": {"text": "root done"}}
KID = {
    "rules": [{"match": "ANSWER: 42", "on": "user", "reply": {"text": "got the answer 42"}}],
    "turns": [  # the test opens gate1 once its parent is blocked in wait, gate2 once the answer is on its way
        {"tool_calls": [{"name": "bash", "arguments": {"command": "while [ ! -e gate1 ]; do sleep 0.02; done"}}]},
        {"tool_calls": [{"name": "legion_mail", "arguments": {"to": "parent", "subject": "question",
                                                               "body": "what is the answer?", "kind": "question",
                                                               "urgency": "action-needed"}}]},
        {"tool_calls": [{"name": "bash", "arguments": {"command": "while [ ! -e gate2 ]; do sleep 0.02; done"}}]},
    ],
    "default": {"text": "never answered"}}


async def test_a_waiting_parent_answers_its_childs_question_before_the_child_settles() -> None:
    async with mail_run({"root.yaml": ROOT, "kid.yaml": KID}) as run:
        from legion.workers.transcript import read_transcript

        await until(lambda: run.node("root").mail.hold is not None, 30.0, "the root blocked in wait")
        (run.cwd / "gate1").touch()
        await until(lambda: "steer → kid" in str(read_transcript(run.node("root").transcript).entries), 30.0,
                    "the root's answer steered into the working kid")
        (run.cwd / "gate2").touch()
        await until(lambda: run.orch.tree.get("root") is not None and run.node("root").status == "settled"
                    and run.orch.tree.get("kid") is not None and run.node("kid").status == "settled",
                    30.0, "root and kid settled")
        assert run.node("kid").final_text == "got the answer 42"  # the steer reached it while it still ran
        (question,) = run.mail(from_node="kid")
        assert question["state"] == "ACCEPTED"  # merged into a tool result: never a user message
        texts = [str(e) for e in read_transcript(run.node("root").transcript).entries]
        assert any(f"[legion mail #{question['id']}] from kid" in t and "toolResult" in t for t in texts)
        assert run.node("root").mail.hold is None  # released


@pytest.mark.parametrize("how", ["cancelled", "failed"])
async def test_a_discarded_result_redelivers_with_the_prefix_and_releases_the_hold(how: str) -> None:
    scripts = {"root.yaml": {"turns": [{"tool_calls": [{"name": "subagent", "arguments": {
        "action": "launch", "agent": "worker", "name": "kid", "task": "x", "model": "scripted/idle.yaml"}}]}],
        "default": {"text": "noted"}}, "idle.yaml": {"default": {"text": "ok"}}}
    async with mail_run(scripts) as run:
        await until(lambda: run.orch.tree.get("kid") is not None and run.node("kid").status == "settled"
                    and run.node("root").status == "settled", 20.0, "settled")
        taken = asyncio.Event()

        async def blocked(run: Run) -> None:
            async with _mail_hold(run.orch, run.node("root")) as hold:
                await until(hold.poll, 10.0, "mail taken", await_result=True)
                taken.set()
                if how == "failed":
                    raise RuntimeError("the result could not be sent")
                await asyncio.sleep(60)

        task = asyncio.ensure_future(blocked(run))
        await until(lambda: run.node("root").mail.hold is not None, 5.0, "the hold")
        reply = await run.tool("kid", "legion_mail", to="parent", subject="q", body="b")
        first = int(reply["details"]["sent"][0]["id"])
        await asyncio.wait_for(taken.wait(), 10.0)
        assert run.mail(id=first)[0]["state"] == "ACCEPTED"
        if how == "cancelled":
            task.cancel()
        with pytest.raises((asyncio.CancelledError, RuntimeError)):
            await task
        assert run.node("root").mail.hold is None
        again = await until(lambda: [m for m in run.mail(to_node="root") if m["id"] != first], 10.0, "requeued")
        assert again[0]["subject"] == "Redelivered: q" and again[0]["body"] == "b"
        await delivered(run, [int(again[0]["id"])])  # the normal way now: the hold is gone


ROOT_BUSY = {
    "turns": [
        {"tool_calls": [{"name": "subagent", "arguments": {"action": "launch", "agent": "worker", "name": "kid",
                                                           "task": "report", "model": "scripted/kid.yaml"}}]},
        # one batch: the kid's mail is steered in during the bash call and queued for the boundary after the batch;
        # the wait that follows in the same batch must not sit on it until the kid settles
        {"tool_calls": [{"name": "bash", "arguments": {"command": "while [ ! -e gate1 ]; do sleep 0.02; done"}},
                        {"name": "subagent", "arguments": {"action": "wait", "timeoutMs": 60000}}]},
        {"tool_calls": [{"name": "subagent", "arguments": {"action": "wait", "timeoutMs": 60000}}]},
    ],
    "default": {"text": "root done"}}
KID_REPORTING = {
    "turns": [  # gate0: the test opens it once the root runs its bash call
        {"tool_calls": [{"name": "bash", "arguments": {"command": "while [ ! -e gate0 ]; do sleep 0.02; done"}}]},
        {"tool_calls": [{"name": "legion_mail", "arguments": {"to": "parent", "subject": "status", "body": "halfway",
                                                               "kind": "report", "urgency": "action-needed"}}]},
        {"tool_calls": [{"name": "bash", "arguments": {"command": "while [ ! -e gate2 ]; do sleep 0.02; done"}}]},
    ],
    "default": {"text": "kid done"}}


@pytest.mark.parametrize("urgency", ["action-needed", "info"])  # queued as a steer, or as a follow-up
async def test_mail_queued_in_the_session_as_it_blocks_in_wait_goes_into_the_wait_result(urgency: str) -> None:
    from legion.orchestration.postman import format_mail
    from legion.workers.transcript import read_transcript

    card = LEAD_CARD.replace("name: lead", "name: busylead").replace("legion_tree]", "legion_tree, bash]")
    kid = yaml.safe_load(yaml.safe_dump(KID_REPORTING))
    kid["turns"][1]["tool_calls"][0]["arguments"]["urgency"] = urgency
    async with mail_run({"root.yaml": ROOT_BUSY, "kid.yaml": kid}, root_agent="busylead",
                        cards={"busylead": card}) as run:
        root = run.node("root")

        def root_in_bash() -> bool:
            track = run.node("root").mail.track
            return track is not None and any(tool == "bash" for tool, _ in track.tools.values())

        await until(root_in_bash, 30.0, "the root in its bash call")
        (run.cwd / "gate0").touch()
        (report,) = await until(lambda: [m for m in run.mail(from_node="kid") if m["state"] == "ACCEPTED"], 30.0,
                                "the kid's mail handed to the root's running session")
        # queued for the boundary after the bash + wait batch (the postman notes it once the ACCEPTED write is back)
        await until(lambda: list(root.mail.queued) == [report["id"]], 30.0, "the mail noted as queued")
        (run.cwd / "gate1").touch()
        envelope = format_mail(report)

        def texts(role: str) -> list[str]:
            messages = [e["message"] for e in read_transcript(run.node("root").transcript).entries
                        if e.get("type") == "message" and e["message"].get("role") == role]
            return ["".join(c.get("text", "") for c in m["content"]) for m in messages]

        def results() -> list[str]:
            return [t for t in texts("toolResult") if envelope in t]

        await until(results, 30.0, "the wait returned with the mail while the kid still works")
        assert run.node("kid").live  # the wait did not sit on the mail until the kid settled
        (run.cwd / "gate2").touch()
        await until(lambda: run.node("root").status == "settled" and run.node("kid").status == "settled", 30.0,
                    "root and kid settled")
        assert [t for t in texts("user") if envelope in t] == [] and len(results()) == 1  # taken back from the queue: it went in once, in the result
        assert run.mail(id=report["id"])[0]["state"] == "ACCEPTED"  # as any mail merged into a tool result
        assert root.mail.queued == {} and root.mail.hold is None
