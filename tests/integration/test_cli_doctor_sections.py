"""`legion doctor SECTION` as a user runs it: every section answers, problems carry fixes, nothing crashes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from legion.cli.doctor_sections import SECTIONS, errors_checks, storage_checks


def _doctor(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "legion", "-C", str(cwd), "doctor", *args, "--json"],
                          capture_output=True, text=True, timeout=90)


@pytest.mark.parametrize("section", [s for s in SECTIONS if s not in ("summary", "next")])
def test_each_section_answers_as_json(tmp_path: Path, section: str) -> None:
    proc = _doctor(tmp_path, section)
    checks = orjson.loads(proc.stdout)
    assert checks and all({"name", "status", "detail", "fix"} <= set(c) for c in checks)
    assert all(c["status"] in ("ok", "warn", "fail", "off") for c in checks)
    assert not any("check crashed" in c["detail"] for c in checks), checks
    assert proc.returncode == (1 if any(c["status"] == "fail" for c in checks) else 0)


def test_summary_has_one_line_per_section_and_tools_lists_every_command(tmp_path: Path) -> None:
    summary = orjson.loads(_doctor(tmp_path, "summary").stdout)
    assert [c["name"] for c in summary] == [s for s in SECTIONS if s not in ("summary", "next")]
    tools = {c["name"]: c for c in orjson.loads(_doctor(tmp_path, "tools").stdout)}
    for command in ("run", "resume", "summary", "timing", "doctor", "stop"):
        assert f" {command} " in tools["commands"]["detail"] + " "


def test_quarantined_run_json_and_failures_are_problems_with_fixes(tmp_path: Path) -> None:
    from legion.ledger import open_ledger

    run = tmp_path / ".legion" / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "run.json.corrupt").write_text("{")
    ledger = open_ledger(run / "legion.db")
    ledger.insert_node(id="w1", name="w1", role="worker", kind="native", depth=1, parent_id=None, status="failed")
    ledger.append_event("w1", "node_failed", {"reason": "boom"})
    ledger.close()
    storage = {c.name: c for c in storage_checks(tmp_path)}
    assert storage["run.json"].status == "warn" and "restore run.json" in storage["run.json"].fix
    (err,) = errors_checks(tmp_path)
    assert err.status == "warn" and "w1: boom" in err.detail and "legion summary r1 w1" in err.fix
    nxt = orjson.loads(_doctor(tmp_path, "next").stdout)
    assert any("boom" in c["detail"] for c in nxt)
