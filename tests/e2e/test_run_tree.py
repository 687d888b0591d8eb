"""`legion run`: a root that dispatches three workers with one `tasks[]` call, waits for all, collects, answers.

Checked the way a user sees it: exit 0, the final answer and summary on stdout, one progress line per
lifecycle event on stderr, `legion status --json`, and every transcript opened by the real `pi`.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

from tests.e2e.harness import Project, launch, messages, node_rows, project, subagent, tool_results

pytestmark = pytest.mark.timeout(90)
PI = shutil.which("pi")
WORKERS = ("w1", "w2", "w3")


def pi_messages(transcripts: list[Path], home: Path) -> dict[Path, list[dict[str, Any]]]:
    """The messages the real `pi --mode rpc` loads from each transcript (offline: no model call).

    One pi process serves them all (`switch_session` between them): pi's start-up is most of the cost. pi runs
    the commands of its stdin concurrently, so each command is sent only once the previous one is answered."""
    env = {**os.environ, "HOME": str(home), "PI_OFFLINE": "1"}
    proc = subprocess.Popen([PI or "pi", "--mode", "rpc", "--offline", "--session", str(transcripts[0]),
                             "--no-extensions", "--no-skills", "--no-prompt-templates", "--no-context-files"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=transcripts[0].parent)  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()
    errors: list[str] = []

    def pump(stream: IO[str], into: Callable[[str | None], None]) -> None:
        for line in stream:
            into(line)
        into(None)  # end of stream

    threading.Thread(target=pump, args=(proc.stdout, lines.put), daemon=True).start()
    threading.Thread(target=pump, args=(proc.stderr, lambda line: errors.append(line or "")), daemon=True).start()
    deadline = time.monotonic() + 45

    def ask(command: dict[str, Any]) -> dict[str, Any]:
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(command) + "\n")
        proc.stdin.flush()
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"pi did not answer {command} in time; stderr: {''.join(errors)[-2000:]}") from None
            if line is None:
                raise AssertionError(f"pi exited before answering {command}; stderr: {''.join(errors)[-2000:]}")
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and obj.get("type") == "response" and obj.get("id") == command["id"]:
                assert obj["success"], obj
                return obj

    out: dict[Path, list[dict[str, Any]]] = {}
    try:
        for i, transcript in enumerate(transcripts):
            if i:
                switched = ask({"id": f"s{i}", "type": "switch_session", "sessionPath": str(transcript)})
                assert switched["data"] == {"cancelled": False}, switched
            state = ask({"id": f"t{i}", "type": "get_state"})
            assert Path(state["data"]["sessionFile"]).resolve() == transcript.resolve(), state
            out[transcript] = list(ask({"id": f"m{i}", "type": "get_messages"})["data"]["messages"])
    finally:
        if proc.stdin is not None:
            proc.stdin.close()  # end of input: pi shuts down
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return out


def three_workers(proj: Project) -> str:
    steps = [{"name": n, "agent": "worker", "task": f"compute part {n}",
              "model": proj.script(n, {"text": f"part {n} = {i * 7}"})} for i, n in enumerate(WORKERS, 1)]
    return proj.script("root", launch(*steps), subagent("wait"),
                       *(subagent("collect", name=n) for n in WORKERS), {"text": "final: parts w1=7 w2=14 w3=21"})


@pytest.mark.slow
def test_root_dispatches_three_workers_and_answers() -> None:
    with project() as proj:
        out = proj.run("sum three parts", "--model", three_workers(proj))
        assert out.code == 0, out.explain()
        run = out.run_dir
        # stdout: the root's final text, then the summary; stderr: progress lines
        assert out.stdout.startswith("final: parts w1=7 w2=14 w3=21\n"), out.stdout
        assert f"legion run {run.name}: settled (exit 0)" in out.stdout
        assert all(f"{n} [worker] settled" in out.stdout for n in WORKERS)
        assert f"run directory {run}" in out.stdout
        progress = out.stderr.splitlines()
        assert any("node_settled" in line and " root " in line for line in progress), out.stderr
        assert all(any("node_launched" in line and f" {n} " in line for line in progress) for n in WORKERS)

        # the children's results reached the root: the launch reply, one wait, then each collect
        results = tool_results(run / "root.jsonl")
        assert len(results) == 5
        assert all(f"▶ {n} (worker) on inprocess" in results[0] for n in WORKERS), results[0]
        for i, n in enumerate(WORKERS, 1):
            assert f"part {n} = {i * 7}" in results[1], results[1]
            assert results[1 + i].startswith(f"{n} (worker, scripted/scripts/{n}.yaml): settled, outcome success")
            assert f"part {n} = {i * 7}" in results[1 + i]

        status = proj.cli_json("status", run.name, "--json")
        assert Path(status["run"]) == run
        rows = {row["id"]: row for row in status["nodes"]}
        assert {n: (r["depth"], r["parent_id"], r["status"]) for n, r in rows.items()} == {
            "root": (0, None, "settled"), **{n: (1, "root", "settled") for n in WORKERS}}
        assert rows["root"]["role"] == "root" and all(rows[n]["role"] == "worker" for n in WORKERS)

        # every artifact of a child was delivered (the wait) and consumed (the collect): no notice owed
        with proj.ledger(run) as led:
            assert led.undelivered("root") == []
            arts = {a["node_id"]: a for a in led.list_artifacts()}
            assert set(arts) >= set(WORKERS)
            for i, n in enumerate(WORKERS, 1):
                assert (run / "artifacts" / n / "r1.md").read_text().strip() == f"part {n} = {i * 7}"

        if PI is None:
            pytest.skip("the pi CLI is not installed: transcripts not opened in pi "
                        "(npm install -g @mariozechner/pi-coding-agent)")
        loaded = pi_messages([run / f"{name}.jsonl" for name in ("root", *WORKERS)], proj.dir / "pi-home")
        for name in ("root", *WORKERS):
            ours = [m for m in messages(run / f"{name}.jsonl")]
            theirs = loaded[run / f"{name}.jsonl"]
            assert [m["role"] for m in theirs] == [m["role"] for m in ours], name
            for mine, pis in zip(ours, theirs, strict=True):
                assert pis.get("content") == mine.get("content"), name


def test_json_lines_and_the_exit_statuses() -> None:
    """--json: one JSON object per line, the summary last; a failed root is exit 1, --timeout is exit 1."""
    with project() as proj:
        out = proj.run("hello", "--model", proj.script("ok", {"text": "hi there"}), "--json")
        assert out.code == 0, out.explain()
        lines = [json.loads(line) for line in out.stdout.splitlines()]
        assert lines[-1] == out.summary and out.summary["status"] == "settled" and out.summary["exit_code"] == 0
        assert out.summary["final_text"] == "hi there" and out.summary["run_dir"] == str(out.run_dir)
        assert [n["node"] for n in out.summary["nodes"]] == ["root"]
        assert ("node_launched", "root") in [(e["type"], e.get("node")) for e in lines]

        failed = proj.run("fail", "--model", proj.script("bad", {"error": "the model is down"}), "--json")
        assert failed.code == 1 and failed.summary["status"] == "failed", failed.explain()

        slow = proj.run("hang", "--model", proj.script("hang", {"hang": True}), "--timeout", "1", "--json")
        assert slow.code == 1 and slow.summary["status"] == "timeout", slow.explain()
        assert node_rows(slow.run_dir)["root"]["status"] == "retired"  # paused at the end, resumable
