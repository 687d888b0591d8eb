"""Worker entries hosting sessions on top of ``WorkerRuntime``.

- ``legion.workers.session_worker:main`` — the ``rpc`` worker: one session, described by the worker
  args (a SessionSpec dict; ``engine: "pi"`` runs a ``pi --mode rpc`` child instead of the native loop). A restarted worker finds its transcript non-empty, resumes it (a marked
  system note, unanswered tool calls closed, an interrupted run continued) and does not re-send the
  first prompt.
- ``legion.workers.session_worker:pool_main`` — the ``inprocess`` pool worker: many sessions launched
  by ``session.launch`` requests, limits from ``args["inprocess"]`` (the settings block; absent = 30
  slots). Extra args: ``ledgerPath`` (usage) and ``ledgerRun`` (the run id of a shared PostgreSQL ledger). Providers travel in each launch's spec.

Both write the ledger (usage, liveness stamps) only through a ``LedgerWriter`` thread, never on their event
loop: a stopped process holding the ledger's write lock must not silence the application heartbeat. The rpc
worker opens its writer only for a write that cannot ride its session's settle (``HeldWriter``, held
``HOLD_S``): a session that settles right after its last model call sends that usage in its ``agent_settled``
event, and the root records it with the round's artifact.

Both report their live tool process groups in every application heartbeat (``toolPgids``) and in a
``tool_groups`` event when a tool starts, so the root can sweep them if the worker dies. Both answer
the ``request`` ops of ``legion.workers.session_service`` and report ready only once their
session (rpc) or host (pool) is up. A malformed spec makes the worker log the problem and exit 78
(EX_CONFIG) — a configuration error, not a crash to restart into.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import TYPE_CHECKING, Any

from loguru import logger

from legion.workers.held_writer import HeldWriter
from legion.workers.pool import PoolLimits, pool_limits
from legion.workers.session_service import SessionService, idle_info
from legion.workers.session_spec import SessionSpec, SpecError

if TYPE_CHECKING:
    from legion.bus.protocol import Message
    from legion.ledger import LedgerWriter
    from legion.workers.runtime import WorkerRuntime

EXIT_CONFIG = 78


# a worker's writes (liveness stamps, usage, transcript syncs) wait this long for others to share their commit;
# a legion tool call that needs its usage landed hurries the writer (docs/architecture.md §5, "Durability")
WRITER_LINGER_S = 0.05
# an rpc worker's write waits this long for its session's settle to carry it before a writer is opened for it
HOLD_S = 0.25
WRITER_CLOSE_S = 2.0  # how long a stopping worker waits for its queued ledger writes (the transcript keeps usage)


async def _service(rt: WorkerRuntime, limits: PoolLimits, ledger_path: str | None,
                   ledger_run: str | None, *, held: bool = False) -> SessionService:
    control = rt.control
    writer: LedgerWriter | HeldWriter | None = None
    open_reader = None
    if ledger_path:
        from legion.ledger import LedgerWriter, open_ledger

        opener = functools.partial(LedgerWriter, ledger_path, linger=WRITER_LINGER_S,
                                   name=f"legion-ledger-writer-{rt.worker_id}", run_id=ledger_run)
        # opened in a thread: an open waits on the ledger when a migration or recovery holds it, and the
        # application heartbeat already runs on this loop
        writer = HeldWriter(opener, HOLD_S) if held else await asyncio.to_thread(opener)
        rt.on_shutdown(functools.partial(_close_writer, writer))
        # the budgets' reads: opened by the service when a session with a budget is launched
        open_reader = functools.partial(open_ledger, ledger_path, run_id=ledger_run)

    async def send(type_: str, body: dict[str, Any]) -> None:
        if control is not None:
            await control.send(type_, body)

    async def request(type_: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert control is not None
        reply = await control.request(type_, body, timeout)
        return dict(reply.body)

    service = SessionService(send=send if control else None, request=request if control else None,
                             limits=limits, writer=writer, open_reader=open_reader)

    async def on_request(msg: Message) -> dict[str, Any] | None:
        return await service.handle_request(dict(msg.body))

    rt.handlers["request"] = on_request
    rt.beat_with(service.heartbeat_info)  # the in-flight tool groups (the root sweeps them after a crash)
    service.start()
    return service


async def _close_writer(writer: LedgerWriter | HeldWriter) -> None:
    if not await writer.aclose(WRITER_CLOSE_S):
        logger.error("{} ledger write(s) of this worker did not land before it stopped (last error: {}); "
                     "the transcripts keep the usage, and a resumed session writes it again",
                     writer.pending, writer.last_error or "none")


async def main(rt: WorkerRuntime) -> int:
    """rpc worker: host the one session described by the args."""
    try:
        spec = SessionSpec.from_dict(rt.args)
    except SpecError as exc:
        logger.error("rpc session worker {}: bad session spec: {}", rt.worker_id, exc)
        return EXIT_CONFIG
    service = await _service(rt, PoolLimits(max_active=1, max_queued=0), spec.context.ledger_path,
                             spec.context.ledger_run, held=True)
    service.quiet_when_settled = True  # settled, it is neither watched by its root nor heartbeats (then parked)
    try:
        session, resumed = await service.launch(spec)
        started = service.started_info(spec.node_id)  # idle + outcome: resumed with nothing to continue
        await rt.ready({"nodeId": spec.node_id, "resumed": resumed, "transcript": str(session.transcript_path),
                        **idle_info(started)})
        await rt.stop_requested.wait()
        return 0
    finally:
        with contextlib.suppress(Exception):
            await service.close()


main.auto_ready = False  # type: ignore[attr-defined]


async def pool_main(rt: WorkerRuntime) -> int:
    """Pool worker: host inprocess sessions launched over the control channel."""
    block = rt.args.get("inprocess")
    try:
        limits = pool_limits(block if isinstance(block, dict) else None)
    except (TypeError, ValueError) as exc:
        logger.error("pool worker {}: bad inprocess settings: {}", rt.worker_id, exc)
        return EXIT_CONFIG
    ledger_path, ledger_run = rt.args.get("ledgerPath"), rt.args.get("ledgerRun")
    service = await _service(rt, limits, ledger_path if isinstance(ledger_path, str) else None,
                             ledger_run if isinstance(ledger_run, str) else None)
    try:
        await rt.ready({"pool": True, "maxActive": limits.max_active})
        await rt.stop_requested.wait()
        return 0
    finally:
        with contextlib.suppress(Exception):
            await service.close()


pool_main.auto_ready = False  # type: ignore[attr-defined]
