"""bench/agents_load.py runs, prints exactly one JSON object and reflects its target in the exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "agents_load.py"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("target", "expect_ok"), [("100000", True), ("0.001", False)])
def test_bench_prints_one_json_object(target: str, expect_ok: bool) -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--cards", "12", "--runs", "1", "--target-ms", target],
        capture_output=True,
        text=True,
        timeout=50,
    )
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout + out.stderr
    result = json.loads(lines[0])
    from legion.agents import builtin_card_files

    assert result["cards"] == 12 and result["cards_resolved"] == 12 + len(builtin_card_files())
    assert result["ok"] is expect_ok and (out.returncode == 0) is expect_ok
