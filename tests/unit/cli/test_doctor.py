"""`legion doctor` reports every check with a fix and never crashes."""

from __future__ import annotations

from pathlib import Path

import pytest

from legion.cli import doctor
from legion.procs import containment


def test_all_checks_pass_in_a_fresh_project(tmp_path: Path) -> None:
    checks = doctor.run_checks(tmp_path)
    by_name = {c.name: c for c in checks}
    assert {"python", "sqlite-wal", "zeromq", "ipc-path", "subreaper", "containment", "pidfd", "project"} <= set(by_name)
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


def test_containment_says_which_path_a_run_will_use_and_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LEGION_CGROUPS", raising=False)
    check = doctor.check_containment()
    if containment().cgroups:  # a run here gets cgroups: the probe created and removed a run cgroup
        assert check.status == "ok" and check.detail.startswith("cgroups: cgroup v2 at ")
    else:
        assert check.status == "warn" and check.detail.startswith("pid/pgid retire ladder: ") and check.fix
    monkeypatch.setenv("LEGION_CGROUPS", "0")
    forced = doctor.check_containment()
    assert forced.status == "warn" and "LEGION_CGROUPS=0 forces cgroups off" in forced.detail
    assert "Delegate=yes" in forced.fix
