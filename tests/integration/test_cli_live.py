"""The live view under a real pseudo-terminal (tmux): the tree with status, model, turns, tokens, cost and elapsed
per node while the run works; colours only without NO_COLOR; plain lines when stderr is not a terminal."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.integration.cli_support import legion, project
from tests.support import TmuxPane, wait_until

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux for a real pseudo-terminal")


def _live_screen(cwd: Path, env: str) -> tuple[str, str]:
    # pytest exports COLUMNS/LINES (80x24), which rich would prefer over the pane's real size
    command = (f"unset COLUMNS LINES; cd {cwd} && {env} {sys.executable} -m legion run --model scripted/root.yaml task; "
               "echo EXITED=$?; sleep 30")
    with TmuxPane(command, 150, 30) as pane:
        def running() -> str:
            screen = pane.capture()
            return screen if _counted(screen) else ""

        # (on a loaded machine the first frame with w1 running may come before its first usage event)
        screen = wait_until(running, deadline=60, message="the live tree showing w1 running, its usage counted")
        escapes = pane.capture(escapes=True)
        wait_until(lambda: "EXITED=0" in pane.capture(), deadline=60, message="the run's end")
        return screen, escapes


def _counted(screen: str) -> bool:
    """w1 shown running with at least one turn and some tokens (its usage events reached the view)."""
    line = next((line for line in screen.splitlines() if " w1 " in line), "")
    fields = line.split()
    if "running" not in fields or "scripted/worker.yaml" not in line or len(fields) < 4:
        return False
    return fields[-4].isdigit() and fields[-3].isdigit() and int(fields[-4]) >= 1 and int(fields[-3]) > 0


def test_live_tree_on_a_terminal_shows_every_column_then_the_summary() -> None:
    with project(worker_sleep=4) as cwd:
        screen, escapes = _live_screen(cwd, "")
        header = next(line for line in screen.splitlines() if line.startswith("node"))
        for column in ("status", "phase", "model", "turns", "tokens", "cost", "elapsed"):
            assert column in header
        root = next(line for line in screen.splitlines() if " root " in line)
        w1 = next(line for line in screen.splitlines() if " w1 " in line)
        assert "scripted/root.yaml" in root and "running" in root
        assert w1.startswith("  ") and w1.split()[-1].count(":") == 1  # indented under root, an elapsed clock
        assert int(w1.split()[-4]) >= 1 and int(w1.split()[-3]) > 0  # turns, tokens from the usage events
        assert "\x1b[33m" in escapes  # running in yellow


def test_no_color_and_no_terminal() -> None:
    with project(worker_sleep=3) as cwd:
        _, escapes = _live_screen(cwd, "NO_COLOR=1")
        assert "\x1b[3" not in escapes.replace("\x1b[39m", "")
        piped = legion(cwd, "run", "--model", "scripted/root.yaml", "task")
        assert piped.returncode == 0
        assert "node_launched" in piped.stderr and "\x1b[" not in piped.stderr + piped.stdout  # plain lines


def test_ctrl_c_clears_the_live_frame_and_the_summary_says_how_to_resume() -> None:
    """Ctrl-C on a terminal pauses the run (exit 130): the live tree is wiped, not left on the screen above the
    summary, and the summary prints the `legion resume` command that continues the run."""
    with project(worker_sleep=60) as cwd:
        command = (f"unset COLUMNS LINES; cd {cwd} && {sys.executable} -m legion run --model scripted/root.yaml "
                   "--run-id cc1 task; echo EXITED=$?; sleep 30")
        with TmuxPane(command, 150, 30) as pane:
            wait_until(lambda: "w1" in (s := pane.capture()) and "running" in s,
                       deadline=60, message="the live tree showing w1 running")
            pane.send_keys("C-c")

            def ended() -> str:
                screen = pane.capture()
                return screen if "EXITED=" in screen else ""

            screen = wait_until(ended, deadline=60, message="the run's end")
    assert "EXITED=130" in screen, screen
    assert not any(line.startswith("node") and "status" in line for line in screen.splitlines()), screen
    assert f"legion -C {cwd} resume cc1" in screen.replace("\n", "") or "legion resume cc1" in screen, screen
