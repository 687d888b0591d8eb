"""AgentSession: the interface every session engine offers, whatever runs the loop (docs/architecture.md §6).

Engines: ``native`` (``legion.workers.session.Session``, our loop) and ``pi``
(``legion.workers.pi_engine.PiSession``, a ``pi --mode rpc`` child process). SessionHost and
SessionService only use this protocol.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Protocol

from legion.procs import ProcRef
from legion.workers.context import SessionContext

SteerDisposition = Literal["queued", "accepted", "intercepted"]
PromptDisposition = Literal["accepted", "queued", "intercepted"]
AbortOutcome = Literal["interrupted", "no-turn", "timeout"]
SessionState = Literal["idle", "streaming"]


class AgentSession(Protocol):
    context: SessionContext

    @property
    def state(self) -> SessionState: ...

    @property
    def transcript_path(self) -> Path: ...

    @property
    def has_history(self) -> bool:
        """True when the transcript already held user/assistant turns when the session was opened."""
        ...

    async def prompt(self, text: str) -> PromptDisposition: ...

    async def steer(self, text: str) -> SteerDisposition: ...

    async def follow_up(self, text: str) -> None: ...

    def withdraw(self, texts: list[str]) -> list[str]:
        """Take back queued steers/follow-ups equal to one of ``texts`` (not yet consumed); the ones taken."""
        ...

    async def abort(self, clear_queued: bool = True, timeout: float | None = None) -> AbortOutcome: ...

    async def wait_settled(self, timeout: float | None = None) -> Any: ...

    def continue_run(self) -> bool: ...

    def stats(self) -> dict[str, Any]: ...

    async def dispose(self, timeout: float = 5.0) -> list[ProcRef]: ...
