"""`legion doctor --json` as a process: every check, the spawn probe (a real fork server) and cgroups included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest


@pytest.mark.timeout(60)
def test_cli_json_output(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "legion", "-C", str(tmp_path), "doctor", "--json"],
        capture_output=True, timeout=50,
    )
    assert out.returncode == 0, out.stderr
    rows = orjson.loads(out.stdout)
    assert all(set(r) == {"name", "status", "detail", "fix"} for r in rows)
