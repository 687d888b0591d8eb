"""Issue 23's small things, each through the command as a user runs it on a real run (scripted models): plurals
("1 turn"), `status`'s header and no operator row, `events`' times, `doctor models` on unset keys, `agents project`
without the built-ins, `resume --detach`."""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_support import legion, legion_here


@pytest.fixture(scope="module")
def echo_run() -> Iterator[Path]:
    """A finished one-node run: the root answers in one turn (scripted/echo)."""
    cwd = Path(tempfile.mkdtemp(prefix="los", dir="/tmp"))
    try:
        out = legion(cwd, "run", "--run-id", "e1", "--model", "scripted/echo", "say hi")
        assert out.returncode == 0, out.stderr + out.stdout
        yield cwd
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def test_one_turn_is_singular(echo_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = legion_here(echo_run, capsys, "summary", "e1")
    assert out.returncode == 0, out.stderr
    root = next(line for line in out.stdout.splitlines() if line.startswith("root "))
    assert " · 1 turn · 0 tools · " in root, root
    assert re.search(r"^total: 1 node · ", out.stdout, re.M), out.stdout
    assert not re.search(r"\b1 (turns|tools|nodes)\b", out.stdout), out.stdout


def test_events_show_iso_times_and_json_keeps_epoch_ms(echo_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from datetime import datetime, timedelta

    import orjson

    text = legion_here(echo_run, capsys, "events", "e1")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines
    now = datetime.now().astimezone()
    for line in lines:
        stamp = line.split()[1]
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d", stamp), line
        assert abs(datetime.fromisoformat(stamp) - now) < timedelta(minutes=10), line
    raw = legion_here(echo_run, capsys, "events", "e1", "--json")
    events = [orjson.loads(line) for line in raw.stdout.splitlines()]
    assert events and all(isinstance(e["ts"], int) and e["ts"] > 1_600_000_000_000 for e in events)
    followed = legion_here(echo_run, capsys, "events", "e1", "--follow", "--idle", "0")
    assert [line.split()[1] for line in followed.stdout.splitlines()] == [line.split()[1] for line in lines]
