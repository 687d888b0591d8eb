"""Worker processes, the session engine, model providers, tools and transcripts.

Like `legion.supervision`, the public names are resolved on first use (PEP 562): the fork server
preloads single modules of this package, and importing one must not import the whole engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from legion import lazy_exports

_EXPORTS: dict[str, str] = {
    "AgentSession": "engine",
    "SettleResult": "session",
    "Session": "session",
    "SessionConfig": "session",
    "SessionContext": "context",
    "Budget": "context",
    "SessionSpec": "session_spec",
    "SpecError": "session_spec",
    "build_session": "session_spec",
    "SessionService": "session_service",
    "PoolLimits": "pool",
    "SessionHost": "pool",
    "WorkerContext": "runtime",
    "WorkerRuntime": "runtime",
    "run_worker": "runtime",
    "Transcript": "transcript",
    "read_transcript": "transcript",
    "derive_outcome": "outcome",
    "final_result": "outcome",
}

__all__ = [
    "AgentSession",
    "Budget",
    "PoolLimits",
    "Session",
    "SessionConfig",
    "SessionContext",
    "SessionHost",
    "SessionService",
    "SessionSpec",
    "SettleResult",
    "SpecError",
    "Transcript",
    "WorkerContext",
    "WorkerRuntime",
    "build_session",
    "derive_outcome",
    "final_result",
    "read_transcript",
    "run_worker",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)


if TYPE_CHECKING:
    from legion.workers.context import Budget, SessionContext
    from legion.workers.engine import AgentSession
    from legion.workers.outcome import derive_outcome, final_result
    from legion.workers.pool import PoolLimits, SessionHost
    from legion.workers.runtime import WorkerContext, WorkerRuntime, run_worker
    from legion.workers.session import Session, SessionConfig, SettleResult
    from legion.workers.session_service import SessionService
    from legion.workers.session_spec import SessionSpec, SpecError, build_session
    from legion.workers.transcript import Transcript, read_transcript
