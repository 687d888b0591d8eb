"""A team paused mid-implementing by SIGINT, resumed by `legion resume`, completes (issue 12): one run, the
transcripts continue, the phase machine goes on from `implementing` to `done` and the branch is delivered.

The scripts answer by rules on the latest message (not by turn count), so they behave the same whether a
run was cut or not."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import orjson
import yaml

from legion.ledger import open_ledger
from tests.integration.cli_support import in_transcript, legion, start, stop_process
from tests.support import wait_until

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e.x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e.x"}


def _call(tool: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": tool, "arguments": arguments}]}


def _rule(match: str, reply: dict[str, Any], on: str = "any") -> dict[str, Any]:
    return {"match": match, "on": on, "reply": reply}


def _model(name: str) -> str:
    return f"scripted/scripted/{name}.yaml"


SCRIPTS: dict[str, Any] = {
    "root": {"turns": [_call("subagent", action="launch", agent="centurion", name="alpha", task="write a.txt",
                             model=_model("alpha"), phases="default"), {"text": "waiting for alpha"}],
             "rules": [_rule("do not resume yourself", {"text": "noted, waiting for alpha"}),
                       _rule("DELIVERED", {"text": "root done"})],
             "default": {"text": "root: ok"}},
    "alpha": {"turns": [
        _call("bash", command="printf '# Contract\\n\\n```legion-verify\\ntest -f a.txt\\n```\\n' > CONTRACT.md"),
        _call("legion_phase", to="implementing", evidence="CONTRACT.md"),
        _call("subagent", action="launch", agent="worker", name="w1", task="write a.txt", model=_model("w1")),
        {"text": "waiting for w1"}],
        "rules": [_rule("resumed this run after a pause", {"text": "resumed; waiting for w1"}, on="user"),
                  _rule("W1 WROTE", {"tool_calls": [{"name": "legion_phase", "arguments": {"to": "reviewing"}}]},
                        on="user"),
                  _rule("→ 'reviewing'", _call("subagent", action="launch", agent="reviewer", name="r1",
                                                task="review", model=_model("r1")), on="toolResult"),
                  _rule("▶ r1 ", _call("subagent", action="wait", names=["r1"]), on="toolResult"),
                  _rule('"ok": true', _call("legion_phase", to="verifying"), on="toolResult"),
                  _rule("→ 'verifying'", {"text": "verification requested"}, on="toolResult"),
                  _rule("team is DONE", _call("bash", command=(
                      "git add -A && git reset -q --soft $(git merge-base HEAD main) && git commit -qm a "
                      "&& git rev-parse HEAD")), on="user"),
                  _rule("^[0-9a-f]{40}", {"text": "DELIVERED a.txt"}, on="toolResult")],
        "default": {"text": "alpha: ok"}},
    "w1": {"turns": [_call("bash", command="sleep 60")],
           "rules": [_rule("restarted|aborted before completion|resumed this run",
                           _call("bash", command="printf 'A\\n' > a.txt"))],
           "default": {"text": "W1 WROTE a.txt"}},
    "r1": {"turns": [{"text": 'Looks right.\n\n```legion-verdict\n{"ok": true, "summary": "fine", "issues": []}\n```'}]},
}


def _project(base: Path) -> Path:
    root = base / "p"
    (root / "scripted").mkdir(parents=True)
    for name, script in SCRIPTS.items():
        (root / "scripted" / f"{name}.yaml").write_text(yaml.safe_dump(script, sort_keys=False, width=1000))
    (root / ".gitignore").write_text(".legion/\n")
    env = {**os.environ, **GIT_ENV}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "init"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, env=env)
    return root


def _node(run_dir: Path, name: str) -> dict[str, Any]:
    with open_ledger(run_dir / "legion.db") as led:
        return led.get_node(name) or {}


def test_a_team_paused_mid_implementing_resumes_and_delivers(tmp_path: Path) -> None:
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="lrt", dir="/tmp"))  # ipc paths must stay short
    try:
        cwd = _project(base)
        os.environ.update(GIT_ENV)  # the CLI subprocesses inherit it (commits without a git identity)
        proc = start(cwd, "run", "--run-id", "t1", "--model", _model("root"), "build it")
        run_dir = cwd / ".legion" / "runs" / "t1"
        try:
            wait_until(in_transcript(run_dir, "w1", "sleep 60"), message="w1 working (mid-implementing)", deadline=30.0)
            # alpha's own run (launch w1, then "waiting for w1") may still be going: the pause would retire it
            wait_until(lambda: _node(run_dir, "alpha")["status"] == "settled", message="alpha idle, waiting for w1", deadline=30.0)
            assert _node(run_dir, "alpha")["phase"] == "implementing"
            # alpha's settling sends the root a completion notice: the root answers it ("root: ok") and goes idle
            wait_until(in_transcript(run_dir, "root", "root: ok"), message="the root answered alpha's notice", deadline=30.0)
            wait_until(lambda: _node(run_dir, "root")["status"] == "settled", message="root idle", deadline=30.0)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 130
        finally:
            stop_process(proc)
        with open_ledger(run_dir / "legion.db") as led:
            # the pause retires the running worker; idle sessions keep their settled rows (lifecycle.py), phases
            # are untouched
            assert {n["id"]: (n["status"], n["phase"]) for n in led.list_nodes()} == {
                "root": ("settled", None), "alpha": ("settled", "implementing"), "w1": ("retired", None)}
        w1_before = (run_dir / "w1.jsonl").read_text()
        resumed = legion(cwd, "resume", "t1", "--all", timeout=90)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        assert "alpha (centurion) settled, phase implementing" in resumed.stdout
        assert [p.name for p in (cwd / ".legion" / "runs").iterdir()] == ["t1"]
        assert (run_dir / "w1.jsonl").read_text().startswith(w1_before)  # the same transcript, continued
        assert not list(run_dir.glob("*.2.jsonl"))
        with open_ledger(run_dir / "legion.db") as led:
            alpha = led.get_node("alpha")
            moves = [(e.data["from"], e.data["to"]) for e in led.events_after(0, node_id="alpha", limit=1000)
                     if e.type == "phase_change" and "from" in e.data and "rejected" not in e.data]
        assert alpha["phase"] == "done"
        assert moves == [("planning", "implementing"), ("implementing", "reviewing"), ("reviewing", "verifying"),
                         ("verifying", "done")]
        summary = orjson.loads(legion(cwd, "summary", "t1", "--json").stdout)
        branch = {n["name"]: n for n in summary["nodes"]}["alpha"]["branch"]
        files = subprocess.run(["git", "-C", str(cwd), "ls-tree", "-r", "--name-only", branch], capture_output=True,
                               text=True, check=True).stdout.split()
        assert "a.txt" in files
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
