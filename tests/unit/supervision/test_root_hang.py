"""HangDetector: app-heartbeat silence for misses x interval means hung (fake clock, no sleeps)."""

from __future__ import annotations

import asyncio

import pytest

from legion.supervision.hang import HangDetector

pytestmark = pytest.mark.timeout(10)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(seen: dict[str, float], clock: Clock, **kwargs: float) -> HangDetector:
    return HangDetector(seen.get, interval=kwargs.get("interval", 1.0), misses=int(kwargs.get("misses", 3)),
                        clock=clock)


def test_silence_beyond_three_intervals_fires_once() -> None:
    seen: dict[str, float] = {}
    clock = Clock()
    det = make(seen, clock)
    fired: list[tuple[str, float]] = []
    det.watch("w", lambda wid, silent: fired.append((wid, silent)))
    seen["w"] = clock.now
    clock.now += 3.0
    assert det.check() == []  # exactly 3 x interval is not yet hung
    clock.now += 0.01
    assert det.check() == ["w"]
    assert fired == [("w", pytest.approx(3.01))]
    clock.now += 10
    assert det.check() == [] and len(fired) == 1  # fired once, then no longer watched
    assert det.watching() == []


def test_heartbeats_keep_a_worker_alive() -> None:
    seen: dict[str, float] = {}
    clock = Clock()
    det = make(seen, clock, interval=0.5)
    det.watch("w", lambda *_: pytest.fail("not hung"))
    for _ in range(20):
        clock.now += 0.5
        seen["w"] = clock.now
        assert det.check() == []
    assert det.silent_for("w") == 0.0


def test_silence_counts_from_watch_time_not_a_predecessors_last_frame() -> None:
    seen = {"w": 0.0}  # the previous incarnation was last heard long ago
    clock = Clock()
    det = make(seen, clock)
    det.watch("w", lambda *_: None)
    assert det.silent_for("w") == 0.0
    assert det.check() == []
    clock.now += 3.5
    assert det.check() == ["w"]


def test_never_heard_from_counts_from_watch_time() -> None:
    clock = Clock()
    det = make({}, clock)
    det.watch("w", lambda *_: None)
    clock.now += 2.9
    assert det.check() == []
    clock.now += 0.2
    assert det.check() == ["w"]


def test_unwatch_and_a_raising_callback_do_not_break_others() -> None:
    clock = Clock()
    det = make({}, clock)
    fired: list[str] = []

    def boom(wid: str, silent: float) -> None:
        raise RuntimeError("callback bug")

    det.watch("a", boom)
    det.watch("b", lambda wid, s: fired.append(wid))
    det.watch("c", lambda wid, s: fired.append(wid))
    det.unwatch("c")
    clock.now += 5
    assert sorted(det.check()) == ["a", "b"]
    assert fired == ["b"]


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        HangDetector({}.get, interval=0)
    with pytest.raises(ValueError):
        HangDetector({}.get, misses=0)


async def test_run_loop_checks_four_times_per_interval() -> None:
    clock = Clock()
    sleeps: list[float] = []

    async def sleep(delay: float) -> None:
        sleeps.append(delay)
        clock.now += delay
        await asyncio.sleep(0)

    det = HangDetector({}.get, interval=0.2, misses=3, clock=clock, sleep=sleep)
    hung = asyncio.Event()
    fired_at: list[float] = []

    def on_hung(worker_id: str, silent: float) -> None:
        fired_at.append(clock.now)
        hung.set()

    det.watch("w", on_hung)
    det.start()
    await asyncio.wait_for(hung.wait(), 2)
    await det.close()
    assert all(s == pytest.approx(0.05) for s in sleeps)
    # detected within one check period (interval / 4) after the 0.6 s limit
    assert 100.6 < fired_at[0] <= 100.65 + 1e-9


async def test_a_stall_of_the_roots_own_loop_blames_no_worker() -> None:
    clock = Clock()
    seen = {"w": clock.now}
    ticks = asyncio.Queue[float]()

    async def sleep(delay: float) -> None:
        clock.now += await ticks.get()  # the test decides how late each check wakes up

    det = HangDetector(seen.get, interval=1.0, misses=3, clock=clock, sleep=sleep)
    fired: list[str] = []
    det.watch("w", lambda wid, s: fired.append(wid))
    det.start()
    await ticks.put(10.0)  # the root was blocked for 10 s: frames were not read meanwhile
    for _ in range(20):
        await asyncio.sleep(0)
    assert fired == [] and det.stalls == 1
    assert det.silent_for("w") == 0.0  # window restarted at the stall's end
    for _ in range(13):  # then a real silence of > 3 s is still caught
        await ticks.put(0.25)
        for _ in range(5):
            await asyncio.sleep(0)
    await det.close()
    assert fired == ["w"]


def _beat(seen: dict[str, float], clock: Clock, *workers: str) -> None:
    for w in workers:
        seen[w] = clock.now


def test_a_silence_most_workers_share_is_load_and_hangs_wait_for_three_limits() -> None:
    """Four workers silent together (a loaded machine, a tracer): none is hung at the limit; only a silence of three
    limits is, even then."""
    seen: dict[str, float] = {}
    clock = Clock()
    det = make(seen, clock)  # limit 3 s
    fired: list[str] = []
    workers = ["a", "b", "c", "d"]
    for w in workers:
        det.watch(w, lambda wid, s: fired.append(wid))
    _beat(seen, clock, *workers)
    clock.now += 3.5
    assert det.check() == [] and det.shared_silences == 1
    clock.now += 5.0  # 8.5 s silent: still under 3 limits
    assert det.check() == [] and det.shared_silences == 1  # one shared silence, counted once
    clock.now += 0.6
    assert sorted(det.check()) == workers and sorted(fired) == workers


def test_one_silent_worker_among_heard_ones_is_hung_at_the_limit() -> None:
    seen: dict[str, float] = {}
    clock = Clock()
    det = make(seen, clock)
    fired: list[str] = []
    for w in ["a", "b", "c", "d"]:
        det.watch(w, lambda wid, s: fired.append(wid))
    _beat(seen, clock, "a", "b", "c", "d")
    for _ in range(6):  # d is stopped; the others beat every 0.5 s (3 s: not yet over the limit)
        clock.now += 0.5
        _beat(seen, clock, "a", "b", "c")
        assert det.check() == []
    clock.now += 0.1
    _beat(seen, clock, "a", "b", "c")
    assert det.check() == ["d"] and fired == ["d"] and det.shared_silences == 0


def test_after_a_shared_silence_ends_a_lone_silence_is_hung_at_the_limit_again() -> None:
    seen: dict[str, float] = {}
    clock = Clock()
    det = make(seen, clock)
    workers = ["a", "b", "c", "d", "e"]
    for w in workers:
        det.watch(w, lambda *_: None)
    _beat(seen, clock, *workers)
    clock.now += 4.0
    assert det.check() == [] and det.shared_silences == 1
    _beat(seen, clock, "a", "b", "c", "d")  # the load passed; e stays silent, past the limit already
    assert det.check() == ["e"]
    assert det.watching() == ["a", "b", "c", "d"]


def test_three_workers_silent_out_of_many_are_hung_at_the_limit() -> None:
    """A share below half is no shared silence: three stopped workers among ten that beat are hung at the limit."""
    seen: dict[str, float] = {}
    clock = Clock()
    det = make(seen, clock)
    workers = [f"w{i}" for i in range(10)]
    for w in workers:
        det.watch(w, lambda *_: None)
    _beat(seen, clock, *workers)
    clock.now += 3.1
    _beat(seen, clock, *workers[3:])
    assert sorted(det.check()) == workers[:3] and det.shared_silences == 0
