"""The live view fits its terminal (tmux panes): at 80x24 and 200x50, with 40 live nodes of 41 and with 300 nodes,
every line fits the width, the figures (turns, tokens, cost, elapsed) are never cut, model names are whole or cut on
the right with `…`, and hidden rows are counted in a `… N more` line, live ones first; a resized pane is redrawn at
its new size."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.support import TmuxPane, wait_until

pytestmark = [pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux for a real pseudo-terminal"),
              pytest.mark.timeout(120)]

FEEDER = Path(__file__).with_name("live_view_feeder.py")
REPO = Path(__file__).resolve().parents[2]
MODEL = "anthropic/claude-sonnet-4-5"


def _frame(pane: TmuxPane, width: int, height: int, nodes: int) -> list[str]:
    """The pane's lines once a whole live frame of `nodes` nodes at this size passes `_check` (a capture taken while
    the frame is being redrawn is taken again); at the deadline, the last capture's failure."""
    last: list[str] = []

    def fits() -> list[str] | None:
        last[:] = pane.capture().rstrip("\n").splitlines()
        try:
            _check(last, width, height, nodes, live=40)
        except (AssertionError, StopIteration, IndexError, ValueError):
            return None
        return list(last)

    try:
        return list(wait_until(fits, deadline=30, message=f"a live frame of {nodes} nodes at {width}x{height}"))
    except AssertionError:
        _check(last, width, height, nodes, live=40)  # the reason, with the screen
        raise


def _check(lines: list[str], width: int, height: int, nodes: int, live: int) -> None:
    assert len(lines) <= height and all(len(line) <= width for line in lines), lines
    header = next(n for n, line in enumerate(lines) if line.startswith("node "))
    assert ("status" in lines[header]) == (width >= 150), lines  # the status column gives way at 80 columns
    assert header == 1 and lines[0].startswith("legion · ") and f"{nodes} nodes, {live} live" in lines[0], lines
    for column in ("model", "turns", "tokens", "cost", "elapsed"):
        assert column in lines[header].split(), lines[header]
    rows = [line for line in lines[header + 1:] if line.strip() and not line.startswith("… ")]
    more = [line for line in lines if line.startswith("… ")]
    for row in rows:
        fields = row.split()
        assert fields[0] in "▶✔" and re.fullmatch(r"\d+:\d\d", fields[-1]), row  # the elapsed clock, whole
        assert fields[-2].startswith("$") and fields[-3].isdigit() and fields[-4].isdigit(), row
        model = next(f for f in fields if f.startswith("anthropic/") or f.endswith("…"))
        assert model == MODEL or (model.endswith("…") and MODEL.startswith(model[:-1])), row  # cut on the right
    shown_live = sum(row.split()[0] == "▶" for row in rows)
    if len(rows) < nodes:
        assert len(more) == 1, lines
        hidden = int(more[0].split()[1])
        assert len(rows) + hidden == nodes, (len(rows), more)
        hidden_live = live - shown_live
        parts = more[0].split(": ", 1)[1]
        assert parts.startswith(f"{hidden_live} live" if hidden_live else f"{hidden} settled"), more
        assert shown_live == min(live, len(rows))  # the live rows are kept first
    else:
        assert not more and len(rows) == nodes, lines


@pytest.mark.parametrize("nodes", [41, 300])
def test_the_live_view_fits_80x24_and_200x50_and_redraws_on_resize(nodes: int, tmp_path: Path) -> None:
    stop = tmp_path / "stop"
    # pytest exports COLUMNS/LINES, which rich would prefer over the pane's real size
    command = f"unset COLUMNS LINES; cd {REPO} && {sys.executable} {FEEDER} {nodes} {stop}; sleep 30"
    captures: dict[str, list[str]] = {}
    with TmuxPane(command, 80, 24) as pane:
        for width, height in ((80, 24), (200, 50), (80, 24)):  # each size after a resize of the same pane
            pane.resize(width, height)
            captures.setdefault(f"{width}x{height}", _frame(pane, width, height, nodes))
        stop.touch()
        wait_until(lambda: "FEEDER DONE" in pane.capture(), deadline=30, message="the feeder's end")
        after = pane.capture()
        assert "legion · " not in after and not any(line.startswith("node ") for line in after.splitlines()), after
    small = captures["80x24"]
    assert any(line.startswith("… ") for line in small), small  # neither 41 nor 300 rows fit 24 lines
    print(f"\n--- {nodes} nodes at 80x24 ---\n" + "\n".join(small))
