"""bench/startup.py's reading of the root's first answer and which target gates in CI vs `--strict`."""

from __future__ import annotations

import importlib.util
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench" / "startup.py"


@pytest.fixture(scope="module")
def startup() -> ModuleType:
    sys.path.insert(0, str(BENCH.parent))  # its `_stats` sibling, as when it runs as a script
    try:
        spec = importlib.util.spec_from_file_location("bench_startup", BENCH)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH.parent))
    return module


def _transcript(run: Path, entries: list[dict[str, object]]) -> None:
    run.mkdir(parents=True)
    header = {"type": "session", "version": 3, "id": "x", "timestamp": "2026-12-04T12:00:00.000Z", "cwd": "/"}
    (run / "root.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [header, *entries]))


@pytest.mark.timeout(30)
def test_the_first_assistant_entry_of_the_newest_run_is_the_answer(startup: ModuleType, tmp_path: Path) -> None:
    user = {"type": "message", "timestamp": "2026-12-04T12:00:00.100Z", "message": {"role": "user"}}
    answer = {"type": "message", "timestamp": "2026-12-04T12:00:00.250Z", "message": {"role": "assistant"}}
    later = {"type": "message", "timestamp": "2026-12-04T12:00:09.000Z", "message": {"role": "assistant"}}
    _transcript(tmp_path / ".legion" / "runs" / "r1", [user, answer, later])
    expected = datetime(2026, 12, 4, 12, 0, 0, 250000, tzinfo=UTC).timestamp()
    assert startup.first_answer_at(tmp_path) == pytest.approx(expected)


@pytest.mark.timeout(30)
def test_a_root_that_never_answered_is_an_error_not_a_figure(startup: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no root transcript"):
        startup.first_answer_at(tmp_path)
    _transcript(tmp_path / ".legion" / "runs" / "r1",
                [{"type": "message", "timestamp": "2026-12-04T12:00:00.100Z", "message": {"role": "user"}}])
    with pytest.raises(RuntimeError, match="no assistant entry"):
        startup.first_answer_at(tmp_path)


@pytest.mark.timeout(30)
def test_ci_gates_the_regression_ratio_and_strict_the_issue_target(startup: ModuleType) -> None:
    today = {"startup_over_bare": 20.0}
    assert startup.targets(today, strict=False)["startup_over_bare"]["passed"]
    assert not startup.targets(today, strict=False)["startup_over_bare"]["met"]
    assert not startup.targets(today, strict=True)["startup_over_bare"]["passed"]
    assert not startup.targets({"startup_over_bare": startup.CI_GATE_RATIO + 1}, strict=False)["startup_over_bare"]["passed"]
    assert startup.targets({"startup_over_bare": 3.5}, strict=True)["startup_over_bare"]["passed"]
