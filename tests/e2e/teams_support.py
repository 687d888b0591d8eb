"""Helpers for the teams end-to-end tests and bench/teams.py: a real git project with scripted models.

`project(tmp, scripts)` makes a git repository whose first commit holds `scripted/<name>.yaml` for every
script (so a centurion's worktree has them too: a scripted model path is relative to the session cwd);
`run(project)` runs `legion run` in-process with the root session on `scripted/scripted/root.yaml` (`ledger=URL`:
recording into PostgreSQL).
The `*_script` builders write the default machine's happy path and its variations.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from legion.agents.verdict import Verdict, VerdictIssue, format_verdict
from legion.orchestration.run import RunOptions, RunResult, execute, prepare_run

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e.x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e.x"}


def git(cwd: Path, *args: str) -> str:
    import os

    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_ENV}).stdout.strip()


def project(tmp: Path, scripts: dict[str, Any], settings: dict[str, Any] | None = None) -> Path:
    root = tmp / "p"
    (root / "scripted").mkdir(parents=True)
    for name, script in scripts.items():
        (root / "scripted" / f"{name}.yaml").write_text(yaml.safe_dump(script, sort_keys=False))
    (root / ".gitignore").write_text(".legion/\n")
    if settings:
        (root / ".legion").mkdir()
        (root / ".legion" / "settings.json").write_text(json.dumps(settings))
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "init")
    return root


def model(name: str) -> str:
    return f"scripted/scripted/{name}.yaml"


def run(root: Path, task: str = "build it", *, timeout: float = 60.0, ledger: str | None = None) -> RunResult:
    """The run, recording into its own legion.db, or into the PostgreSQL database `ledger` names."""
    import os

    opts = RunOptions(task=task, cwd=root, model=model("root"), timeout=timeout, env={**os.environ, **GIT_ENV},
                      ledger=ledger)
    return asyncio.run(execute(prepare_run(opts), install_signals=False))


def call(tool_name: str, /, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": tool_name, "arguments": arguments}]}


def bash(command: str) -> dict[str, Any]:
    return call("bash", command=command)


def phase(to: str, **extra: Any) -> dict[str, Any]:
    return call("legion_phase", to=to, **extra)


def launch(*tasks: tuple[str, str, str, str]) -> dict[str, Any]:
    """subagent launch of (agent, name, task, script) steps."""
    return call("subagent", action="launch",
                tasks=[{"agent": a, "name": n, "task": t, "model": model(s)} for a, n, t, s in tasks])


def wait(*names: str) -> dict[str, Any]:
    return call("subagent", action="wait", **({"names": list(names)} if names else {}))


CONTRACT = ("# Contract\\n\\nw1 owns a.txt, w2 owns b.txt.\\n\\n```legion-verify\\n{commands}\\n```\\n")


def write_contract(commands: list[str]) -> dict[str, Any]:
    body = CONTRACT.format(commands="\\n".join(commands))
    return bash(f"printf '{body}' > CONTRACT.md")


def worker_script(file: str, text: str) -> dict[str, Any]:
    return {"turns": [bash(f"printf '{text}\\n' > {file}"), {"text": f"wrote {file}"}]}


def failing_worker() -> dict[str, Any]:
    return {"turns": [{"error": "the model failed"}], "default": {"error": "the model failed"}}


def reviewer_script(*oks: bool) -> dict[str, Any]:
    """One verdict per review round (a relaunched reviewer continues its script)."""
    turns = []
    for ok in oks:
        issues = () if ok else (VerdictIssue("b.txt is wrong", "blocker", "b.txt", 1),)
        turns.append({"text": "Review done.\n\n" + format_verdict(Verdict(ok, "looks right" if ok else "no",
                                                                           issues))})
    return {"turns": turns}


def root_script() -> dict[str, Any]:
    return {"turns": [call("subagent", action="launch", agent="centurion", name="alpha", task="build a and b",
                           model=model("centurion"), phases="default"),
                      wait("alpha"), call("subagent", action="collect", name="alpha"),
                      {"text": "root: the team reported"}],
            "default": {"text": "root: noted"}}


VERIFY = ["test -f a.txt", "test -f b.txt", "grep -q A a.txt"]


def centurion_happy(verify: list[str] | None = None) -> dict[str, Any]:
    return {"turns": [
        write_contract(VERIFY if verify is None else verify),
        phase("implementing", evidence="CONTRACT.md"),
        launch(("worker", "w1", "write a.txt", "w1"), ("worker", "w2", "write b.txt", "w2")),
        wait(),
        phase("reviewing"),
        launch(("reviewer", "r1", "review a and b", "r1")),
        wait("r1"),
        phase("verifying"),
        {"text": "verification requested"},
        bash("git add -A && git reset -q --soft $(git merge-base HEAD main) && git commit -qm 'team alpha: a and b'"
             " && git rev-parse HEAD"),
        {"text": "delivered"},
    ], "default": {"text": "centurion: nothing more"}}


def happy_scripts(verify: list[str] | None = None) -> dict[str, Any]:
    return {"root": root_script(), "centurion": centurion_happy(verify), "w1": worker_script("a.txt", "A"),
            "w2": worker_script("b.txt", "B"), "r1": reviewer_script(True)}
