"""Stall decisions (docs/spec-conformance.md §6.8) as table tests over synthetic clocks: pure, no clock, no I/O."""

from __future__ import annotations

import pytest

from legion.orchestration.stall import Activity, StallConfig, StallState, decide

CFG = StallConfig(silence_ms=120_000, silence_limit=2, radius_ms=600_000, long_limit=3)
S = 1000


def run(times: list[int], act_at: dict[int, Activity] | None = None, base: Activity | None = None) -> list[str]:
    """Feed decide() one sweep per time (ms); the levels it emitted ('-' for none)."""
    state = StallState()
    out = []
    act = base or Activity(last_event_ms=0, run_started_ms=0)
    for t in times:
        act = (act_at or {}).get(t, act)
        notice, state = decide("kid", t, act, state, CFG)
        out.append(notice.level if notice else "-")
    return out


@pytest.mark.parametrize(("times", "expected"), [
    ([60 * S, 119 * S], ["-", "-"]),                              # quiet, but not for long enough
    ([120 * S], ["L1"]),                                          # silence reached
    ([120 * S, 121 * S, 200 * S], ["L1", "-", "-"]),              # one per silence period
    ([120 * S, 240 * S], ["L1", "L1"]),                           # a second full period: the second L1
    ([120 * S, 240 * S, 360 * S, 480 * S], ["L1", "L1", "-", "-"]),  # at most 2 per window
])
def test_l1_silence(times: list[int], expected: list[str]) -> None:
    assert run(times) == expected


def test_a_tool_in_flight_never_triggers_l1() -> None:
    busy = Activity(last_event_ms=0, run_started_ms=0, tools=(("bash", 0),))
    assert run([120 * S, 300 * S, 599 * S], base=busy) == ["-", "-", "-"]


def test_l2_long_running_one_per_radius_at_most_three_and_cites_the_tool() -> None:
    busy = Activity(last_event_ms=0, run_started_ms=0, tools=(("bash", 60 * S), ("read", 500 * S)))
    state = StallState()
    levels, texts = [], []
    for t in (599 * S, 600 * S, 601 * S, 1200 * S, 1800 * S, 2400 * S, 3000 * S):
        notice, state = decide("kid", t, busy, state, CFG)
        levels.append(notice.level if notice else "-")
        texts.append(notice.text if notice else "")
    assert levels == ["-", "L2", "-", "L2", "L2", "-", "-"]
    assert "in `bash` for 9 min" in texts[1]  # the oldest tool in flight, with its duration


def test_l1_wins_one_line_per_child_per_sweep() -> None:
    quiet = Activity(last_event_ms=0, run_started_ms=0)
    state = StallState()
    notice, state = decide("kid", 600 * S, quiet, state, CFG)  # both rules would fire
    assert notice is not None and notice.level == "L1"
    notice, state = decide("kid", 600 * S, quiet, state, CFG)  # the next sweep: L2's turn
    assert notice is not None and notice.level == "L2"


def test_a_new_run_opens_a_new_window() -> None:
    state = StallState()
    first = Activity(last_event_ms=0, run_started_ms=0)
    for t in (120 * S, 240 * S):
        _, state = decide("kid", t, first, state, CFG)
    assert decide("kid", 360 * S, first, state, CFG)[0] is None  # the window's 2 are used
    woken = Activity(last_event_ms=400 * S, run_started_ms=400 * S)
    notice, _ = decide("kid", 520 * S, woken, state, CFG)
    assert notice is not None and notice.level == "L1" and "kid" in notice.subject


def test_activity_resets_the_silence() -> None:
    assert run([100 * S, 200 * S], act_at={100 * S: Activity(last_event_ms=100 * S, run_started_ms=0)}) == ["-", "-"]


def test_decide_is_pure() -> None:
    act, state = Activity(last_event_ms=0, run_started_ms=0), StallState()
    assert decide("kid", 130 * S, act, state, CFG) == decide("kid", 130 * S, act, state, CFG)
    assert state == StallState()


@pytest.mark.parametrize("silence_ms", [0, -1])
def test_a_silence_period_of_zero_or_less_turns_l1_off(silence_ms: int) -> None:
    cfg = StallConfig(silence_ms=silence_ms, radius_ms=600_000)
    quiet, state, levels = Activity(last_event_ms=0, run_started_ms=0), StallState(), []
    for t in (0, 1, 120 * S, 599 * S, 600 * S):
        notice, state = decide("kid", t, quiet, state, cfg)
        levels.append(notice.level if notice else "-")
    assert levels == ["-", "-", "-", "-", "L2"]  # L2 still runs


def test_a_radius_of_zero_turns_l2_off() -> None:
    cfg = StallConfig(silence_ms=120_000, radius_ms=0)
    busy, state = Activity(last_event_ms=0, run_started_ms=0, tools=(("bash", 0),)), StallState()
    for t in (0, 1, 600 * S, 3600 * S, 24 * 3600 * S):
        notice, state = decide("kid", t, busy, state, cfg)
        assert notice is None


def test_the_radius_is_the_configured_one() -> None:
    cfg = StallConfig(radius_ms=90 * S)
    busy, state, levels = Activity(last_event_ms=0, run_started_ms=0, tools=(("bash", 0),)), StallState(), []
    for t in (89 * S, 90 * S, 179 * S, 180 * S, 270 * S, 360 * S):
        notice, state = decide("kid", t, busy, state, cfg)
        levels.append(notice.level if notice else "-")
    assert levels == ["-", "L2", "-", "L2", "L2", "-"]
