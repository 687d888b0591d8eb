"""`legion run` and `legion resume` off a terminal (CI): besides a line per lifecycle event, a `progress` line on
stderr every `--progress-every` seconds while a node is live — nodes live and settled, tokens, cost, elapsed — so a
long model call or tool call is not silence. w1's bash call is gated (`gate_worker`): the lines are awaited while it
is live, then the test lets it finish."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.integration.cli_support import LEGION, env, gate_worker, legion, project, stop_process
from tests.support import wait_until

GATED = """\
  - tool_calls:
      - name: bash
        arguments: {{command: "until [ -e {release} ]; do sleep 0.05; done"}}
"""
# the pause cuts w1's first gated call (its transcript then holds that call and an aborted turn): the resumed w1's
# next turn is the script's third, gated as well
GATED_THRICE = "turns:\n" + GATED * 3 + 'default: {{text: "W1 RESULT ok"}}\n'

PROGRESS = re.compile(r"^ *\d+\.\d\ds progress +(\d+) live, (\d+) settled, (\d+) failed · (\d+) tok · "
                      r"\$\d+\.\d{4}(\+\?)? · elapsed (\d+):(\d\d)$")


def _start(cwd: Path, err: Path, *args: str) -> subprocess.Popen[str]:
    """`legion ARGS` with stderr to a file (not a terminal: the plain view), read while it runs."""
    with err.open("w") as stream:
        return subprocess.Popen([*LEGION, "-C", str(cwd), *args], stdout=subprocess.PIPE, stderr=stream, text=True,
                                env=env())


def _progress(err: Path) -> list[re.Match[str]]:
    return [m for line in err.read_text().splitlines() if (m := PROGRESS.match(line))]


def _two_live_lines(err: Path) -> list[re.Match[str]] | None:
    """At least two progress lines while root and w1 are both live (w1 in its gated call)."""
    lines = [m for m in _progress(err) if m.group(1) == "2"]
    return lines if len(lines) >= 2 else None


@pytest.mark.timeout(120)
def test_run_off_a_terminal_prints_progress_lines_while_nodes_are_live(tmp_path: Path) -> None:
    with project() as cwd:
        release = gate_worker(cwd)
        err = tmp_path / "stderr"
        proc = _start(cwd, err, "run", "--model", "scripted/root.yaml", "--progress-every", "1", "task")
        try:
            lines = wait_until(lambda: _two_live_lines(err), deadline=60, message="two progress lines, 2 live")
            release.touch()
            out, _ = proc.communicate(timeout=60)
        finally:
            stop_process(proc)
        assert proc.returncode == 0, err.read_text() + out
        for m in lines:
            assert int(m.group(4)) > 0  # the root's first turn is counted (scripted usage)
        elapsed = [int(m.group(6)) * 60 + int(m.group(7)) for m in lines]
        assert elapsed == sorted(elapsed) and elapsed[-1] >= 1
        assert "progress" not in out  # stdout carries the answer and the summary only
        assert "all done" in out


@pytest.mark.timeout(150)
def test_resume_off_a_terminal_prints_progress_lines_too(tmp_path: Path) -> None:
    with project() as cwd:
        release = cwd / "release-w1"
        (cwd / "worker.yaml").write_text(GATED_THRICE.format(release=release))
        first = _start(cwd, tmp_path / "run.err", "run", "--run-id", "pr1", "--model", "scripted/root.yaml",
                       "--progress-every", "0", "task")
        try:
            wait_until(lambda: (cwd / ".legion/runs/pr1/w1.jsonl").exists()
                       and '"bash"' in (cwd / ".legion/runs/pr1/w1.jsonl").read_text(),
                       deadline=60, message="w1 in its gated bash call")
            assert legion(cwd, "stop", "pr1", "--all").returncode == 0
            assert first.wait(30) == 130
        finally:
            stop_process(first)
        assert not _progress(tmp_path / "run.err")  # 0 turns them off
        err = tmp_path / "resume.err"
        resumed = _start(cwd, err, "resume", "pr1", "--all", "--progress-every", "1")
        try:
            wait_until(lambda: _two_live_lines(err), deadline=60, message="two progress lines of the resumed run")
            release.touch()
            out, _ = resumed.communicate(timeout=60)
        finally:
            stop_process(resumed)
        assert resumed.returncode == 0, err.read_text() + out
        assert "all done" in out


def test_the_plain_views_progress_line_and_its_setting() -> None:
    """The line counts agents by state (infrastructure left out) and is absent with nothing live; 0 starts no
    progress thread; a bad `--progress-every` is refused."""
    import argparse
    import io

    from legion.cli.progress import LineView, progress_seconds

    view = LineView(io.StringIO(), progress_every=0)
    try:
        assert view._ticker is None
        assert view.progress_line() is None
        view.event("node_status", {"node_id": "pool", "status": "running", "infra": True})
        for node, status in (("root", "running"), ("w1", "settled"), ("w2", "failed")):
            view.event("agent_launched", {"node_id": node, "role": "worker", "model": "scripted/x"})
            view.event("node_status", {"node_id": node, "status": status})
        view.event("usage", {"node_id": "w1", "turns": 1, "input": 100, "output": 20, "costUsd": 0.5})
        line = view.progress_line()
        assert line is not None and PROGRESS.match(f"   1.00s {line}"), line
        assert "1 live, 1 settled, 1 failed · 120 tok · $0.5000 · elapsed 0:0" in line
    finally:
        view.close()
    assert progress_seconds("2.5") == 2.5 and progress_seconds("0") == 0
    for bad in ("-1", "nan", "inf", "soon"):
        with pytest.raises(argparse.ArgumentTypeError):
            progress_seconds(bad)
