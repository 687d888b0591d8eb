"""The CLI's edges (README "Commands"): no command, `-C DIR` after the command, a terminal that cannot encode
the output."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.cli_support import LEGION, env, legion_here, project


def _legion(cwd: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LEGION, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**env(), **extra}, stdin=subprocess.DEVNULL)  # fmt: skip


def test_no_command_prints_the_help_and_exits_2(tmp_path: Path) -> None:
    out = _legion(tmp_path)
    assert out.returncode == 2
    assert "usage: legion" in out.stderr and "run " in out.stderr and "doctor" in out.stderr


def test_cwd_flag_after_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # as the subprocesses: -C, not the working directory, must find the project
    with project() as proj:
        out = _legion(tmp_path, "run", "say hi", "--model", "scripted/echo", "--run-id", "c1", "-C", str(proj))
        assert out.returncode == 0, out.stderr
        assert (proj / ".legion" / "runs" / "c1" / "legion.db").exists()
        for args in (["status", "c1"], ["summary", "c1"], ["timing", "c1"], ["events", "c1"], ["tree", "c1"],
                     ["status"], ["agents"], ["team"]):
            assert legion_here(None, capsys, *args, "-C", str(proj)).returncode == 0, args
            assert legion_here(None, capsys, "-C", str(proj), *args).returncode == 0, args
        assert legion_here(None, capsys, "init", "--cwd", str(proj)).returncode == 0
        assert (proj / ".legion" / "settings.json").exists()
        # the flag after the command wins over the one before it
        assert _legion(tmp_path, "-C", str(tmp_path), "status", "c1", "-C", str(proj)).returncode == 0


def test_output_survives_a_terminal_that_cannot_encode_it(tmp_path: Path) -> None:
    """The summary's ──, ✔ and · (and a task or answer in any script) never crash an ASCII terminal."""
    with project() as proj:
        ascii_env = {"PYTHONIOENCODING": "ascii", "LC_ALL": "C"}
        out = _legion(proj, "run", "résumé · ✔", "--model", "scripted/echo", "--run-id", "a1", **ascii_env)
        assert out.returncode == 0, out.stderr[-2000:]
        assert "Traceback" not in out.stderr and "legion run a1: settled" in out.stdout, out.stdout + out.stderr
        for args in (["summary", "a1"], ["status", "a1"], ["timing", "a1"], ["tree", "a1"], ["events", "a1"],
                     ["agents"], ["doctor", "summary"]):
            res = _legion(proj, *args, **ascii_env)
            assert "UnicodeEncodeError" not in res.stderr and "Traceback" not in res.stderr, (args, res.stderr)
            assert res.returncode in (0, 1) if args[0] == "doctor" else res.returncode == 0, (args, res.stderr)
