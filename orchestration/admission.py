"""The pool's admission queue seen from the orchestrator: an overflowing launch is refused before it creates
anything (docs/spec-conformance.md §2.5).

The pool worker is the authority on its slots and queue (`legion.workers.pool.SessionHost`), but its own
`QUEUE_FULL` comes only once the launch's node row, transcript and `starting` record exist, and the refusal then
fails that node. So before a launch into the pool reserves anything, the gate asks the pool what a launch would
meet now (`session.admission`), adds the launches this orchestrator has sent or is about to send that the pool
has not seen yet, and refuses `QUEUE_FULL` when the queue would overflow — the way a budget refusal creates
nothing. Checks are serialised, so two launches of one `tasks[]` call cannot both take the last queue place. A
pool that cannot answer (restarting) is not second-guessed: the launch goes ahead and the pool decides.

The question is asked only near the limit: a refusal needs the slots and the queue both full (slots + queued ≥
maxActive + maxQueuedLaunches), and every session the pool holds or queues is one the orchestrator knows (live,
or hosted); while those and the launches in flight leave room for one more, the launch goes ahead unasked.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from loguru import logger

from legion.orchestration.refusals import QUEUE_FULL, ActionRefused

ADMISSION_QUERY_TIMEOUT_S = 5.0

Query = Callable[[], Awaitable[dict[str, Any]]]


class AdmissionGate:
    """Refuses a launch the pool's admission queue has no place for; tracks the launches in flight to the pool."""

    def __init__(self, query: Query, *, capacity: Callable[[], int], known: Callable[[], set[str]],
                 bound: Callable[[], int] | None = None) -> None:
        self._query = query
        self._capacity = capacity  # maxActive + maxQueuedLaunches: what the pool holds and queues at most
        self._known = known  # the sessions the pool may hold or queue, as far as the orchestrator knows
        self._bound = bound  # at least len(known()), known at no cost (the tree's size): skips building `known`
        self._lock = asyncio.Lock()
        self._in_flight: dict[str, None] = {}  # node ids sent (or about to be sent) to the pool, in order

    async def admit(self, node_id: str) -> None:
        """Refuse (`QUEUE_FULL`) or count `node_id` as in flight until `done(node_id)`."""
        capacity = self._capacity()
        if ((self._bound is not None and self._bound() + len(self._in_flight) < capacity)
                or len(self._known() | set(self._in_flight)) < capacity):
            self._in_flight[node_id] = None  # room for one more whatever the pool's state: not asked
            return
        async with self._lock:
            try:
                state = await asyncio.wait_for(self._query(), ADMISSION_QUERY_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("admission state of the pool unknown ({!r}); the pool decides {}'s launch", exc, node_id)
                state = {}
            refusal = verdict(state, list(self._in_flight))
            if refusal is not None:
                raise ActionRefused(f"'{node_id}' not launched: {refusal}", QUEUE_FULL,
                                    scope="admission-queue", limit=state.get("maxQueued"))
            self._in_flight[node_id] = None

    def done(self, node_id: str) -> None:
        """The pool has answered `node_id`'s launch (or it was never sent)."""
        self._in_flight.pop(node_id, None)

    @contextlib.contextmanager
    def sending(self, node_id: str) -> Iterator[None]:
        """A launch into the pool that is not checked (a revive): counted while in flight, for the checks of others."""
        self._in_flight[node_id] = None
        try:
            yield
        finally:
            self.done(node_id)


def verdict(state: dict[str, Any], in_flight: list[str]) -> str | None:
    """Why one more launch would be refused by a pool in `state` once the `in_flight` launches it has not seen yet
    have arrived (each as the pool takes a launch: a free slot with nobody waiting, else a queue place, else
    refused); None when it has a slot or a queue place, or when the state is unknown."""
    slots, queued = state.get("slots"), state.get("queued")
    max_active, max_queued = state.get("maxActive"), state.get("maxQueued")
    if not (isinstance(slots, list) and isinstance(queued, list) and isinstance(max_active, int)
            and isinstance(max_queued, int)):
        return None
    seen = {*slots, *queued}
    active, waiting = len(slots), len(queued)
    for node_id in in_flight:
        if node_id in seen:
            continue
        if active < max_active and waiting == 0:
            active += 1
        elif waiting < max_queued:
            waiting += 1
    if (active < max_active and waiting == 0) or waiting < max_queued:
        return None
    return (f"the pool's admission queue is full ({waiting} of inprocess.maxQueuedLaunches {max_queued} launches "
            f"wait for a slot, {active} of inprocess.maxActive {max_active} slots are held; a slot is held until its "
            "session is retired): retire a child that is done, or wait and launch again, or raise "
            "inprocess.maxQueuedLaunches")
