"""The legion CLI as a user runs it: a throwaway project with scripted models, subprocesses, poll-until."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any
from unittest import mock

import orjson
import pytest

from tests.support import wait_until

LEGION = [sys.executable, "-m", "legion"]

ROOT_SCRIPT = """\
turns:
  - tool_calls:
      - name: subagent
        arguments: {action: launch, agent: worker, name: w1, task: "do the thing", model: scripted/worker.yaml}
rules:
  - match: "W1 RESULT"
    reply: {text: "all done"}
default:
  tool_calls:
    - name: subagent
      arguments: {action: wait, names: [w1]}
"""

WORKER_SCRIPT = """\
turns:
  - tool_calls:
      - name: bash
        arguments: {command: "sleep %(sleep)s; echo hi"}
default: {text: "W1 RESULT ok"}
"""


@contextmanager
def project(worker_sleep: float = 30.0) -> Iterator[Path]:
    """A temp project (short path: ipc:// limits) with the root and worker scripts (kept with LEGION_TEST_KEEP=1)."""
    path = Path(tempfile.mkdtemp(prefix="lop", dir="/tmp"))
    (path / "root.yaml").write_text(ROOT_SCRIPT)
    (path / "worker.yaml").write_text(WORKER_SCRIPT % {"sleep": worker_sleep})
    try:
        yield path
    finally:
        if not os.environ.get("LEGION_TEST_KEEP"):
            shutil.rmtree(path, ignore_errors=True)


def gate_worker(cwd: Path) -> Path:
    """Make w1's bash call wait until the returned file exists (instead of sleeping): the test decides when w1
    finishes, e.g. only once an observer is attached."""
    release = cwd / "release-w1"
    (cwd / "worker.yaml").write_text(WORKER_SCRIPT.replace("sleep %(sleep)s",
                                                           f"until [ -e {release} ]; do sleep 0.05; done"))
    return release


def env() -> dict[str, str]:
    return {**os.environ, "NO_COLOR": "1", "LEGION_LOG_LEVEL": "ERROR"}


def legion(cwd: Path, *args: str, timeout: float = 60.0, input: str | None = None,
           env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LEGION, "-C", str(cwd), *args], capture_output=True, text=True, timeout=timeout,
                          env={**env(), **(env_extra or {})}, input=input)


def legion_here(cwd: Path | None, capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    """`legion -C CWD ARGS` (`legion ARGS` when `cwd` is None) run in this process through `legion.cli.main`, with
    `env()`'s variables: for commands that start nothing (a refusal, a report, a rebuild), the exit code and output
    are the command's own without an interpreter start each; a run, and what a live run does, go through `legion`."""
    from legion.cli import main

    capsys.readouterr()
    with mock.patch.dict(os.environ, {"NO_COLOR": "1", "LEGION_LOG_LEVEL": "ERROR"}):
        try:
            code = main([*(["-C", str(cwd)] if cwd is not None else []), *args])
        except SystemExit as exc:  # argparse
            code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), code, out.out, out.err)


def start(cwd: Path, *args: str, stdout: IO[str] | None = None) -> subprocess.Popen[str]:
    """`legion ARGS` in the background; its stdout piped, or written to `stdout` (read while it runs)."""
    return subprocess.Popen([*LEGION, "-C", str(cwd), *args], stdout=subprocess.PIPE if stdout is None else stdout,
                            stderr=subprocess.PIPE, text=True, env=env())


def json_lines(text: str) -> list[dict[str, Any]]:
    """The complete lines of a JSON-lines output that may still be being written (a torn last line is left)."""
    return [orjson.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]




def in_transcript(run_dir: Path, name: str, needle: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return needle in (run_dir / f"{name}.jsonl").read_text()
        except OSError:
            return False

    return check


def stop_process(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def live_run(cwd: Path, worker: str = "w1", needle: str = "sleep") -> Path:
    """The run directory of the run started in `cwd`, once its op.sock is up and `worker` is in its tool call."""
    runs = cwd / ".legion" / "runs"
    run_dir: Path = wait_until(lambda: next((d for d in runs.glob("*") if (d / "op.sock").exists()), None),
                               deadline=60, message="the run's op.sock")
    wait_until(in_transcript(run_dir, worker, needle), deadline=60, message=f"{worker} in its {needle} call")
    return run_dir
