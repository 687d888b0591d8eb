"""SessionHost: slots, FIFO admission queue, overflow, timeouts, slot-release broadcast, isolated retire."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from legion.workers.context import SessionContext
from legion.workers.pool import AdmissionError, PoolLimits, SessionHost, pool_limits
from legion.workers.providers.registry import ProviderRegistry
from legion.workers.session import Session, SessionConfig
from tests.support import pid_alive, poller

pytestmark = pytest.mark.timeout(30)
REG = ProviderRegistry(scripts={"t": {"default": {"text": "ok"}}})


def factory(tmp_path: Path, node: str, script: str = "t", reg: ProviderRegistry = REG) -> Callable[[], Session]:
    return lambda: Session(context=SessionContext(node_id=node, cwd=str(tmp_path)), model=f"scripted/{script}",
                           transcript_path=tmp_path / f"{node}.jsonl", registry=reg,
                           config=SessionConfig(empty_backoff_s=0.01))


until = poller(10.0, 0.005)


def test_pool_limits_defaults() -> None:
    assert pool_limits(None).max_active == 30
    assert pool_limits({}).max_active == 8
    lim = pool_limits({"maxActive": 3, "maxQueuedLaunches": 5, "launchQueueTimeoutMs": 1000})
    assert (lim.max_active, lim.max_queued, lim.queue_timeout_s, lim.start_timeout_s) == (3, 5, 1.0, 15.0)
    assert (PoolLimits().max_queued, PoolLimits().queue_timeout_s) == (32, 900.0)
    with pytest.raises(ValueError):
        PoolLimits(max_active=0)
    for bad in ({"maxActive": "many"}, {"maxQueuedLaunches": 1.5}, {"launchQueueTimeoutMs": None},
                {"maxActive": True}):
        with pytest.raises(ValueError, match=r"inprocess\.\w+ must be a whole number"):
            pool_limits(bad)
    with pytest.raises(ValueError, match=r"inprocess\.maxActive must be >= 1"):
        pool_limits({"maxActive": 0})


async def test_admission_queue_fifo_and_slot_release_wakes_it(tmp_path: Path) -> None:
    events: list[tuple[str, dict[str, Any]]] = []
    host = SessionHost(PoolLimits(max_active=2, max_queued=3), on_process_event=lambda t, b: events.append((t, b)))
    await host.launch("a", factory(tmp_path, "a"))
    await host.launch("b", factory(tmp_path, "b"))
    order: list[str] = []

    async def queued(node: str) -> None:
        await host.launch(node, factory(tmp_path, node))
        order.append(node)

    tasks = [asyncio.create_task(queued(n)) for n in ("c", "d", "e")]
    await until(lambda: host.queued_count == 3)
    with pytest.raises(AdmissionError) as full:
        await host.launch("f", factory(tmp_path, "f"))
    assert full.value.code == "QUEUE_FULL" and "maxQueuedLaunches 3" in str(full.value)
    assert host.admission() == {"slots": ["a", "b"], "queued": ["c", "d", "e"], "maxActive": 2, "maxQueued": 3}
    assert [b["nodeId"] for t, b in events if t == "launch_queued"] == ["c", "d", "e"]
    assert [b["position"] for t, b in events if t == "launch_queued"] == [1, 2, 3]
    await host.retire("a")
    await until(lambda: order == ["c"])
    await host.retire("b")
    await host.retire("c")
    await until(lambda: order == ["c", "d", "e"])
    await asyncio.gather(*tasks)
    assert [b["nodeId"] for t, b in events if t == "launch_admitted"] == ["c", "d", "e"]
    assert host.active_count == 2 and set(host.sessions()) == {"d", "e"}
    await host.close()
    assert host.active_count == 0


async def test_queue_timeout(tmp_path: Path) -> None:
    host = SessionHost(PoolLimits(max_active=1, queue_timeout_s=0.1))
    await host.launch("a", factory(tmp_path, "a"))
    with pytest.raises(AdmissionError) as exc:
        await host.launch("b", factory(tmp_path, "b"))
    assert exc.value.code == "QUEUE_TIMEOUT" and host.queued_count == 0 and host.active_count == 1
    await host.close()


async def test_start_timeout_and_failure_release_the_slot(tmp_path: Path) -> None:
    host = SessionHost(PoolLimits(max_active=1, start_timeout_s=0.1))

    async def never() -> Session:
        await asyncio.sleep(60)
        raise AssertionError

    with pytest.raises(AdmissionError) as exc:
        await host.launch("slow", never)
    assert exc.value.code == "START_TIMEOUT" and host.active_count == 0

    def broken() -> Session:
        raise OSError("disk full")

    with pytest.raises(AdmissionError) as exc:
        await host.launch("bad", broken)
    assert exc.value.code == "START_FAILED" and "disk full" in str(exc.value) and host.active_count == 0
    s = await host.launch("ok", factory(tmp_path, "ok"))
    assert host.get("ok") is s
    with pytest.raises(AdmissionError) as exc:
        await host.launch("ok", factory(tmp_path, "ok"))
    assert exc.value.code == "DUPLICATE"
    await host.close()


async def test_throwing_listener_does_not_break_retire(tmp_path: Path) -> None:
    host = SessionHost(PoolLimits(max_active=1))
    heard: list[str] = []

    def bad(node: str) -> None:
        raise RuntimeError("listener bug")

    host.subscribe_slot_released(bad)
    unsubscribe = host.subscribe_slot_released(heard.append)
    await host.launch("a", factory(tmp_path, "a"))
    waiting = asyncio.create_task(host.launch("b", factory(tmp_path, "b")))
    await until(lambda: host.queued_count == 1)
    result = await host.retire("a")
    assert result.found and not result.survivors
    await waiting
    assert heard == ["a"] and host.get("b") is not None
    unsubscribe()
    await host.retire("b")
    assert heard == ["a"]
    assert not (await host.retire("zzz")).found


async def test_retire_of_a_queued_launch_cancels_it(tmp_path: Path) -> None:
    host = SessionHost(PoolLimits(max_active=1))
    await host.launch("a", factory(tmp_path, "a"))
    waiting = asyncio.create_task(host.launch("b", factory(tmp_path, "b")))
    await until(lambda: host.queued_count == 1)
    assert (await host.retire("b")).was_queued
    with pytest.raises(AdmissionError) as exc:
        await waiting
    assert exc.value.code == "CANCELLED"
    await host.close()
    with pytest.raises(AdmissionError, match="shutting down"):
        await host.launch("c", factory(tmp_path, "c"))


async def test_retire_sweeps_only_that_sessions_tool_groups(tmp_path: Path) -> None:
    def script(node: str) -> dict[str, Any]:
        cmd = f"sleep 60 >/dev/null 2>&1 & echo $! > {tmp_path}/{node}.bg"
        return {"turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": cmd}}]}, {"text": "ok"}]}

    reg = ProviderRegistry(scripts={"x": script("x"), "y": script("y")})
    host = SessionHost(PoolLimits(max_active=4))
    sx = await host.launch("x", factory(tmp_path, "x", "x", reg))
    sy = await host.launch("y", factory(tmp_path, "y", "y", reg))
    await sx.prompt("go")
    await sy.prompt("go")
    await asyncio.gather(sx.wait_settled(10), sy.wait_settled(10))
    bx, by = (int((tmp_path / f"{n}.bg").read_text()) for n in ("x", "y"))
    assert pid_alive(bx) and pid_alive(by)
    result = await host.retire("x")
    assert result.found and result.survivors == []
    await until(lambda: not pid_alive(bx))
    assert pid_alive(by) and host.get("y") is sy and sy.state == "idle"
    await sy.prompt("still works")
    assert (await sy.wait_settled(10)).settled
    await host.close()
    await until(lambda: not pid_alive(by))


async def test_retire_interrupts_a_running_turn(tmp_path: Path) -> None:
    reg = ProviderRegistry(scripts={"h": {"turns": [{"hang": True}]}})
    host = SessionHost()
    s = await host.launch("h", factory(tmp_path, "h", "h", reg))
    await s.prompt("go")
    assert s.state == "streaming"
    await host.retire("h")
    assert s.state == "idle" and s.transcript.closed and host.active_count == 0


async def test_admission_stress_never_exceeds_max_active(tmp_path: Path) -> None:
    import random

    rng = random.Random(7)
    peak = 0
    host = SessionHost(PoolLimits(max_active=4, max_queued=64))

    def watch(_: str) -> None:
        nonlocal peak
        peak = max(peak, host.active_count)

    host.subscribe_slot_released(watch)
    reg = ProviderRegistry(scripts={"q": {"turns": [{"text": "ok", "delay_ms": 5}]}})
    admitted: list[str] = []

    async def one(i: int) -> None:
        nonlocal peak
        node = f"n{i}"
        s = await host.launch(node, factory(tmp_path, node, "q", reg))
        peak = max(peak, host.active_count)
        admitted.append(node)
        await s.prompt("go")
        await s.wait_settled(10)
        await asyncio.sleep(rng.random() * 0.01)
        await host.retire(node)

    await asyncio.gather(*(one(i) for i in range(40)))
    assert sorted(admitted) == sorted(f"n{i}" for i in range(40))
    assert peak <= 4 and host.active_count == 0 and host.queued_count == 0
    assert admitted == [f"n{i}" for i in range(40)]  # FIFO admission


async def test_retire_during_start_cancels_the_launch(tmp_path: Path) -> None:
    host = SessionHost(PoolLimits(max_active=1))
    gate = asyncio.Event()
    made: list[Session] = []

    async def slow_factory() -> Session:
        await gate.wait()
        s = factory(tmp_path, "slow")()
        made.append(s)
        return s

    launching = asyncio.create_task(host.launch("slow", slow_factory))
    await until(lambda: host.active_count == 1)
    result = await host.retire("slow")
    assert result.found and host.active_count == 0
    gate.set()
    with pytest.raises(AdmissionError) as exc:
        await launching
    assert exc.value.code == "CANCELLED" and made[0].transcript.closed
    assert host.get("slow") is None and host.active_count == 0
    await host.launch("next", factory(tmp_path, "next"))
    assert host.active_count == 1
    await host.close()


async def test_close_during_start_disposes_the_late_session(tmp_path: Path) -> None:
    """A session whose start finishes after the host closed is disposed, never left running."""
    host = SessionHost(PoolLimits(max_active=2))
    gate = asyncio.Event()
    made: list[Session] = []

    async def slow_factory() -> Session:
        await gate.wait()
        made.append(factory(tmp_path, "late")())
        return made[0]

    launching = asyncio.create_task(host.launch("late", slow_factory))
    await until(lambda: host.active_count == 1)
    await host.close()
    assert host.active_count == 0
    gate.set()
    with pytest.raises(AdmissionError) as exc:
        await launching
    assert exc.value.code in ("CANCELLED", "CLOSED") and made[0].transcript.closed
    assert host.get("late") is None and host.sessions() == {}
