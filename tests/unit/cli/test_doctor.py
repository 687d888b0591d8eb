"""`legion doctor` reports every check with a fix and never crashes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from legion import doctor


def test_all_checks_pass_in_a_fresh_project(tmp_path: Path) -> None:
    checks = doctor.run_checks(tmp_path)
    by_name = {c.name: c for c in checks}
    assert {"python", "sqlite-wal", "zeromq", "ipc-path", "subreaper", "pidfd", "project"} <= set(by_name)
    assert by_name["sqlite-wal"].status == "ok"
    assert str(tmp_path.resolve()) in by_name["sqlite-wal"].detail  # probes the project's filesystem
    assert doctor.exit_code(checks) == 0


def test_deep_project_path_warns_about_ipc_socket_length(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    check = doctor.check_socket_path(deep)
    assert check.status == "warn"
    assert "limit 107" in check.detail
    assert check.fix


def test_failing_check_sets_exit_code_and_render_shows_fix() -> None:
    checks = [doctor.Check("x", "fail", "broken", "do this"), doctor.Check("y", "ok", "fine")]
    assert doctor.exit_code(checks) == 1
    text = doctor.render(checks)
    assert "✗ x" in text and "fix: do this" in text and "✓ y" in text


@pytest.mark.timeout(60)
def test_cli_json_output(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "legion", "-C", str(tmp_path), "doctor", "--json"],
        capture_output=True, timeout=50,
    )
    assert out.returncode == 0, out.stderr
    rows = orjson.loads(out.stdout)
    assert all(set(r) == {"name", "status", "detail", "fix"} for r in rows)
