"""The admission gate's arithmetic and its serialisation (docs/spec-conformance.md §2.5): a launch the pool's queue
has no place for is refused QUEUE_FULL; launches in flight that the pool has not seen count as the pool would
take them; concurrent checks cannot both take the last place."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from legion.orchestration.admission import AdmissionGate, verdict
from legion.orchestration.refusals import QUEUE_FULL, ActionRefused


def state(slots: list[str], queued: list[str], max_active: int = 2, max_queued: int = 1) -> dict[str, Any]:
    return {"slots": slots, "queued": queued, "maxActive": max_active, "maxQueued": max_queued}


def test_a_free_slot_or_a_queue_place_admits() -> None:
    assert verdict(state(["root"], []), []) is None  # a slot
    assert verdict(state(["root", "c1"], []), []) is None  # the queue place
    refusal = verdict(state(["root", "c1"], ["c2"]), [])
    assert refusal is not None and "1 of inprocess.maxQueuedLaunches 1" in refusal
    assert verdict(state(["a", "b"], [], max_queued=0), []) is not None  # no queue at all: a free slot or nothing


def test_launches_in_flight_count_once() -> None:
    assert verdict(state(["root"], []), ["c1", "c2"]) is not None  # c1 takes the slot, c2 the queue place
    assert verdict(state(["root", "c1"], []), ["c1"]) is None  # the pool has c1 already: not counted twice
    assert verdict(state(["root"], [], max_queued=0), ["c1"]) is not None


def test_an_unknown_state_does_not_refuse() -> None:
    assert verdict({}, ["c1", "c2", "c3"]) is None
    assert verdict({"ok": False, "code": "UNKNOWN_OP"}, []) is None


async def test_concurrent_checks_cannot_share_the_last_place() -> None:
    pool = state(["root"], [])

    async def query() -> dict[str, Any]:
        await asyncio.sleep(0.01)  # both checks are in flight at once
        return pool

    gate = AdmissionGate(query, capacity=lambda: 1, known=lambda: {"root"})  # (capacity 1: every check asks the pool)
    results = await asyncio.gather(gate.admit("c1"), gate.admit("c2"), gate.admit("c3"), return_exceptions=True)
    assert results[:2] == [None, None]
    assert isinstance(results[2], ActionRefused) and results[2].code == QUEUE_FULL
    assert "'c3' not launched" in str(results[2])
    gate.done("c1")
    gate.done("c2")
    pool = state(["root", "c1"], ["c2"])  # the pool has answered both
    with pytest.raises(ActionRefused):
        await gate.admit("c3")


async def test_a_pool_that_does_not_answer_decides_itself() -> None:
    async def query() -> dict[str, Any]:
        raise RuntimeError("pool restarting")

    gate = AdmissionGate(query, capacity=lambda: 1, known=lambda: {"root"})
    await gate.admit("c1")
    with gate.sending("c2"):
        await gate.admit("c3")


async def test_far_from_the_limit_the_pool_is_not_asked() -> None:
    asked: list[int] = []

    async def query() -> dict[str, Any]:
        asked.append(1)
        return state(["root", "c1"], ["c2"])

    gate = AdmissionGate(query, capacity=lambda: 3, known=lambda: {"root"})
    await gate.admit("c1")
    await gate.admit("c2")  # root, c1 and c2 fit in maxActive + maxQueued 3 whatever the pool's state: not asked
    assert not asked
    with pytest.raises(ActionRefused):
        await gate.admit("c3")  # a fourth might not fit: asked (and this state says the queue is full)
    assert asked == [1]


async def test_far_below_the_limit_by_the_trees_size_the_known_set_is_not_built() -> None:
    built: list[int] = []

    async def query() -> dict[str, Any]:
        raise AssertionError("not asked")

    def known() -> set[str]:
        built.append(1)
        return {"root", "a", "b"}

    gate = AdmissionGate(query, capacity=lambda: 5, known=known, bound=lambda: 3)
    await gate.admit("c1")  # 3 nodes in the tree + 0 in flight < 5: admitted without a pass over the tree
    assert not built
    await gate.admit("c2")  # 3 + 1 in flight < 5 still
    assert not built
    await gate.admit("c3")  # 3 + 2 is not < 5: the known set is built, and root, a, b, c1, c2 = 5 is not < 5 either
    assert built == [1]
