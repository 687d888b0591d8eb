"""A project on disk for the end-to-end tests: scripts, settings, cards, and `legion run` as a user runs it.

Every run is a real `legion run` subprocess (the installed console script) in a short /tmp directory (ipc://
socket paths are limited to ~107 bytes); results are read back the way a user or CI would: the process's
exit status and output, `legion status --json` / `legion events --json`, the run directory and its ledger.
Every `--json` run's stdout and every `legion events --json` is checked against docs/events.md's schemas
(`tests/events_schema.py`): the e2e suite's events are the schema's test data.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from legion.ledger import open_ledger
from legion.ledger.ledger import Ledger
from legion.workers.transcript import context_messages, read_transcript, text_of
from tests.events_schema import check_events, json_lines

LEGION = str(Path(sys.executable).with_name("legion"))
NOTICE_FIRST_LINE = "▣ legion · automatic completion notice"


def call(name: str, arguments: dict[str, Any], call_id: str | None = None) -> dict[str, Any]:
    """One tool call of a scripted turn."""
    out: dict[str, Any] = {"name": name, "arguments": arguments}
    if call_id:
        out["id"] = call_id
    return out


def tools(*calls: dict[str, Any]) -> dict[str, Any]:
    """A scripted turn that makes these tool calls."""
    return {"tool_calls": list(calls)}


def launch(*tasks: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A scripted turn: one `subagent launch` with `tasks[]`."""
    return tools(call("subagent", {"action": "launch", "tasks": list(tasks), **extra}))


def subagent(action: str, **arguments: Any) -> dict[str, Any]:
    """A scripted turn: one `subagent` call."""
    return tools(call("subagent", {"action": action, **arguments}))


@dataclass
class Outcome:
    """A finished `legion run`."""

    code: int
    stdout: str
    stderr: str
    run_dir: Path

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every event a `--json` run printed (docs/events.md): `run_started`, the stream, `result`."""
        return json_lines(self.stdout)

    @property
    def summary(self) -> dict[str, Any]:
        """The `result` event, the last line of a `--json` run."""
        events = self.events
        if events and events[-1].get("type") == "result":
            return events[-1]
        raise AssertionError(f"no result line at the end of stdout:\n{self.explain()}")

    @property
    def stream(self) -> list[dict[str, Any]]:
        """The events a `--json` run printed between `run_started` and `result` (the monitor stream)."""
        return [e for e in self.events if e.get("type") not in ("run_started", "result")]

    def explain(self) -> str:
        log = self.run_dir / "legion.log"
        tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no legion.log)"
        return f"exit {self.code}\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}\nlegion.log:\n{tail}"


@dataclass
class Project:
    """A temporary project directory with its scripts, settings and cards."""

    dir: Path
    env: dict[str, str] = field(default_factory=dict)
    _runs: int = 0

    # ----- files ----------------------------------------------------------------------------------
    def script(self, name: str, *turns: Any, default: Any = None, rules: list[dict[str, Any]] | None = None) -> str:
        """Write scripts/<name>.yaml and return its model string (`scripted/scripts/<name>.yaml`)."""
        data: dict[str, Any] = {"turns": list(turns)}
        if default is not None:
            data["default"] = default
        if rules:
            data["rules"] = rules
        path = self.dir / "scripts" / f"{name}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
        return f"scripted/scripts/{name}.yaml"

    def settings(self, data: dict[str, Any]) -> None:
        path = self.dir / ".legion" / "settings.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=2))

    def card(self, name: str, body: str = "You are a test agent.", **frontmatter: Any) -> None:
        """A project role card .legion/agents/<name>.md."""
        path = self.dir / ".legion" / "agents" / f"{name}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        head = yaml.safe_dump({"name": name, "description": f"e2e test card {name}", **frontmatter},
                              sort_keys=False)
        path.write_text(f"---\n{head}---\n{body}\n")

    # ----- running --------------------------------------------------------------------------------
    def next_run_id(self) -> str:
        self._runs += 1
        return f"e2e-{self._runs}"

    def _env(self, extra: dict[str, str] | None) -> dict[str, str]:
        return {**os.environ, **self.env, **(extra or {})}

    def run(self, task: str, *args: str, run_id: str | None = None, timeout: float = 60,
            env: dict[str, str] | None = None, stdin: str | None = None) -> Outcome:
        """`legion run TASK ARGS…` to its end."""
        run_id = run_id or self.next_run_id()
        proc = subprocess.run([LEGION, "run", task, "--run-id", run_id, *args], cwd=self.dir, env=self._env(env),
                              capture_output=True, text=True, timeout=timeout, input=stdin)
        out = Outcome(proc.returncode, proc.stdout, proc.stderr, self.run_path(run_id))
        if "--json" in args or "--output-format" in args:
            check_events(out.events, f"legion run {run_id}")
        return out

    def start(self, task: str, *args: str, run_id: str | None = None,
              env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], Path]:
        """`legion run` in the background; (process, run directory)."""
        run_id = run_id or self.next_run_id()
        proc = subprocess.Popen([LEGION, "run", task, "--run-id", run_id, *args], cwd=self.dir, env=self._env(env),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        return proc, self.run_path(run_id)

    def cli(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Another `legion` command in this project."""
        return subprocess.run([LEGION, *args], cwd=self.dir, env=self._env(None), capture_output=True, text=True,
                              timeout=timeout)

    def cli_json(self, *args: str) -> Any:
        proc = self.cli(*args)
        assert proc.returncode == 0, f"legion {' '.join(args)}: exit {proc.returncode}\n{proc.stderr}"
        return json.loads(proc.stdout)

    def events(self, run: Path) -> list[dict[str, Any]]:
        """`legion events RUN --json` (every event of the run)."""
        proc = self.cli("events", str(run), "--json", "--limit", "100000")
        assert proc.returncode == 0, proc.stderr
        events = json_lines(proc.stdout)
        check_events(events, f"legion events {run.name}")
        return events

    def run_path(self, run_id: str) -> Path:
        return self.dir / ".legion" / "runs" / run_id

    @contextlib.contextmanager
    def ledger(self, run: Path) -> Iterator[Ledger]:
        led = open_ledger(run / "legion.db")
        try:
            yield led
        finally:
            led.close()


@contextlib.contextmanager
def project() -> Iterator[Project]:
    """A fresh project directory under /tmp (short: ipc socket paths), removed afterwards unless LEGION_TEST_KEEP is
    set (to read a failed run's transcripts and logs)."""
    path = Path(tempfile.mkdtemp(prefix="le2e", dir="/tmp"))
    try:
        yield Project(path, env={"LEGION_LOG_LEVEL": "WARNING"})
    finally:
        if os.environ.get("LEGION_TEST_KEEP"):
            print(f"kept the project directory {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)




def node_rows(run: Path) -> dict[str, dict[str, Any]]:
    """The run's node rows by id, read straight from its ledger (empty when there is no ledger yet)."""
    if not (run / "legion.db").exists():
        return {}
    try:
        led = open_ledger(run / "legion.db")
    except Exception:
        return {}
    try:
        return {row["id"]: row for row in led.list_nodes()}
    finally:
        led.close()


def launched_pids(run: Path) -> dict[str, int]:
    """Each node's pid in its latest node_launched event, read straight from the ledger: in a test that must
    act while a child is still at work, a `legion events` process (seconds to start when the machine is
    loaded) would outlast the work."""
    if not (run / "legion.db").exists():
        return {}
    led = open_ledger(run / "legion.db")
    try:
        return {e.node_id: e.data["pid"] for e in led.events_after(0, limit=100_000)
                if e.type == "node_launched" and e.node_id is not None}
    finally:
        led.close()


def kill_tree(proc: subprocess.Popen[str]) -> None:
    """Clean-up for a test that failed half-way: the run's process group and everything under it."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(psutil.Error):
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(5)


def messages(transcript: Path) -> list[dict[str, Any]]:
    """The LLM context of a transcript (its leaf path)."""
    return context_messages(read_transcript(transcript).leaf_path())


def tool_results(transcript: Path, tool: str = "subagent") -> list[str]:
    """The text of each result of `tool` in a transcript, in order."""
    return [text_of(m) for m in messages(transcript) if m.get("role") == "toolResult" and m.get("toolName") == tool]


def user_texts(transcript: Path) -> list[str]:
    return [text_of(m) for m in messages(transcript) if m.get("role") == "user"]


def final_text(transcript: Path) -> str:
    last = [m for m in messages(transcript) if m.get("role") == "assistant"]
    return text_of(last[-1]) if last else ""



def until_recorded(run_id: str, names: list[str]) -> str:
    """A bash command (for a scripted `bash` tool call) that returns once every one of `names` has its first
    artifact: the caller stays busy until those children's results exist. (The root writes an artifact's file
    and its ledger row in one synchronous step, so no settle is processed between the two; a session may not
    read legion.db itself — its guard refuses.)"""
    files = " && ".join(f"[ -f .legion/runs/{run_id}/artifacts/{n}/r1.md ]" for n in names)
    return f"until {files}; do sleep 0.02; done; echo recorded"
